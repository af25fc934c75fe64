"""Row kernels: a chain of elementwise equations with sums over its trailing axes
(a layer norm, forward or backward) runs as one compiled loop over rows.

The numpy code of a layer norm over ``(2048, 64)`` is about ten calls forward and
fifteen backward, each a full pass over memory (about 30 us each here), where one
loop over the rows makes one pass, a row's 64 values in a core's cache (measured:
265 us as numpy calls, 56 us as one compiled loop on one core; PyTorch's
``layer_norm`` 49 us on two).  The blocked numpy kernels of
:mod:`spmd.compiler.engine.fusion` cannot do this: their blocks are numpy calls too, and a
row sum between them splits the chain.

This pass, run on programs lowered for execution before :mod:`spmd.compiler.engine.fusion`,
finds each frame ``(R, C)``: the shape of an operand of a ``reduce_sum`` over its
trailing axes (``C`` elements a row, ``R`` rows).  An equation may join a group of its
frame when it is

* elementwise (``rules.kernel_op``: arithmetic, ``sqrt``, ``rsqrt``, ``where``,
  comparisons, ``integer_pow``; not the transcendental ops, whose numpy loops are
  vectorized here and a compiled loop's libm calls are not), its result a *full*
  value (``R * C`` elements) or a *row* value (``R``), its operands of its shape or
  scalars;
* a ``reduce_sum`` of a full value over the trailing axes (a row value);
* a ``reshape`` within a space, or a ``broadcast_in_dim`` of a row value along the
  trailing axes, or of a value computed outside (read as a full, tile, row, column
  or scalar operand, whichever it is: a layer norm's scale is a column operand).

Groups grow as :mod:`spmd.compiler.engine.fusion`'s do (an equation joins the groups of the
producers of its operands, all computed where the last member was, unless something
outside reads a member's value in between); a group becomes a ``fused_rows``
equation when it holds a sum and at least :data:`MIN_ELEMENTS` elements a value.  Its
values read outside are its results.

A group runs first as its member equations' own implementations (the unfused
program's numbers).  At its second call numba compiles its loop in a background
thread (cached on disk); from its fifth (:data:`spmd.compiler.engine.loops.SWITCH_AT`),
the same call on every rank, the compiled loop runs instead, its rows shared among
the engine's threads when there are many (it releases the GIL).  The loop may add a
sum's terms in another order: results differ from the unfused ones by float
rounding (the tolerance is in ``docs/performance.md``); NaN and infinity propagate
as in numpy.  ``spmd.config.update("compile_kernels", False)`` (or
``SPMD_COMPILE_KERNELS=0``) turns the pass off for programs compiled after; without
numba installed it never runs.  ``Lowered.as_text(executed=True)`` shows each group::

    d:f32[2048,64] e:f32[2048,1] = fused_rows[kernel=rows 2048x64: ...] a b c
"""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.engine.fusion import (_BOOL, _COMPARISONS, _FLOATS, _kernel_op, _letters,
                                  _join, _readers)
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.engine.rows_jit import RowRunner, evaluate, overwritable

# Values of fewer elements are not worth a compiled loop (a numpy call costs a few
# microseconds whatever its size).
MIN_ELEMENTS = 1 << 14
# The ops a row kernel computes: arithmetic and what the compiler vectorizes.
ROW_OPS = frozenset(("add", "subtract", "multiply", "divide", "negative", "sqrt", "rsqrt",
                     "absolute", "where", "integer_pow") + _COMPARISONS)


def _squeezed(shape) -> tuple:
    return tuple(s for s in shape if s != 1)


