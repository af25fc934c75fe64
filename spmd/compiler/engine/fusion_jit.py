"""Elementwise kernels as compiled loops: a :class:`~spmd.compiler.engine.fusion.Kernel`
whose ops numba compiles well becomes one loop over its elements.

The blocked kernel (:class:`~spmd.compiler.engine.fusion.BlockedKernel`) runs a group's
numpy calls block by block: each op is still a pass over a block, and a block's
calls cost Python time (GELU's forward with its derivative, 13 calls a block).  The
loop computes every node of an element in registers and writes the results once.
``exp`` and ``tanh`` of float32 are :mod:`spmd.compiler.engine.kernel_math`'s (vectorized,
within 1 and 2 ulp); the arithmetic is numpy's, op by op in the node's dtype (no
fast-math flag but ``contract``: a product and a sum may be one fused multiply-add,
rounded once).  A kernel with another op (``log``, ``sin``, ``power``, ...) or dtype
stays blocked.

An operand is read as the loop needs it, decided at the first call from its array:
a C-contiguous one of the result's shape as it is (flat), a size-1 one as a number,
a broadcast view repeating a contiguous trailing block (a bias added to every row)
as that block, indexed by column, one repeating each element of its leading part
over the trailing axes (a row's mean) as that part, one number a row; any other
layout is copied once per call.

Used from a kernel's :data:`~spmd.compiler.engine.loops.SWITCH_AT`-th call
(:class:`spmd.compiler.engine.loops.Tier`); before, and when it cannot be compiled, the
blocked kernel.  Rows are shared among the engine's threads when the loop is long
enough (:data:`THREADED_NS`).
"""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.engine import loops
from spmd.compiler.engine.threads import POOL, threads_help

# A loop's rows are shared among the engine's threads when its estimated time on one
# core is at least THREADED_NS: handing rows to a thread costs about 100 us here
# (arithmetic over (2048, 64) took 26 us on one thread and 126 on two; GELU's
# forward over (2048, 256), 0.5 ms on one, gains from two).  Estimated time per
# element, in ns: LOOP_NS, plus LOOP_NS_OP for each exp or tanh.
THREADED_NS = 150_000
LOOP_NS, LOOP_NS_OP = 0.2, 0.6

_F32_ONLY = ("exp", "tanh")  # kernel_math's functions are float32 ones
_NB = {"float32": "float32", "float64": "float64", "bool": "boolean"}


def compilable(kernel) -> bool:
    """Whether every node's op and dtype has a loop form."""
    for op, _, params, _, dtype in kernel.nodes:
        dt = np.dtype(dtype)
        if dt.name not in _NB or (op not in loops.EXPR and op != "integer_pow"):
            return False
        if op in _F32_ONLY and dt != np.float32:
            return False
    return all(np.dtype(d).name in _NB for d in kernel.in_dtypes)


def layout(kernel, args):
    """``(kinds, cols)``: how the loop reads each operand (``"full"``, ``"col"``,
    ``"row"``, ``"scalar"``: see :func:`_broadcast`) and the column count of its rows."""
    cols = None
    kinds = []
    for a in args:
        if a.size == 1:
            kinds.append("scalar")
            continue
        kind, vec = _broadcast(a, kernel.shape)
        if kind != "full" and (cols is None or _period(kind, vec, a) == cols):
            cols = _period(kind, vec, a)
            kinds.append(kind)
        else:
            kinds.append("full")
    if cols is None:
        shape = kernel.shape
        cols = shape[-1] if shape else 1
    return tuple(kinds), cols


def _period(kind, vec, a) -> int:
    return vec.size if kind == "col" else a.size // vec.size


