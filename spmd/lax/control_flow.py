"""Structured control flow: ``cond``, ``switch``, ``fori_loop``, ``while_loop``, ``scan``.

JAX's signatures and semantics.  Each wrapper flattens its pytrees, traces the
user's functions into programs once (values they close over become operands),
checks that branch outputs and loop carries keep their types, and binds one
primitive (``spmd.compiler.ops.control_cond`` / ``control_scan`` / ``control_while``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from spmd import tree_util
from spmd.collectives.api import preduced_traced, pvary_traced
from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.ir import ClosedProgram, Program, Var
from spmd.compiler.core.jit import flatten_outputs
from spmd.compiler.ops.control_cond import cond_bind
from spmd.compiler.ops.control_programs import same_type
from spmd.compiler.ops.control_scan import scan_bind
from spmd.compiler.ops.control_while import while_bind
from spmd.compiler.ops.elementwise import add, convert, lt, max as lax_max, min as lax_min, ne
from spmd.compiler.ops.slicing import concatenate
from spmd.compiler.ops.structural import reshape
from spmd.compiler.core.trace import Tracer, axes_in_scope, get_aval, trace_to_program
from spmd.errors import ArgumentError, DTypeError, ProgramTypeError, ShapeError
from spmd.lax import _python_control as _eager
from spmd.numpy._util import promote_dtypes, to_array

__all__ = ["cond", "switch", "fori_loop", "while_loop", "scan", "map"]


# ----------------------------------------------------------------- helpers

def _fname(f) -> str:
    return getattr(f, "__name__", type(f).__name__)


def _as_value(x, fname: str, what: str):
    """An operand as a bindable value (Python scalars keep their weak type)."""
    if isinstance(x, (Tracer, Array, np.ndarray, np.generic)):
        get_aval(x)  # rejects unsupported dtypes with a clear error
        return x
    if isinstance(x, (bool, int, float, complex)):
        return Array(np.asarray(x, dtype=get_aval(x).dtype), get_aval(x))
    try:
        return to_array(x, fname=fname)
    except Exception as e:
        raise ArgumentError(f"{fname}: {what} must be an array or a pytree of arrays; got a "
                            f"{type(x).__name__} ({x!r:.60})") from e


def _flatten(tree, fname: str, what: str):
    paths_leaves, treedef = tree_util.tree_flatten_with_path(tree)
    leaves = [_as_value(leaf, fname, f"{what}{tree_util.keystr(p)}") for p, leaf in paths_leaves]
    return leaves, treedef, [p for p, _ in paths_leaves]


def _hoist(closed: ClosedProgram):
    """Turn a traced program's constants into leading inputs: ``(program, values)``.

    The values may be tracers of enclosing transformations; as operands they
    are seen by those transformations (a constant parameter would hide them).
    """
    return ClosedProgram(closed.program, []), list(closed.consts)


def _fmt(aval: ShapedArray) -> str:
    return aval.str_short() + (" (weakly typed)" if aval.weak_type else "")


def _conform(outs, targets):
    """Convert traced outputs to the weak types of ``targets`` (same shape and dtype),
    and mark them varying (reduced) along the axes of ``targets`` they do not vary
    along (are invariant along)."""
    out = []
    for o, t in zip(outs, targets):
        a = get_aval(o)
        if (a.dtype, a.weak_type) != (t.dtype, t.weak_type):
            o = convert(o, t.dtype, t.weak_type)
        out.append(_reduced_to(_pvary_to(o, t.vma), t.reduced))
    return out


def _reduced_to(x, reduced):
    """``x`` typed reduced along the axes of ``reduced`` it is invariant along (an
    explicit ``pcast(to='reduced')``, whose transpose sums the cotangent's summands)."""
    a = get_aval(x)
    missing = frozenset(reduced) - a.reduced - a.vma
    return preduced_traced(x, tuple(sorted(missing))) if missing else x


def _pvary_to(x, vma):
    """``x`` typed as varying along ``vma`` (an explicit ``pvary``, whose transpose is
    the ``psum`` reverse mode needs; JEP 17111).  Only values inside a ``shard_map``
    body traced with varying-axes types have a non-empty ``vma``."""
    missing = frozenset(vma) - get_aval(x).vma
    if missing:
        return pvary_traced(x, tuple(sorted(missing)))
    return x


# ---------------------------------------------------------------- branches

def _trace_branch(fun, in_tree, in_avals, fname, targets=None):
    box: list = []

    def flat(*args):
        outs = fun(*tree_util.tree_unflatten(in_tree, list(args)))
        leaves, out_tree = flatten_outputs(outs, f"{fname}'s branch {_fname(fun)}")
        paths = [p for p, _ in tree_util.tree_flatten_with_path(outs)[0]]
        box[:] = [out_tree, paths]
        return _conform(leaves, targets) if targets is not None else leaves

    closed = trace_to_program(flat, in_avals)
    return closed, box[0], box[1]


def _trace_branches(fname, funs, names, operands, index_vma=frozenset()):
    """Trace every branch on the operands; all must return the same types.

    Inside a shard_map body the outputs vary where any branch's do, and along
    the axes the index varies along: each branch marks its outputs so
    (``pvary``), so that the branches agree on the types of the results; with a
    varying index the operands are marked varying along its axes first.
    """
    leaves, in_tree, _ = _flatten(tuple(operands), fname, "operands")
    if index_vma:
        # Devices that may take different branches: the operands vary along the
        # index's axes before the branch (so reverse mode sums their cotangents there).
        leaves = [_pvary_to(x, get_aval(x).vma | index_vma) for x in leaves]
    in_avals = [get_aval(x) for x in leaves]
    traced = [_trace_branch(f, in_tree, in_avals, fname) for f in funs]
    tree0, paths0 = traced[0][1], traced[0][2]
    avals0 = traced[0][0].out_avals
    for (closed, tree, _), name in zip(traced[1:], names[1:]):
        if tree != tree0:
            raise ProgramTypeError(
                f"{fname}: {names[0]} and {name} must return the same pytree structure, but "
                f"{names[0]} returns {tree0} and {name} returns {tree}")
        for path, a, b in zip(paths0, avals0, closed.out_avals):
            if not same_type(a, b):
                raise ProgramTypeError(
                    f"{fname}: {names[0]} and {name} must return the same types, but at "
                    f"output{tree_util.keystr(path)} {names[0]} returns {_fmt(a)} and {name} "
                    f"returns {_fmt(b)}; make them agree (e.g. .astype or broadcast_to)")
    # Types that differ only in weak typing join to the strong type (as in JAX); the
    # manual-axes types join to the widest (varying over reduced over invariant).
    joined = []
    for k, a in enumerate(avals0):
        outs = [t[0].out_avals[k] for t in traced]
        if any(o.unreduced != a.unreduced for o in outs):
            raise ProgramTypeError(
                f"{fname}: the branches' results at output{tree_util.keystr(paths0[k])} "
                f"differ in their unreduced axes ({', '.join(_fmt(o) for o in outs)}); sum them "
                "first (lax.psum)")
        vma = index_vma.union(*(o.vma for o in outs))
        joined.append(a.update(weak_type=all(o.weak_type for o in outs), vma=vma,
                               reduced=frozenset().union(*(o.reduced for o in outs)) - vma))

    def kind(a):
        return (a.weak_type, a.vma, a.reduced)
    closed_list = []
    for (closed, _, _), f in zip(traced, funs):
        if [kind(a) for a in closed.out_avals] != [kind(a) for a in joined]:
            closed = _trace_branch(f, in_tree, in_avals, fname, joined)[0]
        closed_list.append(closed)
    return closed_list, leaves, tree0


def _bind_cond(index, closed_list, leaves, out_tree):
    """One cond over branches whose constants are hoisted into shared operands."""
    hoisted = [_hoist(c) for c in closed_list]
    all_consts = [v for _, vals in hoisted for v in vals]
    branches, offset = [], 0
    for prog, vals in hoisted:
        p = prog.program
        n = len(vals)
        # Every branch takes every branch's constants; it reads only its own.
        before = [Var(get_aval(v)) for v in all_consts[:offset]]
        after = [Var(get_aval(v)) for v in all_consts[offset + n:]]
        in_vars = before + p.in_vars[:n] + after + p.in_vars[n:]
        branches.append(ClosedProgram(Program(in_vars, p.eqns, p.out_atoms)))
        offset += n
    outs = cond_bind(index, *all_consts, *leaves, branches=branches)
    return tree_util.tree_unflatten(out_tree, outs)


def _check_scalar(fname, what, x):
    aval = get_aval(x)
    if aval.shape != ():
        raise ShapeError(f"{fname}: {what} must be a scalar, got an array of shape {aval.shape}; "
                         "reduce it first (e.g. .any(), .all()) or use snp.where for "
                         "elementwise choices")
    return aval


def cond(pred, true_fun: Callable, false_fun: Callable, *operands):
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``, traced.

    Both branches are traced and must return the same pytree of types; under
    ``vmap`` with a batched ``pred`` both run and the results are selected.

    >>> cond(x > 0, lambda x: x * 2, lambda x: -x, x)  # doctest: +SKIP
    """
    if _eager.active() and callable(true_fun) and callable(false_fun) and pred is not None:
        return _eager.cond(pred, true_fun, false_fun, *operands)
    if pred is None:
        raise ArgumentError("cond: the predicate is None; pass a boolean scalar")
    if isinstance(pred, (list, tuple)):
        raise ShapeError(f"cond: the predicate must be a scalar, got a {type(pred).__name__}")
    pred = _as_value(pred, "cond", "the predicate")
    aval = _check_scalar("cond", "the predicate", pred)
    if not (dtypes.is_bool(aval.dtype) or dtypes.is_int(aval.dtype)
            or dtypes.is_float(aval.dtype)):
        raise DTypeError(f"cond: the predicate must be a boolean or number, got dtype "
                         f"{aval.dtype}")
    for f, name in ((true_fun, "true_fun"), (false_fun, "false_fun")):
        if not callable(f):
            raise ArgumentError(f"cond: {name} must be callable, got {type(f).__name__}")
    if not dtypes.is_bool(aval.dtype):
        pred = ne(pred, np.zeros((), aval.dtype))
    index = convert(pred, np.dtype(np.int32))
    closed, leaves, out_tree = _trace_branches("cond", [true_fun, false_fun],
                                               ["true_fun", "false_fun"], operands,
                                               get_aval(index).vma)
    return _bind_cond(index, closed[::-1], leaves, out_tree)  # index 0 is false_fun


def switch(index, branches: Sequence[Callable], *operands):
    """``branches[clamp(index, 0, len(branches) - 1)](*operands)``, traced.

    >>> switch(i, [lambda x: x, lambda x: x * 2, lambda x: -x], x)  # doctest: +SKIP
    """
    if _eager.active() and not callable(branches) and len(branches) > 0:
        return _eager.switch(index, list(branches), *operands)
    branches = list(branches) if not callable(branches) else None
    if branches is None:
        raise ArgumentError("switch: branches must be a sequence of functions, got a function; "
                            "use cond for a single predicate")
    if not branches:
        raise ArgumentError("switch: branches is empty; pass at least one function")
    for i, f in enumerate(branches):
        if not callable(f):
            raise ArgumentError(f"switch: branches[{i}] must be callable, got "
                                f"{type(f).__name__}")
    index = _as_value(index, "switch", "the index")
    aval = _check_scalar("switch", "the index", index)
    if not dtypes.is_int(aval.dtype):
        raise DTypeError(f"switch: the index must be an integer scalar, got dtype {aval.dtype}; "
                         "convert it with .astype(int) (use cond for a boolean predicate)")
    index = convert(index, np.dtype(np.int32))
    hi = len(branches) - 1
    index = lax_min(lax_max(index, np.zeros((), np.int32)), np.full((), hi, np.int32))
    if len(branches) == 1:
        return branches[0](*operands)
    closed, leaves, out_tree = _trace_branches(
        "switch", branches, [f"branches[{i}]" for i in range(len(branches))], operands,
        get_aval(index).vma)
    return _bind_cond(index, closed, leaves, out_tree)


# ------------------------------------------------------------------- loops

def _carry_error(fname, path, a, b, where="the body function"):
    return ProgramTypeError(
        f"{fname}: {where} must return a carry of the same type as its input, but at "
        f"carry{tree_util.keystr(path)} the input is {_fmt(a)} and the output is {_fmt(b)}. "
        "A loop carry keeps its shape and dtype across iterations: convert with .astype, or "
        "give the initial value the type the body produces")


def _trace_carry_fun(fname, make_flat, carry_leaves, carry_tree, carry_paths, extra_avals,
                     out_tree_check):
    """Trace a loop body until its carry output types match the carry input types.

    Weakly typed initial carries are promoted to the body's output type (JAX's
    rule), then the body is traced again.  Inside a shard_map body, a carry the
    body makes vary along more mesh axes than its initial value is marked
    varying there (``pvary``) and the body traced again, until the carries'
    types are a fixed point (as in JAX); a body output varying along fewer axes
    than its carry is marked varying inside the body (``_conform``).  Returns
    ``(closed, carry_leaves, extra info)``.
    """
    # Each round widens some carry's type (a weak dtype, or more varying axes).
    for _ in range(3 + len(carry_leaves) * (1 + len(axes_in_scope()))):
        avals = [get_aval(x) for x in carry_leaves]
        closed, info = make_flat(avals, extra_avals)
        out_tree, out_carry_avals = out_tree_check(info)
        if out_tree != carry_tree:
            raise ProgramTypeError(
                f"{fname}: the body function must return a carry with the same pytree "
                f"structure as the initial carry: the input is {carry_tree} but the output "
                f"is {out_tree}")
        new_leaves, changed = [], False
        for leaf, path, a, b in zip(carry_leaves, carry_paths, avals, out_carry_avals):
            if a.shape != b.shape:
                raise _carry_error(fname, path, a, b)
            if a.dtype != b.dtype or (a.weak_type and not b.weak_type):
                if not a.weak_type:
                    raise _carry_error(fname, path, a, b)
                dt, weak = dtypes.result_type((a.dtype, True), (b.dtype, b.weak_type))
                if dt != b.dtype:
                    raise _carry_error(fname, path, a, b)
                leaf, changed = convert(leaf, dt, weak), True
            if b.vma - a.vma:
                leaf, changed = _pvary_to(leaf, a.vma | b.vma), True
            if b.unreduced != a.unreduced:
                raise _carry_error(fname, path, a, b)
            if b.reduced - a.reduced - get_aval(leaf).vma:
                # The body makes the carry reduced (it meets a reduced value): so is
                # its initial value, and the body is traced again.
                leaf, changed = _reduced_to(leaf, b.reduced), True
            new_leaves.append(leaf)
        carry_leaves = new_leaves
        if not changed:
            return closed, carry_leaves, info
    raise _carry_error(fname, carry_paths[0], avals[0], out_carry_avals[0])  # pragma: no cover


def scan(f: Callable, init, xs=None, length: int | None = None, reverse: bool = False,
         unroll: int | bool = 1):
    """Loop ``carry, y = f(carry, x)`` over the leading axis of ``xs``; stack the ys.

    Returns ``(final carry, stacked ys)``.  ``xs`` may be a pytree, or None with
    ``length`` given; ``reverse=True`` runs from the last slice to the first.
    ``unroll`` is accepted for compatibility (each iteration runs compiled code).

    >>> scan(lambda c, x: (c + x, c * x), 0.0, snp.arange(4.0))  # doctest: +SKIP
    """
    if _eager.active() and callable(f) and (xs is not None or length is not None):
        return _eager.scan(f, init, xs, length, reverse)
    if not callable(f):
        raise ArgumentError(f"scan: f must be callable, got {type(f).__name__}")
    if not isinstance(unroll, (bool, int)) or (not isinstance(unroll, bool) and unroll < 1):
        raise ArgumentError(f"scan: unroll must be a positive int or a bool, got {unroll!r}")
    init_leaves, carry_tree, carry_paths = _flatten(init, "scan", "init")
    xs_leaves, xs_tree, xs_paths = _flatten(xs, "scan", "xs")
    length = _scan_length(xs_leaves, xs_paths, length)
    x_avals = [get_aval(x).update(shape=get_aval(x).shape[1:]) for x in xs_leaves]
    fname = f"scan({_fname(f)})"

    def make_flat(carry_avals, x_avals):
        box: list = []

        def flat(*args):
            carry = tree_util.tree_unflatten(carry_tree, list(args[:len(carry_avals)]))
            x = tree_util.tree_unflatten(xs_tree, list(args[len(carry_avals):]))
            out = f(carry, x)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise ProgramTypeError(
                    f"{fname}: the body function must return a pair (new_carry, y); it "
                    f"returned a {type(out).__name__}"
                    + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
            c_leaves, c_tree = flatten_outputs(out[0], f"{fname}'s carry")
            y_leaves, y_tree = flatten_outputs(out[1], f"{fname}'s y")
            c_avals = [get_aval(c) for c in c_leaves]
            box[:] = [c_tree, c_avals, y_tree]
            if c_tree == carry_tree and all(same_type(a, b) for a, b in zip(c_avals, carry_avals)):
                c_leaves = _conform(c_leaves, carry_avals)
            return list(c_leaves) + list(y_leaves)

        closed = trace_to_program(flat, list(carry_avals) + list(x_avals))
        return closed, box

    closed, init_leaves, box = _trace_carry_fun(
        fname, make_flat, init_leaves, carry_tree, carry_paths, x_avals,
        lambda info: (info[0], info[1]))
    y_tree = box[2]
    program, consts = _hoist(closed)
    outs = scan_bind(*consts, *init_leaves, *xs_leaves, program=program,
                     num_consts=len(consts), num_carry=len(init_leaves), length=length,
                     reverse=bool(reverse))
    n = len(init_leaves)
    return (tree_util.tree_unflatten(carry_tree, outs[:n]),
            tree_util.tree_unflatten(y_tree, outs[n:]))


def map(f: Callable, xs, *, batch_size: int | None = None):  # noqa: A001 (JAX's name)
    """``f`` applied to each slice of ``xs`` along its leading axis (a pytree), the
    results stacked: a :func:`scan` without a carry, as ``jax.lax.map``.

    ``batch_size=k`` maps ``vmap(f)`` over batches of ``k`` slices instead (fewer, larger
    steps); when ``k`` does not divide the length, the last ``length % k`` slices are one
    more ``vmap(f)`` call.  The results are the same either way.

    >>> lax.map(lambda x: x * 2, snp.arange(4.0), batch_size=3)  # doctest: +SKIP
    Array([0., 2., 4., 6.], dtype=float32)
    """
    if not callable(f):
        raise ArgumentError(f"map: f must be callable, got {type(f).__name__}")
    if batch_size is None:
        return scan(lambda carry, x: (carry, f(x)), (), xs)[1]
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ArgumentError(f"map: batch_size={batch_size!r} must be a positive int (or None "
                            "for one slice at a time)")
    from spmd.vectorize import vmap  # here: a front end, which runs the installer as it loads

    xs_leaves, _, xs_paths = _flatten(xs, "map", "xs")
    n = _scan_length(xs_leaves, xs_paths, None)
    k = int(batch_size)
    full = n - n % k
    batched = None
    if full:
        def batches(x):
            x = to_array(x)
            return reshape(x[:full], (full // k, k) + tuple(x.shape[1:]))

        ys = scan(lambda carry, x: (carry, vmap(f)(x)), (), tree_util.tree_map(batches, xs))[1]
        batched = tree_util.tree_map(lambda y: reshape(y, (full,) + tuple(y.shape[2:])), ys)
    if full == n:
        return batched
    rest = vmap(f)(tree_util.tree_map(lambda x: to_array(x)[full:], xs))
    if batched is None:
        return rest
    return tree_util.tree_map(lambda a, b: concatenate([a, b], 0), batched, rest)


def _scan_length(xs_leaves, xs_paths, length) -> int:
    lengths = []
    for x, path in zip(xs_leaves, xs_paths):
        shape = get_aval(x).shape
        if not shape:
            raise ShapeError(f"scan: xs{tree_util.keystr(path)} is a scalar; every leaf of xs "
                             "needs a leading axis to scan over")
        lengths.append((shape[0], path))
    if length is not None:
        try:
            length = int(length)
        except Exception as e:
            raise ArgumentError(f"scan: length must be a Python int, got {length!r}") from e
        if length < 0:
            raise ArgumentError(f"scan: length must be >= 0, got {length}")
    for n, path in lengths:
        if length is None:
            length = n
        elif n != length:
            where = ", ".join(f"xs{tree_util.keystr(p)}: {m}" for m, p in lengths)
            raise ShapeError(f"scan: the leaves of xs must share the length of their leading "
                             f"axis (and match length={length} if given); got {where}")
    if length is None:
        raise ArgumentError("scan: xs is None (or has no leaves), so length must be given")
    return length


def while_loop(cond_fun: Callable, body_fun: Callable, init_val):
    """``while cond_fun(val): val = body_fun(val)``, traced; returns the final ``val``.

    Forward-mode differentiable; for reverse mode use ``scan`` or ``fori_loop``
    with static bounds.

    >>> while_loop(lambda c: c < 10, lambda c: c * 2, 1)  # doctest: +SKIP
    """
    if _eager.active() and callable(cond_fun) and callable(body_fun):
        return _eager.while_loop(cond_fun, body_fun, init_val)
    for f, name in ((cond_fun, "cond_fun"), (body_fun, "body_fun")):
        if not callable(f):
            raise ArgumentError(f"while_loop: {name} must be callable, got {type(f).__name__}")
    init_leaves, carry_tree, carry_paths = _flatten(init_val, "while_loop", "init_val")

    def flat_cond(*args):
        out = cond_fun(tree_util.tree_unflatten(carry_tree, list(args)))
        leaves, _ = flatten_outputs(out, f"while_loop's cond_fun {_fname(cond_fun)}")
        avals = [get_aval(x) for x in leaves]
        if len(leaves) != 1 or avals[0].shape != () or not dtypes.is_bool(avals[0].dtype):
            raise DTypeError(f"while_loop: cond_fun must return a boolean scalar, but it "
                             f"returned {[_fmt(a) for a in avals]}; compare (e.g. i < n) or "
                             "reduce (.any()) to get one")
        return leaves

    def make_body(carry_avals, _):
        box: list = []

        def flat(*args):
            out = body_fun(tree_util.tree_unflatten(carry_tree, list(args)))
            leaves, tree = flatten_outputs(out, f"while_loop's body_fun {_fname(body_fun)}")
            avals = [get_aval(x) for x in leaves]
            box[:] = [tree, avals]
            if tree == carry_tree and all(same_type(a, b) for a, b in zip(avals, carry_avals)):
                leaves = _conform(leaves, carry_avals)
            return leaves

        closed = trace_to_program(flat, list(carry_avals))
        # Devices whose predicates differ run different numbers of iterations: the
        # carries vary along the axes the predicate varies along.
        pred = (trace_to_program(flat_cond, list(carry_avals)).out_avals[0].vma
                if axes_in_scope() else frozenset())
        if pred:
            box[1] = [a.update(vma=a.vma | pred) for a in box[1]]
        return closed, box

    body, init_leaves, _ = _trace_carry_fun("while_loop", make_body, init_leaves, carry_tree,
                                            carry_paths, [], lambda info: (info[0], info[1]))
    carry_avals = [get_aval(x) for x in init_leaves]

    cond_closed = trace_to_program(flat_cond, carry_avals)
    cond_prog, cond_consts = _hoist(cond_closed)
    body_prog, body_consts = _hoist(body)
    outs = while_bind(*cond_consts, *body_consts, *init_leaves, cond_program=cond_prog,
                      body_program=body_prog, cond_nconsts=len(cond_consts),
                      body_nconsts=len(body_consts))
    return tree_util.tree_unflatten(carry_tree, outs)


def _static_int(x):
    """``x`` as a Python int when it is a concrete integer, else None."""
    if isinstance(x, Tracer):
        return None
    if isinstance(x, (bool, float)) or not dtypes.is_int(get_aval(_as_value(
            x, "fori_loop", "a bound")).dtype):
        raise DTypeError(f"fori_loop: lower and upper must be integers, got {x!r:.40}")
    return int(x)  # (never np.asarray: CuPy refuses it for a device array)


def fori_loop(lower, upper, body_fun: Callable, init_val, *, unroll=None):
    """``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)``; returns ``val``.

    With concrete (Python or numpy) integer bounds it is a ``scan`` (so reverse
    mode works); with traced bounds a ``while_loop``.

    >>> fori_loop(0, 5, lambda i, x: x + i, 0)  # doctest: +SKIP
    """
    if not callable(body_fun):
        raise ArgumentError(f"fori_loop: body_fun must be callable, got "
                            f"{type(body_fun).__name__}")
    lo_s, hi_s = _static_int(lower), _static_int(upper)
    for b in (lower, upper):
        if isinstance(b, Tracer) and (b.shape != () or not dtypes.is_int(b.dtype)):
            raise DTypeError(f"fori_loop: lower and upper must be integer scalars, got {b.aval}")
    lo, hi = promote_dtypes(lower, upper, fname="fori_loop")
    lo_aval = get_aval(lo)
    one = Array(np.ones((), lo_aval.dtype), ShapedArray((), lo_aval.dtype, lo_aval.weak_type))

    if lo_s is not None and hi_s is not None:
        def scan_body(carry, _):
            i, x = carry
            return (add(i, one), body_fun(i, x)), None

        (_, out), _ = scan(scan_body, (lo, init_val), None, length=max(hi_s - lo_s, 0),
                           unroll=unroll or 1)
        return out

    def cond_fun(carry):
        return lt(carry[0], hi)

    def body(carry):
        i, x = carry
        return add(i, one), body_fun(i, x)

    return while_loop(cond_fun, body, (lo, init_val))[1]