class Frame:
    """The iteration space of a group: ``rows`` x ``cols``, and the shapes (without
    their ones) of its full and row values."""

    __slots__ = ("rows", "cols", "full", "row")

    def __init__(self, shape, first_axis: int):
        self.rows = math.prod(shape[:first_axis])
        self.cols = math.prod(shape[first_axis:])
        self.full = _squeezed(shape)
        self.row = _squeezed(shape[:first_axis])

    def key(self):
        return (self.rows, self.cols, self.full, self.row)

    def space(self, shape):
        """``"full"``, ``"row"``, ``"scalar"`` or None: where a value of ``shape`` lies."""
        if not shape:
            return "scalar"
        sq, n = _squeezed(shape), math.prod(shape)
        if n == self.rows * self.cols and sq == self.full:
            return "full"
        if n == self.rows and sq == self.row:
            return "row"
        return None

    def repeat(self, expanded, target) -> tuple | None:
        """``(m, p)`` when ``target``'s rows repeat ``expanded``'s ``m`` times in
        blocks of ``p`` (one block of leading axes broadcast, the rest and the columns
        read as they are): row ``r`` reads row ``(r // (m p)) p + r % p``."""
        k = self.split(target)
        if k is None or tuple(expanded[k:]) != tuple(target[k:]):
            return None
        wide = [d for d in range(k) if expanded[d] == 1 and target[d] > 1]
        if not wide or wide != list(range(wide[0], wide[-1] + 1)) or \
                any(expanded[d] != target[d] for d in range(k) if d not in wide):
            return None
        return math.prod(target[wide[0]:wide[-1] + 1]), math.prod(target[wide[-1] + 1:k])

    def split(self, shape) -> int | None:
        """The axis of a full ``shape`` where its trailing ``cols`` elements start."""
        for k in range(len(shape) + 1):
            if math.prod(shape[:k]) == self.rows and math.prod(shape[k:]) == self.cols:
                return k
        return None


def _frame_of_sum(eqn, min_elements: int) -> Frame | None:
    """The frame of a ``reduce_sum`` over its operand's trailing axes, else None."""
    if "sum" not in eqn.primitive.traits:
        return None
    x = eqn.inputs[0].aval
    axes = tuple(sorted(eqn.params["axes"]))
    if x.dtype not in _FLOATS or not axes or axes != tuple(range(axes[0], x.ndim)):
        return None
    frame = Frame(x.shape, axes[0])
    if frame.rows < 2 or frame.cols < 2 or frame.rows * frame.cols < min_elements:
        return None
    return frame


def _role(eqn, frame: Frame):
    """How ``eqn`` may join a group of ``frame``: ``(kind, space)`` or None."""
    if len(eqn.outputs) != 1:
        return None
    out = eqn.outputs[0].aval
    space = frame.space(out.shape)
    if space not in ("full", "row"):
        return None
    traits = eqn.primitive.traits
    if "sum" in traits:
        f = _frame_of_sum(eqn, 0)
        return ("sum", "row") if f is not None and f.key() == frame.key() else None
    if "same_order" in traits:
        inner = frame.space(eqn.inputs[0].aval.shape)
        return ("alias", space) if inner == space and out.dtype in _FLOATS else None
    if "broadcast" in traits:
        return ("broadcast", space) if out.dtype in _FLOATS + (_BOOL,) else None
    # fusion's test of an equation that may join a kernel (operands of the result's
    # shape or scalars, float or boolean dtypes as the op needs), then the loop's ops.
    op = _kernel_op(eqn, 0)
    if op in ROW_OPS or (op == "exp" and out.dtype == np.float32):  # (kernel_math's expf)
        return ("op", space)
    return None


def _broadcast_of_node_ok(eqn, frame: Frame) -> bool:
    """Whether a ``broadcast_in_dim`` may read a member of its group: a row value
    along the trailing axes, or a value of the same space (a change of ones)."""
    x, out = eqn.inputs[0].aval, eqn.outputs[0].aval
    src, dst = frame.space(x.shape), frame.space(out.shape)
    if src == dst:
        return True
    if src != "row" or dst != "full":
        return False
    k = frame.split(out.shape)
    if k is None:
        return False
    dims = [d for d, s in zip(eqn.params["broadcast_dimensions"], x.shape) if s != 1]
    return all(d < k for d in dims) and \
        _squeezed([out.shape[d] for d in dims]) == frame.row


