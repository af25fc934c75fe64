"""Fusion: a chain of elementwise equations runs as one kernel, block by block, on
all cores.

Generated numpy code makes one call per equation, each a full pass over its
operands on one core (GELU's tanh approximation is 8 of them, AdamW's update a
dozen).  This pass, run on programs lowered for execution, groups elementwise
equations into one ``fused_elementwise`` equation whose parameter is a
:class:`Kernel`, an expression tree over the group's inputs.  On numpy the kernel
runs the tree's numpy functions block by block: the result is cut into blocks of
rows that fit in a core's cache (:data:`BLOCK_ELEMENTS`), every function of the
chain runs on one block (writing into scratch buffers, ``out=``) before the next
block starts, and the blocks are shared among threads (numpy releases the GIL in
its loops).  So a chain makes one pass over memory and uses every core, and its
numbers are *the same bits* as the unfused program's: the same numpy functions
on the same elements, whatever the blocks or the threads.

The threads are the engine's (:mod:`spmd.compiler.threads`: ``SPMD_NUM_THREADS``,
else ``OMP_NUM_THREADS``, else the usable cores; the calling thread is one of
them).  Kernels are made only where BLAS's own threads sleep between calls
(``OPENBLAS_THREAD_TIMEOUT``, see :func:`spmd.compiler.threads.threads_help`):
otherwise they busy-wait on the cores for long after each product, and a kernel
on two threads ran no faster than on one.

Measured before choosing (``docs/performance.md``, "The engine"): numexpr and numba
evaluate transcendental functions with scalar libm calls, 3x slower than numpy's
vectorized float32 ``tanh``/``exp`` here, and numexpr was slower than numpy even
on arithmetic chains; numba compiles for about a second per kernel.  Blocked
numpy calls keep numpy's fast loops and need no compiler.

Which equations may join a group is declared by each primitive:
``rules["kernel_op"]`` names the numpy function that computes it on floats
(``"tanh"``, ``"multiply"``, ``"where"``, ...), beside its definition in
``spmd/compiler/ops/elementwise.py``.  A group is a tree: an equation joins its
consumer's group when its result has exactly that one use and the consumer's
shape, and (when it comes more than :data:`MAX_ABSORB_DISTANCE` equations before it)
joining keeps none of its operands alive longer; the root is the equation whose
result is used elsewhere (or is a program output).  A group becomes a kernel when its estimated time on one core reaches
:data:`MIN_KERNEL_NS`: its transcendental ops (:data:`OP_NS` per element: GELU's
``tanh``, softmax's ``exp`` over a large operand), and its arithmetic only in
results of a million elements or more (below that a chain of arithmetic is
memory-bound, threads gain little and the unfused code's in-place buffers are
lost); every program stays as it was when threads cannot help.
``spmd.config.update("fuse_elementwise", False)`` (or
``SPMD_FUSE_ELEMENTWISE=0``) turns the pass off for programs compiled after.

On CuPy the same tree is one ``ElementwiseKernel`` (:func:`c_operation`: one
launch for the group instead of one per equation; CUDA may contract ``a * b + c``
into one fused multiply-add, so a GPU kernel's numbers can differ from the unfused
ones by float rounding); on another array module, the member equations' own
implementations, in order.  ``Lowered.as_text(executed=True)`` shows each group as one
equation::

    c:f32[2048,1024] = fused_elementwise[kernel=((0.5 * a) * (1.0 + tanh(...)))] a
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from spmd.compiler.avals import ShapedArray
from spmd.compiler.fold import use_counts
from spmd.compiler.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.primitives import Primitive
from spmd.compiler.threads import POOL

# Results with fewer elements are never fused.
MIN_ELEMENTS = 1 << 14
# A group becomes a kernel when its estimated single-core time is at least this
# many nanoseconds: sharing it among threads saves half of it (on 2 cores), far more
# than the ~30-50 us of handing blocks to the threads; cheaper chains stay as the
# unfused code, whose in-place buffers and implicit broadcasts are as fast on one
# core (measured: a blocked chain on one thread is no faster than numpy's calls, the
# passes over memory being cheap next to the arithmetic here).
MIN_KERNEL_NS = 200_000
# Estimated numpy float32 time per element of the heavy kernel ops, in ns (measured on
# this project's 2-core CI machine, 1M elements).  The others (arithmetic, about
# 0.25 ns, memory-bound) count towards MIN_KERNEL_NS only in results of at least
# ARITH_MIN_ELEMENTS elements.
OP_NS = {"exp": 1.3, "log": 1.7, "tanh": 2.6, "sin": 1.6, "cos": 1.6, "log1p": 12.0,
         "expm1": 12.0, "power": 6.0}
OP_NS_ARITH = 0.25
ARITH_MIN_ELEMENTS = 1 << 20
# Elements of one block: large enough that a block's Python calls (~1.5 us each)
# cost little next to its arithmetic, small enough that its operands and scratch
# buffers stay in a core's L2 cache.
BLOCK_ELEMENTS = 1 << 16

# A producer more than this many equations before its consumer joins the consumer's
# kernel only if its group's operands are read there or later anyway.  Otherwise (a
# value the forward computes and only the backward reads, such as a custom
# derivative's), joining would move its work to the consumer and keep all its
# operands alive until then, instead of its one result.  (An optimizer's update
# reads parameters and moments that live to the end: it still joins.)
MAX_ABSORB_DISTANCE = 64

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_BOOL = np.dtype(bool)
_COMPARISONS = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
# How a tree prints: infix for arithmetic and comparisons, a call otherwise.
_INFIX = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "power": "**",
          "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
          "equal": "==", "not_equal": "!="}


class Kernel:
    """One fused group: ``tree`` over the group's inputs, of dtypes ``in_dtypes``.

    A node of ``tree`` is ``("in", i)``, ``("const", value)`` (a numpy 0-d array
    of the literal's dtype, as the unfused code binds it) or
    ``(op, primitive, params, children, dtype)``.  Hashable, and compared by its printed
    expression and types (it is a parameter of an equation, so a cache key).
    """

    __slots__ = ("tree", "in_dtypes", "shape", "dtype", "_text")

    def __init__(self, tree, in_dtypes, shape, dtype):
        self.tree = tree
        self.in_dtypes, self.shape, self.dtype = tuple(in_dtypes), tuple(shape), np.dtype(dtype)
        self._text = _render(tree)

    def __repr__(self) -> str:
        return self._text

    def _key(self):
        return (self._text, self.in_dtypes, self.shape, self.dtype)

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other) -> bool:
        return isinstance(other, Kernel) and self._key() == other._key()


def _letters(i: int) -> str:
    s, i = "", i + 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(ord("a") + r) + s
    return s


def _render(node) -> str:
    if node[0] == "in":
        return _letters(node[1])
    if node[0] == "const":
        return repr(node[1].item())
    op, _, params, children, _ = node
    args = [_render(c) for c in children]
    if op in _INFIX:
        return f"({args[0]} {_INFIX[op]} {args[1]})"
    if op == "integer_pow":
        return f"({args[0]} ** {params['y']})"
    if op == "where":  # select_n(pred, on_false, on_true)
        return f"where({args[0]}, {args[2]}, {args[1]})"
    return f"{op}({', '.join(args)})"


# ------------------------------------------------------------------ the primitive

fused_p = Primitive("fused_elementwise", traits=("fresh_result",))


@fused_p.def_impl
def _fused_impl(xp, *args, kernel):
    """The member equations' own implementations, in order (the unfused program)."""
    def run(node):
        if node[0] == "in":
            return args[node[1]]
        if node[0] == "const":
            return node[1] if xp is np else xp.asarray(node[1])
        _, prim, params, children, _ = node
        return prim.impl(xp, *[run(c) for c in children], **params)

    out = run(kernel.tree)
    return out if out.shape == kernel.shape else xp.broadcast_to(out, kernel.shape).copy()


@fused_p.def_abstract_eval
def _fused_aval(*avals, kernel):
    return ShapedArray(kernel.shape, kernel.dtype)


def _bind_impl(xp, *, kernel):
    """The compiled kernel: blocks and threads on numpy, one ``ElementwiseKernel`` on
    CuPy (one launch for the whole group), the impl elsewhere."""
    if xp is np:
        return BlockedKernel(kernel)
    if hasattr(xp, "ElementwiseKernel"):
        return _elementwise_kernel(xp, kernel)
    return functools.partial(_fused_impl, xp, kernel=kernel)


# ------------------------------------------------------------- CuPy: one launch

# The C forms of the kernel ops (CUDA's math functions, overloaded for float and
# double as CuPy's own ufuncs call them).
_C = {"add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})",
      "divide": "({0} / {1})", "negative": "(-{0})", "power": "pow({0}, {1})",
      "exp": "exp({0})", "log": "log({0})", "log1p": "log1p({0})", "expm1": "expm1({0})",
      "tanh": "tanh({0})", "sqrt": "sqrt({0})", "sin": "sin({0})", "cos": "cos({0})",
      "absolute": "fabs({0})", "less": "({0} < {1})", "less_equal": "({0} <= {1})",
      "greater": "({0} > {1})", "greater_equal": "({0} >= {1})", "equal": "({0} == {1})",
      "not_equal": "({0} != {1})"}
_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", _BOOL: "bool"}


def c_operation(kernel: Kernel) -> str:
    """The kernel's tree as one C assignment to ``out`` over inputs ``x0, x1, ...``.

    >>> c_operation(kernel)  # doctest: +SKIP
    'out = ((x0 * ((float)2.0)) + tanh(x1))'
    """
    def render(node) -> str:
        if node[0] == "in":
            return f"x{node[1]}"
        if node[0] == "const":
            v = node[1]
            if v.dtype == _BOOL:
                return "true" if bool(v) else "false"
            return f"(({_C_TYPES[v.dtype]}){float(v)!r})"
        op, _, params, children, dtype = node
        args = [render(c) for c in children]
        t = _C_TYPES[dtype]
        if op == "where":  # select_n(pred, on_false, on_true)
            return f"({args[0]} ? {args[2]} : {args[1]})"
        if op == "rsqrt":  # as its impl: 1 / sqrt(x)
            return f"(({t})1 / sqrt({args[0]}))"
        if op == "integer_pow":  # as its impl: x * x for 2, else pow
            y = params["y"]
            return f"({args[0]} * {args[0]})" if y == 2 else f"pow({args[0]}, ({t}){y})"
        return _C[op].format(*args)

    return f"out = {render(kernel.tree)}"


def _elementwise_kernel(xp, kernel: Kernel):
    ins = ", ".join(f"{d.name} x{i}" for i, d in enumerate(kernel.in_dtypes))
    name = "spmd_fused_" + format(hash(kernel) & 0xFFFFFFFF, "08x")
    compiled = xp.ElementwiseKernel(ins, f"{kernel.dtype.name} out", c_operation(kernel),
                                    name)
    shape, dtype = kernel.shape, kernel.dtype

    def run(*args):
        out = xp.empty(shape, dtype)
        compiled(*args, out)
        return out

    return run


fused_p.rules["bind_impl"] = _bind_impl


def _not_transformed(*args, **params):
    raise NotImplementedError("fused_elementwise appears only in programs lowered for "
                              "execution, which are never transformed")


fused_p.def_jvp(_not_transformed)
fused_p.def_batch(_not_transformed)


# ------------------------------------------------------------ blocks and threads

_scratch = threading.local()


class BlockedKernel:
    """A :class:`Kernel` on numpy: its numpy functions over blocks of rows, with
    ``out=`` scratch buffers, the blocks shared among :data:`POOL`'s threads."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        shape = kernel.shape
        lead = 0
        while lead < len(shape) - 1 and shape[lead] == 1:  # e.g. one stacked device
            lead += 1
        self.lead = lead
        rows = shape[lead] if shape else 1
        per_row = math.prod(shape[lead + 1:])
        self.rows_per_block = max(1, min(rows, BLOCK_ELEMENTS // max(per_row, 1)))
        self.block = _compile_block(kernel)

    def __call__(self, *args):
        k = self.kernel
        out = np.empty(k.shape, k.dtype)
        lead, step = self.lead, self.rows_per_block
        rows = k.shape[lead]
        head = (0,) * lead
        full = [a.ndim == len(k.shape) for a in args]
        starts = list(range(0, rows, step))
        n_parts = min(POOL.size(), len(starts))
        per = -(-len(starts) // n_parts)

        def part(chunk):
            def go():
                for i0 in chunk:
                    sl = head + (slice(i0, min(i0 + step, rows)),)
                    self.block([a[sl] if f else a for a, f in zip(args, full)], out[sl])
            return go

        POOL.run([part(starts[j:j + per]) for j in range(0, len(starts), per)])
        return out


def _scratch_buffer(slot: int, like, dtype):
    """This thread's scratch buffer number ``slot`` of ``dtype``, viewed at ``like``'s
    shape.  One flat buffer per (slot, dtype) and thread, as large as the largest
    block met: bounded however many shapes the kernels have."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    key = (slot, dtype)
    size = like.size
    buf = bufs.get(key)
    if buf is None or buf.size < size:
        buf = bufs[key] = np.empty(size, dtype)
    return buf[:size].reshape(like.shape)


def _compile_block(kernel: Kernel):
    """``block(x, out)``: the tree's numpy calls on one block (inputs ``x``), the
    root writing into ``out``.  Intermediate results go to this thread's scratch
    buffers; a parent writes into a child's buffer of its dtype (elementwise, so in
    place), except ``where``, which writes its first case before reading the other."""
    lines, ns = [], {"np": np, "_buf": _scratch_buffer}
    n_slots = [0]
    free: dict = {}  # dtype -> scratch slots no longer read

    def emit(node, dest=None):
        """The code of ``node``; returns its name and scratch slot (None for ``out``,
        an input or a constant)."""
        if node[0] == "in":
            return f"x[{node[1]}]", None
        if node[0] == "const":
            name = f"k{len(ns)}"
            ns[name] = node[1]
            return name, None
        op, prim, params, children, dtype = node
        kids = [emit(c) for c in children]
        args = [k[0] for k in kids]
        mine = None
        if dest is None:
            reusable = [k[1] for k in kids if k[1] is not None and k[1][1] == dtype]
            if reusable and op != "where":
                mine = reusable[0]
            else:
                pool = free.get(dtype)
                mine = (pool.pop(), dtype) if pool else (n_slots[0], dtype)
                n_slots[0] += mine[0] == n_slots[0]
            dest = f"t{mine[0]}"
            lines.append(f"{dest} = _buf({mine[0]}, out, {dtype.name!r})")
        for k in kids:
            if k[1] is not None and k[1] != mine:
                free.setdefault(k[1][1], []).append(k[1][0])
        if op == "where":  # select_n(pred, on_false, on_true)
            lines.append(f"np.copyto({dest}, {args[1]}); "
                         f"np.copyto({dest}, {args[2]}, where={args[0]})")
        elif op == "rsqrt":  # as its impl: 1 / sqrt(x)
            lines.append(f"np.sqrt({args[0]}, out={dest}); np.divide(1, {dest}, out={dest})")
        elif op == "integer_pow":  # its impl, whose result is copied
            fn = f"f{len(ns)}"
            ns[fn] = functools.partial(prim.impl, np, **params)
            lines.append(f"np.copyto({dest}, {fn}({args[0]}))")
        else:
            lines.append(f"np.{op}({', '.join(args)}, out={dest})")
        return dest, mine

    emit(kernel.tree, "out")
    src = "def block(x, out):\n" + "".join(f"    {ln}\n" for ln in lines)
    exec(compile(src, "<spmd:kernel>", "exec"), ns)
    return ns["block"]


# ----------------------------------------------------------------------- the pass

def _kernel_op(eqn, min_elements: int):
    """The equation's kernel op when it may join a kernel, else None."""
    op = eqn.primitive.rules.get("kernel_op")
    if op is None or eqn.primitive.multiple_results or len(eqn.outputs) != 1:
        return None
    out = eqn.outputs[0].aval
    if not out.shape or math.prod(out.shape) < min_elements:
        return None
    ins = [a.aval for a in eqn.inputs]
    # Operands of the result's shape, or scalars (literals): what a block can slice.
    if any(a.shape not in ((), out.shape) for a in ins):
        return None
    dts = [a.dtype for a in ins]
    if op in _COMPARISONS:
        ok = out.dtype == _BOOL and len(dts) == 2 and all(d in _FLOATS for d in dts)
    elif op == "where":
        ok = len(dts) == 3 and dts[0] == _BOOL and out.dtype in _FLOATS and \
            dts[1] == dts[2] == out.dtype
    else:
        ok = out.dtype in _FLOATS and all(d == out.dtype for d in dts)
    return op if ok else None


def fuse_elementwise(closed: ClosedProgram, min_elements: int | None = None,
                     min_kernel_ns: float | None = None) -> ClosedProgram:
    """Group the elementwise chains of ``closed`` into ``fused_elementwise`` equations
    (see the module docstring): groups whose estimated time (:data:`OP_NS`) is at
    least ``min_kernel_ns``; ``min_kernel_ns=0`` makes every group of two or more
    equations a kernel.

    >>> fused = fuse_elementwise(lowered)  # doctest: +SKIP
    """
    min_elements = MIN_ELEMENTS if min_elements is None else min_elements
    min_kernel_ns = MIN_KERNEL_NS if min_kernel_ns is None else min_kernel_ns
    program = closed.program
    eqns = program.eqns
    ops = [_kernel_op(e, min_elements) for e in eqns]
    if all(op is None for op in ops):
        return closed
    uses = use_counts(program)
    producer = {e.outputs[0]: i for i, e in enumerate(eqns) if ops[i] is not None}
    absorbed: set = set()  # equations computed inside their consumer's kernel
    last = _last_uses(program)
    for i, e in enumerate(eqns):
        if ops[i] is None:
            continue
        shape = e.outputs[0].aval.shape
        for a in e.inputs:
            j = producer.get(a) if isinstance(a, Var) else None
            if j is not None and uses.get(a, 0) == 1 and a.aval.shape == shape and (
                    i - j <= MAX_ABSORB_DISTANCE or
                    not _outlives(j, i, eqns, producer, absorbed, last)):
                absorbed.add(j)
    # The groups worth a kernel; the members of the others stay where they are.
    roots = [i for i, op in enumerate(ops) if op is not None and i not in absorbed]
    kept: dict = {}
    for i in roots:
        members = _members(i, eqns, producer, absorbed)
        # The heavy ops count; arithmetic only over large operands: below that it is
        # memory-bound, gains little from threads and loses the unfused code's in-place
        # buffers (measured: an SGD update of 0.4 M weights 0.15 ms unfused, 0.9 ms as
        # a kernel; over 2 M elements a kernel of 2-4 arithmetic ops was 1.6-2.3x
        # faster than numpy's calls, which allocate a fresh result each).
        size = math.prod(eqns[i].outputs[0].aval.shape)
        arith = OP_NS_ARITH if size >= ARITH_MIN_ELEMENTS else 0.0
        ns = size * sum(OP_NS.get(ops[j], arith) for j in members)
        if (ns >= min_kernel_ns > 0) or (min_kernel_ns <= 0 and len(members) > 1):
            kept[i] = members
    if not kept:
        return closed
    inside = set().union(*kept.values()) - set(kept)
    out_eqns = [_group(i, eqns, ops, producer, absorbed) if i in kept else e
                for i, e in enumerate(eqns) if i not in inside]
    return ClosedProgram(Program(program.in_vars, out_eqns, program.out_atoms), closed.consts)


def _last_uses(program: Program) -> dict:
    """Each variable's last reader's index (a program output's: past the end)."""
    last = {}
    for i, e in enumerate(program.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                last[a] = i
    for a in program.out_atoms:
        if isinstance(a, Var):
            last[a] = len(program.eqns)
    return last


def _outlives(j: int, i: int, eqns, producer, absorbed, last) -> bool:
    """Whether computing equation ``j``'s group inside equation ``i`` would keep one of
    the group's arrays alive past its last reader (it would be read at ``i``); scalars
    and small arrays cost nothing to keep."""
    for k in _members(j, eqns, producer, absorbed):
        for a in eqns[k].inputs:
            if isinstance(a, Var) and producer.get(a) not in absorbed and \
                    last.get(a, -1) < i and math.prod(a.aval.shape) >= MIN_ELEMENTS:
                return True
    return False


def _members(root: int, eqns, producer, absorbed) -> set:
    """The indices of the equations of the group rooted at ``root``."""
    seen, stack = set(), [root]
    while stack:
        i = stack.pop()
        seen.add(i)
        stack.extend(producer[a] for a in eqns[i].inputs
                     if isinstance(a, Var) and producer.get(a) in absorbed)
    return seen


def _group(root: int, eqns, ops, producer, absorbed) -> Eqn:
    """The fused equation of the group rooted at ``root`` (its members are computed
    where the root was: each member's one use is inside the group, and its operands
    are defined before it, so before the root)."""
    leaves: dict = {}  # input var -> its index

    def tree(i):
        e = eqns[i]
        children = []
        for a in e.inputs:
            j = producer.get(a) if isinstance(a, Var) else None
            if j is not None and j in absorbed:
                children.append(tree(j))
            elif isinstance(a, Literal):
                children.append(("const", np.asarray(a.val, dtype=a.aval.dtype)))
            else:
                children.append(("in", leaves.setdefault(a, len(leaves))))
        return (ops[i], e.primitive, dict(e.params), children,
                np.dtype(e.outputs[0].aval.dtype))

    t = tree(root)
    out = eqns[root].outputs[0]
    inputs = list(leaves)
    kernel = Kernel(t, [a.aval.dtype for a in inputs], out.aval.shape,
                    out.aval.dtype)
    return Eqn(fused_p, inputs, [out], {"kernel": kernel}, eqns[root].source_info)