def _broadcast(a, shape):
    """``(kind, vector)`` of an operand of ``shape`` that is a broadcast view:
    ``"col"`` when it repeats a contiguous trailing block over its leading axes,
    ``"row"`` when it repeats each element of a contiguous leading part over its
    trailing axes (a row statistic), ``vector`` that block or part, flat; else
    ``("full", None)``.  Axes of size 1 do not count."""
    if a.shape != shape:
        return "full", None
    sq = np.squeeze(a)  # a view: the axes of size 1 dropped, the strides kept
    zero = [st == 0 for st in sq.strides]
    if not zero or all(zero) or not any(zero):
        return "full", None
    k = zero.index(False)
    if k and not any(zero[k:]):  # leading axes broadcast: a column operand
        kind, vec = "col", sq[(0,) * k]
    else:
        j = zero.index(True)
        if not (j and all(zero[j:])):
            return "full", None
        kind, vec = "row", sq[(slice(None),) * j + (0,) * (len(zero) - j)]
    return (kind, vec.reshape(-1)) if vec.flags.c_contiguous else ("full", None)


def source(kernel, kinds, into) -> str:
    """The numba module of ``kernel`` with operands read as ``kinds`` and result
    ``j`` written into operand ``into[j]`` (-1: its own buffer):
    ``kern(r0, r1, cols, *operands, *results)`` computes rows ``r0:r1`` (elements
    ``r * cols`` to ``(r + 1) * cols`` of a full operand or result, flat; a column
    one's ``cols``)."""
    consts: dict = {}

    def const(v) -> str:
        key = loops.literal(v)
        if key not in consts:
            consts[key] = f"k{len(consts)}"
        return consts[key]

    def ref(a) -> str:
        if a[0] == "in":
            return f"a{a[1]}"
        if a[0] == "const":
            return const(a[1])
        return f"v{a[1]}"

    body = []
    for i, kind in enumerate(kinds):
        if kind != "row":  # (a row operand is read once a row)
            read = {"full": f"y{i}[c]", "col": f"x{i}[c]", "scalar": f"x{i}"}[kind]
            body.append(f"a{i} = {read}")
    for k, (op, _, params, args, dtype) in enumerate(kernel.nodes):
        xs = [ref(a) for a in args]
        dt = np.dtype(dtype)
        one = f"np.{dt.name}(1)" if dt.name != "bool" else "True"
        expr = loops.expression(op, xs, params, one)
        body.append(f"v{k} = {expr}" if dt.name == "bool" else f"v{k} = np.{dt.name}({expr})")
    own = [j for j in range(len(kernel.outputs)) if into[j] < 0]
    for j, k in enumerate(kernel.outputs):
        body.append(f"{'p' if into[j] < 0 else 'y'}{j if into[j] < 0 else into[j]}[c] = v{k}")
    # Each row's slices, then a loop over the row: the same loop over flat indices
    # (r * cols + c) was not vectorized, 4x slower (exp over (2048, 256): 0.81 ms
    # against 0.19).  A result written over an operand is stored through the
    # operand's own name: as two arrays, the compiler's check that they do not
    # overlap failed and the loop ran unvectorized (GELU's 3.2 against 0.5 ms).
    views = [f"y{i} = x{i}[s:s + cols]" for i, kind in enumerate(kinds) if kind == "full"]
    views += [f"a{i} = x{i}[r]" for i, kind in enumerate(kinds) if kind == "row"]
    views += [f"p{j} = o{j}[s:s + cols]" for j in own]
    sig = ["nb.intp", "nb.intp", "nb.intp"]
    written = set(into)
    for i, (kind, d) in enumerate(zip(kinds, kernel.in_dtypes)):
        t = f"nb.{_NB[np.dtype(d).name]}"
        sig.append(t if kind == "scalar" else f"{t}[::1]" if i in written else
                   f"nb.types.Array({t}, 1, 'C', readonly=True)")
    sig += [f"nb.{_NB[np.dtype(kernel.out_dtypes[j]).name]}[::1]" for j in own]
    params = ", ".join([f"x{i}" for i in range(len(kinds))] + [f"o{j}" for j in own])
    consts_src = [f"{name} = {src}" for src, name in consts.items()]
    # error_model="numpy": a division by zero gives inf or nan, as in numpy.
    return "\n".join(
        [f"# spmd elementwise loop; kernel_math {loops.kernel_math_digest()}",
         "import numpy as np", "import numba as nb",
         "from spmd.compiler.engine.kernel_math import expf, tanhf  # noqa: F401", ""]
        + consts_src
        + ["", f"@nb.njit(nb.void({', '.join(sig)}), nogil=True, cache=True, "
           "error_model='numpy', fastmath={'contract'})",
           f"def kern(r0, r1, cols, {params}):",
           "    for r in range(r0, r1):",
           "        s = r * cols"]
        + [f"        {ln}" for ln in views]
        + ["        for c in range(cols):"]
        + [f"            {ln}" for ln in body]) + "\n"