def _operand_kind(var_shape, target_shape, bdims, frame: Frame):
    """How a value computed outside is read: ``(kind, expanded shape)``, kind
    ``"full"`` (one value per element), ``"tile"`` (a full value repeated along a
    block of leading axes: a simulated mesh's value replicated over some of its
    devices; its rows read again in turn, never copied out), ``"row"``, ``"col"`` or
    ``"scalar"``; the value is read as ``var.reshape(expanded)`` broadcast to
    ``target_shape`` (whose elements, in order, are the frame's: its shape may be
    another with as many)."""
    expanded = list(target_shape) if bdims is None else [1] * len(target_shape)
    if bdims is not None:
        for d, s in zip(bdims, var_shape):
            expanded[d] = s
    expanded, target = tuple(expanded), tuple(target_shape)
    live = [d for d, s in enumerate(expanded) if s != 1]
    if not live:
        return "scalar", expanded
    if math.prod(target) == frame.rows:
        return "row", expanded
    k = frame.split(target)
    if k is None:
        return "full", expanded
    if expanded[k:] == target[k:] and all(d >= k for d in live):
        return "col", expanded
    if expanded[:k] == target[:k] and all(d < k for d in live):
        return "row", expanded
    if frame.repeat(expanded, target) is not None:
        return "tile", expanded
    return "full", expanded


# ----------------------------------------------------------------- the kernel

class RowKernel:
    """One row group: ``nodes`` in program order over the group's ``inputs``.

    A node is ``(kind, op, params, args, dtype, space)``: ``kind`` is ``"op"`` (an
    elementwise op, ``op`` its kernel op), ``"sum"``, ``"alias"`` (a reshape or a
    broadcast of a member: the same value) or ``"read"`` (operand
    ``params["operand"]`` reshaped to ``params["expanded"]``, broadcast to
    ``params["target"]``, read as a ``params["kind"]`` value: ``"full"``, ``"tile"``,
    ``"row"``, ``"col"`` or ``"scalar"``); ``space`` is ``"full"``, ``"row"`` or ``"scalar"``;
    an argument is ``("node", k)`` or ``("const", value)``.  ``outputs`` are the
    nodes read outside (``out_shapes`` their shapes); ``params["member"]`` of a
    member's node is its index in ``members``.
    Hashable and compared by its printed form (a parameter of an equation)."""

    __slots__ = ("frame", "nodes", "in_dtypes", "outputs", "out_shapes", "out_dtypes",
                 "members", "_text")

    def __init__(self, frame, nodes, in_dtypes, outputs, out_shapes, members):
        self.frame, self.nodes = frame, tuple(nodes)
        self.in_dtypes = tuple(np.dtype(d) for d in in_dtypes)
        self.outputs, self.out_shapes = tuple(outputs), tuple(out_shapes)
        self.out_dtypes = tuple(np.dtype(self.nodes[k][4]) for k in self.outputs)
        # The member equations (primitive, params, operands as ("in", i) / ("node", k)
        # / ("const", v)): the unfused program, which runs until the loop is compiled.
        self.members = tuple(members)
        self._text = _render(self)

    def __repr__(self) -> str:
        return self._text

    def _key(self):
        return (self._text, self.in_dtypes, self.out_dtypes, self.out_shapes,
                self.frame.key())

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other) -> bool:
        return isinstance(other, RowKernel) and self._key() == other._key()

    def member_outputs(self) -> list:
        """The members computing the outputs (indices into ``members``)."""
        return [self.nodes[k][2]["member"] for k in self.outputs]


_INFIX = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "less": "<",
          "less_equal": "<=", "greater": ">", "greater_equal": ">=", "equal": "==",
          "not_equal": "!="}


