"""Row kernels compiled by numba: the loop of a :class:`~spmd.compiler.engine.rows.RowKernel`,
and the runner that uses it once it is compiled.

The loop visits each row once.  A row's values are computed *level* by level: a
level is one pass over the row's ``C`` columns computing the full values that need
no sum not yet finished; a row sum is finished after the pass of its operand, and
the values that read it are computed in a later pass (a layer norm's forward is
three passes over a row: the mean, the variance, the result).  A full value read in
a later pass is kept in a scratch row (in a core's L1 cache); row values are scalars.

Numbers: every node is computed in its dtype as numpy computes it (``a / b`` on
float32 is computed in float64 and rounded once, which is the correctly rounded
float32 quotient numpy gives), with ``error_model="numpy"`` (a division by zero is
inf or nan, not an exception).  Of the fast-math flags only ``reassoc`` is set: it
lets the compiler add a sum's terms in any order (vectorized) and may reassociate a
chain of products or sums; no flag assumes the absence of NaN, infinity or signed
zeros, so those propagate as in numpy.  A sum differs from numpy's pairwise one by
float rounding.

Compilation is tiered (:mod:`spmd.compiler.engine.loops`): a kernel runs its members'
implementations (the unfused program) until its
:data:`~spmd.compiler.engine.loops.SWITCH_AT`-th call and its compiled loop from then on,
at the same call on every rank and in every run; the generated module is cached on
disk.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from spmd.compiler.engine import loops
from spmd.compiler.engine.threads import POOL, threads_help

if TYPE_CHECKING:
    from spmd.compiler.engine.rows import RowKernel

# Rows are shared among the engine's threads when a kernel has this many elements.
THREADED_ELEMENTS = 1 << 20

# ------------------------------------------------------------------ the source

def _np_name(dtype) -> str:
    return "bool_" if np.dtype(dtype) == np.dtype(bool) else np.dtype(dtype).name


class _Plan:
    """Where each node of a kernel is computed: ``where[k]`` is ``"full"`` (in a pass
    over the columns), ``"row"`` or ``"scalar"`` (once a row); ``level[k]`` its pass;
    ``base[k]`` the node an alias stands for; ``kept`` the full values read in a later
    pass, kept in a scratch row (or their result's row)."""

    def __init__(self, kernel: RowKernel):
        nodes = kernel.nodes
        self.where, self.level, self.base = [], [], []
        for k, (kind, _, params, args, _, _) in enumerate(nodes):
            deps = [a[1] for a in args if a[0] == "node"]
            self.base.append(self.base[deps[0]] if kind == "alias" else k)
            if kind == "read":
                self.where.append({"full": "full", "tile": "full", "col": "full",
                                   "row": "row", "scalar": "scalar"}[params["kind"]])
                self.level.append(0)
            elif kind == "sum":
                self.where.append("row")
                self.level.append(self.level[deps[0]] + 1)
            else:
                ws = {self.where[d] for d in deps}
                self.where.append("full" if "full" in ws else "row" if "row" in ws
                                  else "scalar")
                self.level.append(max((self.level[d] for d in deps), default=0))
        self.kept = set()
        for k, (kind, _, _, args, _, _) in enumerate(nodes):
            for a in args:
                if a[0] != "node":
                    continue
                b = self.base[a[1]]
                if self.where[b] == "full" and nodes[b][0] != "read" and \
                        self.level[b] < self.level[k] and kind != "sum":
                    self.kept.add(b)


def overwritable(kernel: RowKernel, j: int) -> list:
    """The operands result ``j`` may be written into: a full result computed in the
    column passes, over an operand read only as a full value of its dtype and size,
    and read by no node after the result's (a later pass, or later in its pass)."""
    nodes = kernel.nodes
    k = kernel.outputs[j]
    plan = _Plan(kernel)
    if nodes[k][5] != "full" or plan.where[k] != "full" or nodes[k][0] == "alias":
        return []
    kinds: dict = {}  # operand -> how its read nodes read it
    for kind, _, params, _, _, _ in nodes:
        if kind == "read":
            kinds.setdefault(params["operand"], set()).add(params["kind"])
    last: dict = {}  # read node -> (level, index) of its last reader
    for n, (_, _, _, args, _, _) in enumerate(nodes):
        for a in args:
            if a[0] == "node" and nodes[plan.base[a[1]]][0] == "read":
                b = plan.base[a[1]]
                at = (plan.level[n] - (1 if nodes[n][0] == "sum" else 0), n)
                last[b] = max(last.get(b, at), at)
    fits: dict = {}  # operand -> whether every read of it ends before result j's write
    for b, (kind, _, params, _, dtype, _) in enumerate(nodes):
        if kind != "read":
            continue
        i = params["operand"]
        fits[i] = fits.get(i, True) and kinds[i] == {"full"} and \
            dtype == kernel.out_dtypes[j] and \
            math.prod(params["target"]) == kernel.frame.rows * kernel.frame.cols and \
            last.get(b, (-1, -1)) <= (plan.level[k], k)
    return sorted(i for i, ok in fits.items() if ok)


_NB = {"float32": "float32", "float64": "float64", "bool_": "boolean"}


def signature(kernel: RowKernel) -> str:
    """numba's signature of the loop, as source: each read node's operand as it is
    passed (a full one C-contiguous ``(R, C)``, a row or column one contiguous, all
    read-only; a scalar one a number), then the results (full ``(R, C)``, row
    ``(R,)``)."""
    args = ["nb.intp", "nb.intp", "nb.intp"]
    for kind, _, params, _, dtype, _ in kernel.nodes:
        if kind == "read":
            t = f"nb.{_NB[_np_name(dtype)]}"
            args.append(t if params["kind"] == "scalar" else
                        f"nb.types.Array({t}, {2 if params['kind'] in ('full', 'tile') else 1}, "
                        "'C', readonly=True)")
    for k in kernel.outputs:
        t = f"nb.{_NB[_np_name(kernel.nodes[k][4])]}"
        args.append(f"{t}[:, ::1]" if kernel.nodes[k][5] == "full" else f"{t}[::1]")
    return f"nb.void({', '.join(args)})"


def source(kernel: RowKernel) -> str:
    """The numba module of ``kernel``: ``kern(r0, r1, cols, *reads, *results)``
    computes rows ``r0:r1`` (a full operand or result is ``(R, C)``, a row one ``(R,)``, a
    column one ``(C,)``, a scalar one a number: see :func:`signature`)."""
    body = _Body(kernel)
    lines = body.lines()
    nodes, out_of = kernel.nodes, body.out_of
    reads = [k for k, n in enumerate(nodes) if n[0] == "read"]
    params = ", ".join([f"x{k}" for k in reads] + [f"o{j}" for j in range(len(out_of))])
    # The column count is an argument, not a constant: a loop of a constant count is
    # unrolled whole and its sums were then not vectorized (76 against 11 us for a row
    # sum over (2048, 96)).
    head = [f"def kern(r0, r1, cols, {params}):"]
    head += [f"    s{k} = np.empty(cols, np.{_np_name(nodes[k][4])})"
             for k in sorted(body.plan.kept) if k not in out_of]
    head.append("    for r in range(r0, r1):")
    casts = [f"T{k} = np.{_np_name(d)}" for k, (_, _, _, _, d, _) in enumerate(nodes)
             if d != np.dtype(bool)]
    consts_src = [f"{name} = {src}" for src, name in body.consts.items()]
    # error_model="numpy": a division by zero gives inf or nan, as in numpy (numba's
    # default raises).  fastmath={"reassoc"} alone: sums may be added in any order
    # (vectorized); no flag that assumes the absence of NaN, infinity or signed zeros.
    head_src = ["import numpy as np", "import numba as nb"]
    if any(n[1] == "exp" for n in nodes):  # float32 only (rows._role)
        head_src.append("from spmd.compiler.engine.kernel_math import expf  # "
                        + loops.kernel_math_digest())
    return "\n".join(head_src + ["", f"SIG = {signature(kernel)}"] + casts + consts_src
                     + ["", "", "@nb.njit(SIG, nogil=True, cache=True, error_model='numpy', "
                        "fastmath={'reassoc'})"]
                     + head + (lines or ["        pass"])) + "\n"


class _Body:
    """The lines of a row kernel's loop over the rows of ``r0:r1``: per row, a pass over
    the columns per level of sums, each computing its nodes (:class:`_Plan`)."""

    def __init__(self, kernel: RowKernel):
        self.kernel, self.nodes = kernel, kernel.nodes
        self.plan = _Plan(kernel)
        self.out_of = {k: j for j, k in enumerate(kernel.outputs)}
        self.consts: dict = {}  # literal's source -> its name
        self.out: list = []

    def const(self, v) -> str:
        key = loops.literal(v)
        if key not in self.consts:
            self.consts[key] = f"k{len(self.consts)}"
        return self.consts[key]

    def row_of(self, b, at=None) -> str:
        """The row holding full value ``b`` (computed, or a full/column operand), or
        its element ``at`` (``"c"``)."""
        kind, _, params, _, _, _ = self.nodes[b]
        out_of = self.out_of
        two_d = (kind == "read" and params["kind"] == "full") or \
            (kind != "read" and b in out_of)
        name = f"x{b}" if kind == "read" else f"o{out_of[b]}" if b in out_of else f"s{b}"
        if at is None:
            return f"{name}[r]" if two_d else name
        return f"{name}[r, {at}]" if two_d else f"{name}[{at}]"

    def ref(self, a, cur) -> str:
        """The expression reading argument ``a`` in the pass of level ``cur``."""
        if a[0] == "const":
            return self.const(a[1])
        b = self.plan.base[a[1]]
        kind, _, params, _, _, _ = self.nodes[b]
        if kind == "read":
            return {"full": f"x{b}[r, c]", "tile": f"x{b}[q{b}, c]", "col": f"x{b}[c]",
                    "row": f"v{b}", "scalar": f"x{b}"}[params["kind"]]
        if self.plan.where[b] == "full" and self.plan.level[b] < cur:
            return self.row_of(b, "c")
        return f"v{b}"

    def store(self, k, ind) -> None:
        """Write node ``k``'s value where it is kept or returned."""
        j = self.out_of.get(k)
        full_result = j is not None and self.nodes[k][5] == "full"
        if self.plan.where[k] == "full":
            if j is not None or k in self.plan.kept:
                self.out.append(f"{ind}{self.row_of(k, 'c')} = v{k}")
        elif j is not None:
            self.out.append(f"{ind}o{j}[r{', :' if full_result else ''}] = "
                            f"v{self.plan.base[k]}")

    def compute(self, k, cur, ind) -> None:
        kind, op, params, args, dtype, _ = self.nodes[k]
        where, lines = self.plan.where, self.out
        if kind == "alias":
            if k in self.out_of:
                if where[k] == "full":
                    lines.append(f"{ind}v{k} = {self.ref(args[0], cur)}")
                self.store(k, ind)
            return
        if kind == "read":  # (never a result: reads are not members)
            if where[k] == "row":
                lines.append(f"{ind}v{k} = x{k}[r]")
            return
        if kind == "sum":  # added up in the pass of its operand
            lines.append(f"{ind}v{k} = a{k}")
        else:
            xs = [self.ref(a, cur) for a in args]
            one = f"T{k}(1)"
            expr = loops.expression(op, xs, params, one)
            cast = "" if dtype == np.dtype(bool) else f"T{k}"
            lines.append(f"{ind}v{k} = {cast}({expr})")
        self.store(k, ind)

    def lines(self) -> list:
        """The body of the loop over the rows."""
        nodes, level, where, lines = self.nodes, self.plan.level, self.plan.where, self.out
        sums = {k: level[k] - 1 for k, n in enumerate(nodes) if n[0] == "sum"}  # -> pass
        for k, (kind, _, params, _, _, _) in enumerate(nodes):
            if kind == "read" and params["kind"] == "tile":  # the row it repeats here
                m, p = self.kernel.frame.repeat(params["expanded"], params["target"])
                lines.append(f"        q{k} = (r // {m * p}) * {p} + r % {p}")
        for cur in range(max(level, default=0) + 1):
            for k in range(len(nodes)):
                if level[k] == cur and where[k] != "full":
                    self.compute(k, cur, "        ")
            for k, at in sums.items():
                if at == cur:
                    lines.append(f"        a{k} = T{k}(0)")
            n0 = len(lines)
            lines.append("        for c in range(cols):")
            for k in range(len(nodes)):
                if level[k] == cur and where[k] == "full":
                    self.compute(k, cur, "            ")
                elif sums.get(k) == cur:
                    lines.append(f"            a{k} += {self.ref(nodes[k][3][0], cur)}")
            if len(lines) == n0 + 1:
                lines.pop()
        return lines


# ------------------------------------------------------------------ unfused

def evaluate(kernel: RowKernel, args, xp=np) -> list:
    """The kernel's results computed by its member equations' own implementations
    (the unfused program); a result sharing memory with an operand or another result
    is copied (the generated code owns a kernel's results and may update them in
    place)."""
    keep = set(kernel.member_outputs())
    last = {}  # member -> the last member reading it: freed after (as the unfused code)
    for m, (_, _, margs) in enumerate(kernel.members):
        for a in margs:
            if a[0] == "node":
                last[a[1]] = m
    values = []
    for m, (prim, params, margs) in enumerate(kernel.members):
        xs = [args[a[1]] if a[0] == "in" else values[a[1]] if a[0] == "node" else a[1]
              for a in margs]
        values.append(prim.impl(xp, *xs, **params))
        for a in margs:
            if a[0] == "node" and last[a[1]] == m and a[1] not in keep:
                values[a[1]] = None
    outs = []
    for k, shape in zip(kernel.member_outputs(), kernel.out_shapes):
        v = values[k]
        v = xp.reshape(v, shape) if v.shape != shape else v
        if any(np.may_share_memory(v, a) for a in list(args) + outs
               if isinstance(a, np.ndarray)):
            v = v.copy()
        outs.append(v)
    return outs


# ------------------------------------------------------------------ compiling

def compile_async(kernel: RowKernel):
    """The Future of ``kernel``'s compiled loop (one per distinct source: the layer
    norms of a model's layers share one; None if it could not be compiled)."""
    return loops.compile_async(source(kernel), "rows", loops.kern_of)


wait_compiled = loops.wait_compiled


# -------------------------------------------------------------------- running

def _reads(kernel: RowKernel, args) -> list:
    """Each read node's operand as the loop takes it (see :func:`signature`)."""
    rows, cols = kernel.frame.rows, kernel.frame.cols
    out = []
    for kind, _, params, _, dtype, _ in kernel.nodes:
        if kind != "read":
            continue
        x = np.asarray(args[params["operand"]], dtype)
        how = params["kind"]
        if how == "scalar":
            out.append(x.reshape(())[()])
        elif how == "col":
            out.append(np.ascontiguousarray(x.reshape(cols)))
        elif how == "row" and x.size == rows:
            out.append(np.ascontiguousarray(x.reshape(rows)))
        elif how == "tile":  # the leading ones of its expanded shape dropped
            out.append(np.ascontiguousarray(x.reshape(x.size // cols, cols)))
        else:
            b = np.broadcast_to(x.reshape(params["expanded"]), params["target"])
            out.append(np.ascontiguousarray(b.reshape((rows, cols) if how == "full"
                                                      else rows)))
    return out


class RowRunner:
    """A :class:`RowKernel` on numpy: its members' implementations until its
    :class:`~spmd.compiler.engine.loops.Tier` switches, the compiled loop from then on, its
    rows shared among the engine's threads."""

    __slots__ = ("kernel", "tier")

    def __init__(self, kernel: RowKernel):
        self.kernel = kernel
        self.tier = loops.Tier(lambda: compile_async(kernel))

    def __call__(self, *args, out=None):
        loop = self.tier.ready()
        if loop is None:
            return evaluate(self.kernel, args)
        return self.run(loop, args, out)

    def run(self, loop, args, out=None) -> list:
        """The compiled ``loop`` on ``args``: the kernel's results, written into the
        buffers ``out`` gives where they are C-contiguous (a dead value's buffer may
        not be), else new arrays."""
        k = self.kernel
        rows, cols = k.frame.rows, k.frame.cols
        xs = _reads(k, args)
        outs = []
        for j, (n, d) in enumerate(zip(k.outputs, k.out_dtypes)):
            shape = (rows, cols) if k.nodes[n][5] == "full" else (rows,)
            buf = None if out is None else out[j]
            if buf is not None and buf.dtype == d and buf.flags.c_contiguous and \
                    buf.size == math.prod(shape):
                outs.append(buf.reshape(shape))
            else:
                outs.append(np.empty(shape, d))
        parts = POOL.size() if rows * cols >= THREADED_ELEMENTS and threads_help() else 1
        if parts <= 1:
            loop(0, rows, cols, *xs, *outs)
        else:
            step = -(-rows // parts)
            POOL.run([lambda r0=r0: loop(r0, min(r0 + step, rows), cols, *xs, *outs)
                      for r0 in range(0, rows, step)])
        return [o.reshape(s) for o, s in zip(outs, k.out_shapes)]