class Runner:
    """A fused kernel on numpy: ``blocked`` (the blocked kernel) until the loop is
    in force, then the loop; the blocked kernel also for a call whose operands or
    result buffers are laid out otherwise than at the first call."""

    __slots__ = ("kernel", "blocked", "kinds", "cols", "into", "tier", "threaded")

    def __init__(self, kernel, blocked):
        self.kernel, self.blocked = kernel, blocked
        self.kinds = self.cols = self.into = None
        per_element = LOOP_NS + LOOP_NS_OP * sum(n[0] in _F32_ONLY for n in kernel.nodes)
        self.threaded = math.prod(kernel.shape) * per_element >= THREADED_NS
        self.tier = loops.Tier(lambda: loops.compile_async(
            source(kernel, self.kinds, self.into), "elementwise", loops.kern_of))

    def __call__(self, *args, out=None):
        if self.kinds is None:
            self.kinds, self.cols = layout(self.kernel, args)
            self.into = self._into(args, out)
        loop = self.tier.ready()
        if loop is None:
            return self.blocked(*args, out=out)
        return self.run(loop, args, out)

    def _into(self, args, out) -> tuple:
        """For each result, the operand whose buffer ``out`` gives for it (a full,
        C-contiguous operand of its dtype), else -1."""
        k = self.kernel
        into = []
        for j, d in enumerate(k.out_dtypes):
            buf = None if out is None else out[j]
            hit = [i for i, (a, kind) in enumerate(zip(args, self.kinds))
                   if buf is not None and a is buf and kind == "full" and
                   a.dtype == d and a.flags.c_contiguous and i not in into]
            into.append(hit[0] if hit else -1)
        return tuple(into)

    def run(self, loop, args, out=None) -> list:
        k = self.kernel
        size = math.prod(k.shape)
        cols = self.cols
        rows = size // cols if cols else 0
        xs = []
        for i, (a, kind, d) in enumerate(zip(args, self.kinds, k.in_dtypes)):
            if kind == "scalar":
                xs.append(np.asarray(a, d).reshape(())[()])
            elif kind != "full":
                got, vec = _broadcast(a, k.shape)
                if got != kind or _period(kind, vec, a) != cols or vec.dtype != d:
                    # Laid out otherwise than at the first call: the loop reads this
                    # operand by column or by row.
                    return self.blocked(*args, out=out)
                xs.append(vec)
            else:
                xs.append(np.ascontiguousarray(a, d).reshape(-1))
        outs, own = [], []
        for j, d in enumerate(k.out_dtypes):
            buf = None if out is None else out[j]
            i = self.into[j]
            if i >= 0:
                if buf is not args[i] or not buf.flags.c_contiguous:
                    return self.blocked(*args, out=out)
                outs.append(buf)
                continue
            if buf is None or buf.dtype != d or not buf.flags.c_contiguous or \
                    buf.shape != k.shape or \
                    any(np.may_share_memory(buf, a) for a in args if isinstance(a, np.ndarray)):
                buf = np.empty(k.shape, d)
            outs.append(buf)
            own.append(buf.reshape(-1))
        parts = POOL.size() if self.threaded and threads_help() else 1
        if parts <= 1 or rows < 2:
            loop(0, rows, cols, *xs, *own)
        else:
            step = -(-rows // parts)
            POOL.run([lambda r0=r0: loop(r0, min(r0 + step, rows), cols, *xs, *own)
                      for r0 in range(0, rows, step)])
        return outs