def _render(kernel: RowKernel) -> str:
    """``rows RxC: t0 = ...; t1 = ...; -> t3, t5`` (inputs ``a, b, ...``; a column
    operand ``b[c]``, a row operand ``b[r]``, a row sum ``sum(...)``)."""
    names = []

    def arg(a):
        return names[a[1]] if a[0] == "node" else repr(a[1].item())

    lines = []
    for k, (kind, op, params, args, _, _) in enumerate(kernel.nodes):
        if kind == "read":
            i = params["operand"]
            suffix = {"full": "", "tile": "[tiled]", "row": "[r]", "col": "[c]",
                      "scalar": ""}[params["kind"]]
            names.append(_letters(i) + suffix)
            continue
        if kind == "alias":
            names.append(arg(args[0]))
            continue
        xs = [arg(a) for a in args]
        if kind == "sum":
            expr = f"sum({xs[0]})"
        elif op in _INFIX:
            expr = f"({xs[0]} {_INFIX[op]} {xs[1]})"
        elif op == "integer_pow":
            expr = f"({xs[0]} ** {params['y']})"
        elif op == "where":
            expr = f"where({xs[0]}, {xs[2]}, {xs[1]})"
        else:
            expr = f"{op}({', '.join(xs)})"
        names.append(f"t{len(lines)}")
        lines.append(f"{names[-1]} = {expr}")
    outs = ", ".join(names[k] for k in kernel.outputs)
    f = kernel.frame
    return f"rows {f.rows}x{f.cols}: {'; '.join(lines)} -> {outs}"


# ------------------------------------------------------------------ the primitive

fused_rows_p = Primitive("fused_rows", traits=("fresh_result",), multiple_results=True)


@fused_rows_p.def_impl
def _rows_impl(xp, *args, kernel):
    return evaluate(kernel, args, xp)


@fused_rows_p.def_abstract_eval
def _rows_aval(*avals, kernel):
    return [ShapedArray(s, d) for s, d in zip(kernel.out_shapes, kernel.out_dtypes)]


def _bind_impl(xp, *, kernel):
    """On numpy, the tiered runner (unfused until compiled, then the compiled loop)."""
    if xp is np:
        return RowRunner(kernel)
    return lambda *args: evaluate(kernel, args, xp)


fused_rows_p.rules.bind_impl = _bind_impl
# The generated code hands the loop buffers for its results (``out=``), as it does a
# ufunc: an operand it owns alone and never reads again, where the loop reads that
# operand's element for the last time before it writes the result's
# (``rows_jit.overwritable``), else a dead value's buffer.  (Fresh results each
# call grew the big step's resident set by a third.)
fused_rows_p.rules.results_into = lambda j, *, kernel: overwritable(kernel, j)


def _not_transformed(*args, **params):
    raise NotImplementedError("fused_rows appears only in programs lowered for "
                              "execution, which are never transformed")


fused_rows_p.def_jvp(_not_transformed)
fused_rows_p.def_batch(_not_transformed)


# ------------------------------------------------------------------------ the pass

def fuse_rows(closed: ClosedProgram, min_elements: int | None = None) -> ClosedProgram:
    """Group the row chains of ``closed`` into ``fused_rows`` equations (see the
    module docstring).

    >>> fused = fuse_rows(lowered)  # doctest: +SKIP
    """
    min_elements = MIN_ELEMENTS if min_elements is None else min_elements
    frames: dict = {}
    for e in closed.program.eqns:
        f = _frame_of_sum(e, min_elements)
        if f is not None:
            frames.setdefault(f.key(), f)
    if not frames:
        return closed
    return _fuse(closed, list(frames.values()))


