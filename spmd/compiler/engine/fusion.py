"""Fusion: a chain of elementwise equations runs as one kernel, block by block, on
all cores.

Generated numpy code makes one call per equation, each a full pass over its
operands on one core (GELU's tanh approximation is 8 of them, AdamW's update a
dozen).  This pass, run on programs lowered for execution, groups elementwise
equations into one ``fused_elementwise`` equation whose parameter is a
:class:`Kernel`, a graph of expressions over the group's inputs.  On numpy the
kernel runs its numpy functions block by block: the result is cut into blocks of
rows that fit in a core's cache (:data:`BLOCK_ELEMENTS`), every function of the
chain runs on one block (writing into scratch buffers, ``out=``) before the next
block starts, and the blocks are shared among threads (numpy releases the GIL in
its loops).  So a chain makes one pass over memory and uses every core, and its
numbers are *the same bits* as the unfused program's: the same numpy functions
on the same elements, whatever the blocks or the threads.

The threads are the engine's (:mod:`spmd.compiler.engine.threads`: ``SPMD_NUM_THREADS``,
else ``OMP_NUM_THREADS``, else the usable cores; the calling thread is one of
them).  Kernels are made only where BLAS's own threads sleep between calls
(``OPENBLAS_THREAD_TIMEOUT``, see :func:`spmd.compiler.engine.threads.threads_help`):
otherwise they busy-wait on the cores for long after each product, and a kernel
on two threads ran no faster than on one.

Measured before choosing (``docs/history/2026-12-05-engine-rounds.md``): numexpr and numba
evaluated transcendental functions with scalar libm calls, 3x slower than numpy's
vectorized float32 ``tanh``/``exp`` here, and numexpr was slower than numpy even
on arithmetic chains.  Blocked numpy calls keep numpy's fast loops and need no
compiler.  Where numba is installed, a kernel later becomes a compiled loop
(:mod:`spmd.compiler.engine.fusion_jit`), whose float32 ``exp`` and ``tanh`` are written to
be vectorized (:mod:`spmd.compiler.engine.kernel_math`); with loops, groups of plain
arithmetic from :data:`LOOP_MIN_ELEMENTS` elements are kernels too.

Which equations may join a group is declared by each primitive:
``rules.kernel_op`` names the numpy function that computes it on floats
(``"tanh"``, ``"multiply"``, ``"where"``, ...), beside its definition in
``spmd/compiler/ops/elementwise.py``.  A group is a graph of equations of one
shape, computed where its last member was: an equation joins the group of each
producer of its operands unless an equation outside the group reads one of the
group's values in between (it would run before the value exists) or (for a
producer more than :data:`MAX_ABSORB_DISTANCE` equations before) moving its group
would keep one of its operands alive longer.  A value read twice inside is computed once
(GELU's ``x`` and ``tanh``); a value read outside is one of the kernel's outputs (a
custom derivative beside the value: GELU's forward and its derivative are one
kernel with two results).  A group becomes a kernel when its estimated time on one
core reaches :data:`MIN_KERNEL_NS`: its transcendental ops (:data:`OP_NS` per
element: GELU's ``tanh``, softmax's ``exp`` over a large operand), and its
arithmetic only in results of a million elements or more (below that a chain of
arithmetic alone is memory-bound, threads gain little and the unfused code's
in-place buffers are lost); every program stays as it was when threads cannot help.
``spmd.config.update("fuse_elementwise", False)`` (or
``SPMD_FUSE_ELEMENTWISE=0``) turns the pass off for programs compiled after.

On CuPy the same group is one ``ElementwiseKernel`` (:mod:`spmd.compiler.engine.fusion_gpu`: one
launch for the group instead of one per equation, a shared value a local of the
kernel; CUDA may contract ``a * b + c``
into one fused multiply-add, so a GPU kernel's numbers can differ from the unfused
ones by float rounding); on another array module, the member equations' own
implementations, in order.  ``Lowered.as_text(executed=True)`` shows each group as one
equation, a shared value bound once (``let t0 = ... in``)::

    c:f32[2048,1024] = fused_elementwise[kernel=((0.5 * a) * (1.0 + tanh(...)))] a
    d:f32[64,256] e:f32[64,256] = fused_elementwise[kernel=let t0 = tanh(a) in ((t0 * b), (1.0 - (t0 * t0)))] a b
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from spmd.compiler.engine import fusion_jit, loops
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.engine.fusion_gpu import elementwise_kernel
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.engine.threads import POOL

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
# With compiled loops, groups of two or more equations from this many elements are
# kernels too (a loop's call costs a few microseconds: an optimizer's update of a
# small weight, a dozen numpy calls, is then one pass).
LOOP_MIN_ELEMENTS = 1 << 11
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
# How a node prints: infix for arithmetic and comparisons, a call otherwise.
_INFIX = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "power": "**",
          "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
          "equal": "==", "not_equal": "!="}


class Kernel:
    """One fused group: ``nodes`` over the group's inputs (of dtypes ``in_dtypes``),
    ``outputs`` the nodes whose values leave the kernel.

    ``nodes`` are the member equations in program order, each
    ``(op, primitive, params, args, dtype)``; an argument is ``("in", i)``,
    ``("const", value)`` (a numpy 0-d array of the literal's dtype, as the unfused
    code binds it) or ``("node", k)``, an earlier node's value (read by as many
    nodes as read it: a group is a graph, not only a tree).  Hashable, and compared by
    its printed form and types (it is a parameter of an equation, so a cache key).
    """

    __slots__ = ("nodes", "outputs", "in_dtypes", "shape", "out_dtypes", "blocked", "_text")

    def __init__(self, nodes, outputs, in_dtypes, shape, blocked: bool = True):
        self.nodes, self.outputs = tuple(nodes), tuple(outputs)
        self.in_dtypes, self.shape = tuple(in_dtypes), tuple(shape)
        # False: a group made for a compiled loop alone, which runs its members'
        # implementations (the unfused program) until the loop is in force.
        self.blocked = bool(blocked)
        self.out_dtypes = tuple(np.dtype(self.nodes[k][4]) for k in self.outputs)
        self._text = _render(self)

    def __repr__(self) -> str:
        return self._text

    def _key(self):
        return (self._text, self.in_dtypes, self.shape, self.out_dtypes, self.blocked)

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other) -> bool:
        return isinstance(other, Kernel) and self._key() == other._key()

    def reads(self) -> list:
        """How many nodes read each node."""
        n = [0] * len(self.nodes)
        for node in self.nodes:
            for a in node[3]:
                if a[0] == "node":
                    n[a[1]] += 1
        return n

    def overwritable(self, j: int) -> list:
        """The inputs result ``j`` may be written into, block by block: of its dtype,
        read by no node after the one computing it (a ``where`` writes its first case
        before reading the others: none)."""
        p = self.outputs[j]
        if self.nodes[p][0] == "where":
            return []
        last = {}
        for n, node in enumerate(self.nodes):
            for a in node[3]:
                if a[0] == "in":
                    last[a[1]] = n
        return [k for k, n in sorted(last.items())
                if n <= p and self.in_dtypes[k] == self.out_dtypes[j]]

    def shared(self) -> list:
        """The nodes computed once and read by name: read twice or more, or read and
        also an output."""
        reads, outs = self.reads(), set(self.outputs)
        return [k for k in range(len(self.nodes)) if reads[k] > 1 or (reads[k] and k in outs)]


def _letters(i: int) -> str:
    s, i = "", i + 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(ord("a") + r) + s
    return s


def _render(kernel: Kernel) -> str:
    """Infix expressions over the inputs ``a, b, ...``; a shared node is bound once
    (``let t0 = ... in ...``); several outputs print as a tuple."""
    names = {k: f"t{n}" for n, k in enumerate(kernel.shared())}

    def arg(a) -> str:
        if a[0] == "in":
            return _letters(a[1])
        if a[0] == "const":
            return repr(a[1].item())
        return names.get(a[1]) or expr(a[1])

    def expr(k) -> str:
        op, _, params, args, _ = kernel.nodes[k]
        xs = [arg(a) for a in args]
        if op in _INFIX:
            return f"({xs[0]} {_INFIX[op]} {xs[1]})"
        if op == "integer_pow":
            return f"({xs[0]} ** {params['y']})"
        if op == "where":  # select_n(pred, on_false, on_true)
            return f"where({xs[0]}, {xs[2]}, {xs[1]})"
        return f"{op}({', '.join(xs)})"

    outs = [names.get(k) or expr(k) for k in kernel.outputs]
    body = outs[0] if len(outs) == 1 else f"({', '.join(outs)})"
    lets = "; ".join(f"{names[k]} = {expr(k)}" for k in names)
    return f"let {lets} in {body}" if lets else body


# ------------------------------------------------------------------ the primitive

fused_p = Primitive("fused_elementwise", traits=("fresh_result",), multiple_results=True)


def _evaluate(kernel: Kernel, args, xp) -> list:
    """The kernel's output values, each node by its primitive's impl (the unfused
    program's code, in order)."""
    values = []
    for op, prim, params, node_args, _ in kernel.nodes:
        xs = [args[a[1]] if a[0] == "in" else values[a[1]] if a[0] == "node" else
              a[1] if xp is np else xp.asarray(a[1]) for a in node_args]
        values.append(prim.impl(xp, *xs, **params))
    return [values[k] for k in kernel.outputs]


@fused_p.def_impl
def _fused_impl(xp, *args, kernel):
    """The member equations' own implementations, in order (the unfused program)."""
    return [out if out.shape == kernel.shape else xp.broadcast_to(out, kernel.shape).copy()
            for out in _evaluate(kernel, args, xp)]


@fused_p.def_abstract_eval
def _fused_aval(*avals, kernel):
    return [ShapedArray(kernel.shape, dt) for dt in kernel.out_dtypes]


def _unfused_into(kernel, *args, out=None):
    """The member equations' implementations (a loop's group before its loop is in
    force, or where numba cannot compile it); ``out`` is not used."""
    return _fused_impl(np, *args, kernel=kernel)


def _bind_impl(xp, *, kernel):
    """The compiled kernel: blocks and threads on numpy, one ``ElementwiseKernel`` on
    CuPy (one launch for the whole group), the impl elsewhere."""
    if xp is np:
        before = BlockedKernel(kernel) if kernel.blocked else \
            functools.partial(_unfused_into, kernel)
        if loops.enabled() and fusion_jit.compilable(kernel):
            return fusion_jit.Runner(kernel, before)  # a compiled loop from a later call
        return before
    if hasattr(xp, "ElementwiseKernel"):
        return elementwise_kernel(xp, kernel)
    return functools.partial(_fused_impl, xp, kernel=kernel)


fused_p.rules.bind_impl = _bind_impl
# The generated numpy code hands a kernel buffers for its results (``out=``), as it
# does a ufunc: a dead value's, or an operand's that nothing reads afterwards.
fused_p.rules.results_into = lambda j, *, kernel: kernel.overwritable(j)


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

    def __call__(self, *args, out=None):
        k = self.kernel
        outs = [np.empty(k.shape, d) for d in k.out_dtypes] if out is None else \
            [o if o is not None else np.empty(k.shape, d) for o, d in zip(out, k.out_dtypes)]
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
                    self.block([a[sl] if f else a for a, f in zip(args, full)],
                               [o[sl] for o in outs])
            return go

        POOL.run([part(starts[j:j + per]) for j in range(0, len(starts), per)])
        return outs


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
    """``block(x, o)``: the nodes' numpy calls on one block (inputs ``x``), each output
    node writing into its block ``o[j]`` of the results.  Other nodes write into
    this thread's scratch buffers; a node writes into the buffer of an operand of its
    dtype that no later node reads (elementwise, so in place), except ``where``, which
    writes its first case before reading the other; a buffer no later node reads is
    free for the next node that needs one."""
    ns = {"np": np, "_buf": _scratch_buffer}
    last = {}  # node -> the last node reading it
    for k, node in enumerate(kernel.nodes):
        for a in node[3]:
            if a[0] == "node":
                last[a[1]] = k
    out_of = {k: j for j, k in enumerate(kernel.outputs)}
    where, slots, free, lines = {}, [], {}, []  # node -> (name, slot); slot dtypes

    def arg(a) -> str:
        if a[0] == "in":
            return f"x[{a[1]}]"
        if a[0] == "const":
            name = f"k{len(ns)}"
            ns[name] = a[1]
            return name
        return where[a[1]][0]

    for k, (op, prim, params, node_args, dtype) in enumerate(kernel.nodes):
        dtype = np.dtype(dtype)
        args = [arg(a) for a in node_args]
        dying = {where[a[1]][1] for a in node_args if a[0] == "node" and last[a[1]] == k
                 and where[a[1]][1] is not None}
        slot = None
        if k in out_of:
            dest = f"o[{out_of[k]}]"
        else:
            mine = [s for s in sorted(dying) if slots[s] == dtype] if op != "where" else []
            if mine:
                slot = mine[0]
            elif free.get(dtype):
                slot = free[dtype].pop()
            else:
                slot = len(slots)
                slots.append(dtype)
            dest = f"t{slot}"
        for s in dying - {slot}:
            free.setdefault(slots[s], []).append(s)
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
        where[k] = (dest, slot)
        if slot is not None and k not in last:  # read by no node (never: a safeguard)
            free.setdefault(dtype, []).append(slot)
    head = [f"t{s} = _buf({s}, o[0], {d.name!r})" for s, d in enumerate(slots)]
    src = "def block(x, o):\n" + "".join(f"    {ln}\n" for ln in head + lines)
    exec(compile(src, "<spmd:kernel>", "exec"), ns)
    return ns["block"]


# ----------------------------------------------------------------------- the pass

def _kernel_op(eqn, min_elements: int):
    """The equation's kernel op when it may join a kernel, else None."""
    op = eqn.primitive.rules.kernel_op
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
                     min_kernel_ns: float | None = None, *, blocked: bool = True,
                     loops: bool = False) -> ClosedProgram:
    """Group the elementwise equations of ``closed`` into ``fused_elementwise``
    equations (see the module docstring): with ``blocked``, groups whose estimated
    time (:data:`OP_NS`) is at least ``min_kernel_ns`` (default
    :data:`MIN_KERNEL_NS`); ``min_kernel_ns=0`` makes every group of two or more
    equations a kernel.  With ``loops`` (numba compiles them), also every group of
    two or more equations of :data:`LOOP_MIN_ELEMENTS` elements or more whose ops a
    loop computes (:func:`spmd.compiler.engine.fusion_jit.compilable`).

    >>> fused = fuse_elementwise(lowered)  # doctest: +SKIP
    """
    min_elements = MIN_ELEMENTS if min_elements is None else min_elements
    min_kernel_ns = MIN_KERNEL_NS if min_kernel_ns is None else min_kernel_ns
    program = closed.program
    eqns = program.eqns
    ops = [_kernel_op(e, min(min_elements, LOOP_MIN_ELEMENTS) if loops else min_elements)
           for e in eqns]
    if all(op is None for op in ops):
        return closed
    readers = _readers(program)
    producer = {e.outputs[0]: i for i, e in enumerate(eqns) if ops[i] is not None}
    # Groups grow in program order: equation i joins (or takes in) the group of each
    # producer of its operands, and the group is computed where i is (its last member),
    # so every group's members come no later than the equation at hand.
    group_of: dict = {}  # equation -> the last member of its group (the group's name)
    groups: dict = {}  # group name -> its members
    for i, e in enumerate(eqns):
        if ops[i] is None:
            continue
        group_of[i], groups[i] = i, {i}
        shape = e.outputs[0].aval.shape
        for a in e.inputs:
            j = producer.get(a) if isinstance(a, Var) else None
            if j is None or a.aval.shape != shape or group_of[j] == i:
                continue
            _join(i, j, groups, group_of, eqns, producer, readers)
    kept = {}
    for root, members in groups.items():
        # The heavy ops count; arithmetic only over large operands: below that it is
        # memory-bound, gains little from threads and loses the unfused code's in-place
        # buffers (measured: an SGD update of 0.4 M weights 0.15 ms unfused, 0.9 ms as
        # a kernel; over 2 M elements a kernel of 2-4 arithmetic ops was 1.6-2.3x
        # faster than numpy's calls, which allocate a fresh result each).
        size = math.prod(eqns[root].outputs[0].aval.shape)
        arith = OP_NS_ARITH if size >= ARITH_MIN_ELEMENTS else 0.0
        ns = size * sum(OP_NS.get(ops[j], arith) for j in members)
        as_blocks = blocked and size >= min_elements and (
            (ns >= min_kernel_ns > 0) or (min_kernel_ns <= 0 and len(members) > 1))
        fused = _group(sorted(members), eqns, ops, readers, as_blocks)
        if as_blocks or (loops and len(members) > 1 and fusion_jit.compilable(
                fused.params["kernel"])):
            kept[root] = fused
    if not kept:
        return closed
    inside = set().union(*(groups[r] for r in kept))
    out_eqns = [kept[i] if i in kept else e for i, e in enumerate(eqns)
                if i in kept or i not in inside]
    return ClosedProgram(Program(program.in_vars, out_eqns, program.out_atoms), closed.consts)