def _fuse(closed: ClosedProgram, frames: list) -> ClosedProgram:
    """Each equation's frame (the first of ``frames`` that takes it) and role there,
    the groups grown as fusion's, and each group with a sum and another member made a
    ``fused_rows`` equation."""
    program = closed.program
    eqns = program.eqns
    frame_of, role = {}, {}
    for i, e in enumerate(eqns):
        for f in frames:
            r = _role(e, f)
            if r is not None:
                frame_of[i], role[i] = f.key(), r
                break
    if not role:
        return closed
    by_key = {f.key(): f for f in frames}
    readers = _readers(program)
    producer = {e.outputs[0]: i for i, e in enumerate(eqns) if i in role}
    group_of: dict = {}
    groups: dict = {}
    for i, e in enumerate(eqns):
        if i not in role:
            continue
        group_of[i], groups[i] = i, {i}
        frame = by_key[frame_of[i]]
        kind = role[i][0]
        for a in e.inputs:
            j = producer.get(a) if isinstance(a, Var) else None
            if j is None or frame_of.get(j) != frame_of[i] or group_of[j] == i:
                continue
            if kind == "broadcast" and not _broadcast_of_node_ok(e, frame):
                continue
            _join(i, j, groups, group_of, eqns, producer, readers)
    defs = {o: e for e in eqns for o in e.outputs}
    kept = {}
    for root, members in groups.items():
        n_sums = sum(role[k][0] == "sum" for k in members)
        n_ops = sum(role[k][0] == "op" for k in members)
        if n_sums and n_sums + n_ops > 1:
            made = _group(sorted(members), eqns, role, by_key[frame_of[root]], readers, defs)
            if made is not None:
                kept[root] = made
    if not kept:
        return closed
    inside = set().union(*(groups[r] for r in kept))
    out_eqns = []
    for i, e in enumerate(eqns):
        if i in kept:
            out_eqns.extend(kept[i])
        elif i not in inside:
            out_eqns.append(e)
    return ClosedProgram(Program(program.in_vars, out_eqns, program.out_atoms), closed.consts)


def _group(members: list, eqns, role, frame: Frame, readers, defs) -> list | None:
    """The ``fused_rows`` equation of a group, in place of its last member, then the
    group's reshapes and broadcasts whose values are read outside it: those stay
    views, computed after the loop from its results (or from its operands), never
    materialized by it."""
    outside, after = _results_and_views(members, eqns, role, readers)
    group = _GroupKernel(frame, defs)
    outputs, out_vars = [], []
    for k in members:
        e = eqns[k]
        if group.member(e, *role[k]) is None:
            return None  # the groups met through another member: not a loop
        if k in outside:
            outputs.append(len(group.nodes) - 1)
            out_vars.append(e.outputs[0])
    if not outputs:
        return None
    kernel = RowKernel(frame, group.nodes, [v.aval.dtype for v in group.operands], outputs,
                       [v.aval.shape for v in out_vars], group.mems)
    root = eqns[members[-1]]
    return [Eqn(fused_rows_p, group.operands, out_vars, {"kernel": kernel},
                root.source_info)] + [eqns[k] for k in sorted(after)]


def _results_and_views(members, eqns, role, readers):
    """``(outside, after)``: the members whose values the loop returns (read outside
    the group), and the reshapes and broadcasts read outside, computed after it from
    those results instead (views)."""
    inside = set(members)
    outside = {k for k in members
               if any(r not in inside for r in readers.get(eqns[k].outputs[0], ()))}
    after = set()
    producer = {eqns[k].outputs[0]: k for k in members}
    todo = [k for k in outside if role[k][0] in ("alias", "broadcast")]
    while todo:
        k = todo.pop()
        if k in after:
            continue
        after.add(k)
        j = producer.get(eqns[k].inputs[0])
        if j is not None:
            outside.add(j)
            if role[j][0] in ("alias", "broadcast"):
                todo.append(j)
    return outside - after, after


class _GroupKernel:
    """The nodes of a group's row kernel and of its unfused program, built member by
    member (:meth:`member`)."""

    def __init__(self, frame: Frame, defs):
        self.frame, self.defs = frame, defs
        self.operands: list = []  # the variables read from outside, each once
        self.index: dict = {}
        self.node_of: dict = {}  # member var -> its node
        self.read_nodes: dict = {}  # (operand, kind, expanded, target) -> its "read" node
        self.nodes: list = []
        self.mems: list = []
        self.fallback: dict = {}  # (outside var, member's broadcast) -> unfused argument

    def operand(self, a) -> int:
        if a not in self.index:
            self.index[a] = len(self.operands)
            self.operands.append(a)
        return self.index[a]

    def resolve(self, a, wide):
        """What the loop reads for ``a`` (computed outside): the variable under the
        reshapes and broadcasts that made it, those equations in program order, and
        the broadcast they amount to, ``(shape, dimensions, operand shape)`` or None
        (``wide``: the member's own, when it is a broadcast).  Consecutive broadcasts
        compose; a reshape is looked through above a broadcast (the same elements in
        order) and below it, not between two."""
        chain, cur, reshaped = [], a, False
        while True:
            e = self.defs.get(cur)
            if e is None or not e.inputs or not isinstance(e.inputs[0], Var) or \
                    e.inputs[0] in self.node_of:
                break
            if "same_order" in e.primitive.traits:
                reshaped = True
            elif "broadcast" in e.primitive.traits and (wide is None or not reshaped):
                inner = e.params["broadcast_dimensions"]
                wide = (e.outputs[0].aval.shape, inner, e.inputs[0].aval.shape) \
                    if wide is None else \
                    (wide[0], tuple(wide[1][d] for d in inner), e.inputs[0].aval.shape)
                reshaped = False
            else:
                break
            chain.insert(0, e)
            cur = e.inputs[0]
        return cur, chain, wide

    def read(self, a, wide=None):
        """The node reading ``a`` (computed outside) as this member needs it: through
        the reshapes and broadcasts that made it (views: the loop reads their
        operand, a layer norm's saved row values as rows, its scale as a column, a
        replicated value as the rows it repeats, never a copy)."""
        frame = self.frame
        base, _, wide = self.resolve(a, wide)
        target, bdims, shape = wide if wide is not None else (a.aval.shape, None,
                                                              a.aval.shape)
        kind, expanded = _operand_kind(shape, target, bdims, frame)
        key = (self.operand(base), kind, expanded, tuple(target))
        if key not in self.read_nodes:
            n = math.prod(target)
            self.nodes.append(("read", None, {"operand": key[0], "kind": kind,
                                              "expanded": expanded, "target": key[3]},
                               (), np.dtype(a.aval.dtype),
                               "row" if n == frame.rows else "full" if n > 1 else "scalar"))
            self.read_nodes[key] = len(self.nodes) - 1
        return ("node", self.read_nodes[key])

    def unfused(self, a, wide):
        """The unfused program's argument for ``a``: the loop's variable, through the
        same equations (members of the unfused code only)."""
        if (a, wide) not in self.fallback:
            base, chain, _ = self.resolve(a, wide)
            arg = ("in", self.operand(base))
            for c in chain:
                self.mems.append((c.primitive, dict(c.params), (arg,)))
                arg = ("node", len(self.mems) - 1)
            self.fallback[(a, wide)] = arg
        return self.fallback[(a, wide)]

    def member(self, e, kind, space):
        """Add member ``e`` (of ``kind`` in ``space``): its node, and its equation in
        the unfused program; the node's index, or None where it cannot join."""
        out = e.outputs[0].aval
        margs, args = [], []
        for a in e.inputs:
            if isinstance(a, Literal):
                c = np.asarray(a.val, dtype=a.aval.dtype)
                args.append(("const", c))
                margs.append(("const", c))
            elif a in self.node_of:
                if kind == "broadcast" and not _broadcast_of_node_ok(e, self.frame):
                    return None
                args.append(("node", self.node_of[a]))
                margs.append(("node", self.nodes[self.node_of[a]][2]["member"]))
            else:
                wide = (out.shape, tuple(e.params["broadcast_dimensions"]),
                        a.aval.shape) if kind == "broadcast" else None
                margs.append(self.unfused(a, wide))
                args.append(self.read(a, wide))
        params = {"member": len(self.mems)}
        if e.primitive.rules.kernel_op == "integer_pow":  # (its exponent)
            params["y"] = e.params["y"]
        self.nodes.append(("alias" if kind == "broadcast" else kind,
                           e.primitive.rules.kernel_op, params, tuple(args),
                           np.dtype(out.dtype), space))
        self.node_of[e.outputs[0]] = len(self.nodes) - 1
        self.mems.append((e.primitive, dict(e.params), tuple(margs)))
        return len(self.nodes) - 1