def _readers(program: Program) -> dict:
    """Each variable's readers' indices, in order (a program output's: past the end)."""
    readers: dict = {}
    for i, e in enumerate(program.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                readers.setdefault(a, []).append(i)
    for a in program.out_atoms:
        if isinstance(a, Var):
            readers.setdefault(a, []).append(len(program.eqns))
    return readers


def _join(i: int, j: int, groups: dict, group_of: dict, eqns, producer, readers) -> None:
    """Merge the group of ``j`` (the producer of an operand of ``i``) into ``i``'s, where
    :func:`_may_compute_at` allows it (the elementwise kernels' and the row kernels'
    grouping step)."""
    theirs = groups[group_of[j]]
    if _may_compute_at(i, j, theirs, groups[i], eqns, producer, readers):
        for k in groups.pop(group_of[j]):
            group_of[k] = i
        groups[i] |= theirs


def _may_compute_at(i: int, j: int, theirs: set, mine: set, eqns, producer,
                    readers) -> bool:
    """Whether equation ``i``'s group (``mine``) may take in the group ``theirs`` of
    ``j``, the producer of one of its operands, all computed at ``i``: no equation
    outside them before ``i`` reads one of their values, and (when ``j`` is more than
    :data:`MAX_ABSORB_DISTANCE` equations before ``i``) moving ``theirs`` keeps none
    of its operands alive longer (scalars and small arrays cost nothing to keep)."""
    members = theirs | mine
    for k in members:
        for r in readers.get(eqns[k].outputs[0], ()):
            if r < i and r not in members:
                return False
    if i - j > MAX_ABSORB_DISTANCE:
        for k in theirs:
            for a in eqns[k].inputs:
                if isinstance(a, Var) and producer.get(a) not in theirs and \
                        readers[a][-1] < i and math.prod(a.aval.shape) >= MIN_ELEMENTS:
                    return False
    return True


def _group(members: list, eqns, ops, readers, blocked: bool = True) -> Eqn:
    """The fused equation of a group, in place of its last member: its values read
    outside the group (or program outputs) are the kernel's outputs."""
    inside = set(members)
    node_of = {eqns[k].outputs[0]: n for n, k in enumerate(members)}
    leaves: dict = {}  # input var -> its index
    nodes, outputs = [], []
    for n, k in enumerate(members):
        e = eqns[k]
        args = []
        for a in e.inputs:
            if isinstance(a, Var) and a in node_of:
                args.append(("node", node_of[a]))
            elif isinstance(a, Literal):
                args.append(("const", np.asarray(a.val, dtype=a.aval.dtype)))
            else:
                args.append(("in", leaves.setdefault(a, len(leaves))))
        nodes.append((ops[k], e.primitive, dict(e.params), tuple(args),
                      np.dtype(e.outputs[0].aval.dtype)))
        if any(r not in inside for r in readers.get(e.outputs[0], ())):
            outputs.append(n)
    inputs = list(leaves)
    root = eqns[members[-1]]
    kernel = Kernel(nodes, outputs, [a.aval.dtype for a in inputs], root.outputs[0].aval.shape,
                    blocked)
    return Eqn(fused_p, inputs, [eqns[members[n]].outputs[0] for n in outputs],
               {"kernel": kernel}, root.source_info)
