"""Reductions over static axes: sum, prod, max, min, and, or, argmax, argmin."""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, DTypeError


def _reduced_aval(name, x, axes, dtype=None):
    for a in axes:
        if not 0 <= a < x.ndim:
            raise ArgumentError(f"{name}: axis {a} is out of range for an array of shape "
                                f"{x.shape}")
    shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return ShapedArray(shape, dtype or x.dtype, x.weak_type)


def _batch_reduce(p):
    def rule(args, dims, *, axes, **params):
        from spmd.compiler.transforms.batching import move_to_front

        x = move_to_front(args[0], dims[0])
        return bind(p, x, axes=tuple(a + 1 for a in axes), **params), 0

    p.def_batch(rule)
    return p


def _norm_axes(axes):
    return tuple(sorted(int(a) for a in axes))


# --------------------------------------------------------------- reduce_sum

reduce_sum_p = _batch_reduce(Primitive("reduce_sum", traits=("sum",), linear=True))
reduce_sum_p.unreduced = "keep"


# A float sum over one block of adjacent axes runs on numpy as a product with a vector
# of ones, one BLAS call: numpy's own sum over a short last axis sets up its loop
# again for every row (measured on 2 cores: the (2048, 64) rows of a layer norm 58 us,
# as a matrix-vector product 9 us; a bias gradient's sum of 2048 rows of 256, 70
# against 20 us).  Only blocks of at most BLAS_SUM_MAX elements: numpy sums a long
# contiguous axis pairwise (its error grows as log n), a BLAS dot in a few running
# partial sums (as n / lanes); over leading axes both add row by row.
BLAS_SUM_MAX = 1 << 12
_BLAS_SUM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ones_cache: dict = {}


def _sum_plan(shape, dtype, axes):
    """``(pre, m, post)`` when summing ``axes`` of an array of ``shape`` is a product
    with ones on its ``(pre, m, post)`` reshape, else None."""
    if np.dtype(dtype) not in _BLAS_SUM_DTYPES or not axes or \
            tuple(axes) != tuple(range(axes[0], axes[-1] + 1)):
        return None
    # (math.prod: exact on ints and cheap, as this runs on every eager sum.)
    pre = math.prod(shape[:axes[0]])
    m = math.prod(shape[axes[0]:axes[-1] + 1])
    post = math.prod(shape[axes[-1] + 1:])
    if not 1 < m <= BLAS_SUM_MAX or pre * post == 0:
        return None
    return pre, m, post


def _ones(m: int, dtype):
    key = (m, dtype)
    v = _ones_cache.get(key)
    if v is None:
        v = _ones_cache[key] = np.ones(m, dtype)
        v.flags.writeable = False
    return v


def _blas_sum(x, axes, pre, m, post, out=None):
    """``x.sum(axis=axes)`` as a product with ones (see :func:`_sum_plan`); a new
    array, or written into ``out``."""
    out_shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    if out is not None and not out.flags.c_contiguous:
        np.copyto(out, _blas_sum(x, axes, pre, m, post))
        return out
    ones = _ones(m, x.dtype)
    if post == 1:
        into = None if out is None else out.reshape(pre)
        r = np.matmul(np.reshape(x, (pre, m)), ones, out=into)
    else:
        into = None if out is None else out.reshape(pre, post)
        r = np.matmul(ones, np.reshape(x, (pre, m, post)), out=into)
    return r.reshape(out_shape) if out is None else out


def sum_numpy(x, axes):
    """reduce_sum on numpy: a product with ones where :func:`_sum_plan` allows it,
    else ``np.sum`` (in ``x``'s dtype: numpy would sum int32 into int64)."""
    plan = _sum_plan(x.shape, x.dtype, axes)
    if plan is None:
        return np.sum(x, axis=axes, dtype=x.dtype)
    return _blas_sum(x, axes, *plan)


@reduce_sum_p.def_impl
def _sum_impl(xp, x, *, axes):
    if xp is np:
        return sum_numpy(x, axes)
    return xp.sum(x, axis=axes, dtype=x.dtype)


def _sum_emit(names, avals, *, axes, xp=np, out=None):
    (x,) = avals
    plan = _sum_plan(x.shape, x.dtype, axes) if xp is np else None
    if plan is not None:
        return f"_blas_sum({names[0]}, {axes!r}, {', '.join(map(str, plan))})"
    # numpy sums int32 into int64 unless told the dtype.
    return f"xp.sum({names[0]}, axis={axes!r}, dtype={names[0]}.dtype)"


reduce_sum_p.rules.emit_avals = _sum_emit
reduce_sum_p.rules.emit_globals = {"_blas_sum": _blas_sum}
reduce_sum_p.def_abstract_eval(lambda x, *, axes: _reduced_aval("reduce_sum", x, axes))


def reduce_sum(x, axes):
    axes = _norm_axes(axes)
    if not axes:
        return x
    return bind(reduce_sum_p, x, axes=axes)


@reduce_sum_p.def_jvp
def _sum_jvp(primals, tangents, *, axes):
    out = reduce_sum(primals[0], axes)
    t = tangents[0]
    if isinstance(t, Zero):
        return out, Zero(get_aval(out).update(weak_type=False, dtype=t.aval.dtype))
    return out, reduce_sum(t, axes)


@reduce_sum_p.def_transpose
def _sum_transpose(ct, x, *, axes):
    from spmd.compiler import ops

    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    shape = x.aval.shape
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    return [ops.structural.broadcast_in_dim(ct, shape, kept)]


# ------------------------------------------------------- reduce_max / min

def _minmax(name, np_fn):
    p = _batch_reduce(Primitive(name, traits=()))
    p.def_impl(lambda xp, x, *, axes: getattr(xp, np_fn)(x, axis=axes))
    p.def_emit(lambda ins, axes: f"xp.{np_fn}({ins[0]}, axis={axes!r})")
    def aval(x, *, axes):  # complex: lexicographic on (real, imaginary), as JAX and numpy
        _check_dtype(name, x, ("float", "int", "bool", "complex"))
        return _reduced_aval(name, x, axes)

    p.def_abstract_eval(aval)

    @p.def_jvp
    def jvp(primals, tangents, *, axes):
        # The tangent is the mean of the tangents at the positions attaining the
        # extremum (JAX's convention, so ties share the derivative).
        from spmd.compiler import ops

        (x,), (t,) = primals, tangents
        out = bind(p, x, axes=axes)
        if isinstance(t, Zero):
            return out, Zero(get_aval(out).update(weak_type=False, dtype=t.aval.dtype))
        shape = np.shape(x)
        kept = tuple(i for i in range(len(shape)) if i not in axes)
        ew = ops.elementwise
        at_extremum = ew.eq(x, ops.structural.broadcast_in_dim(out, shape, kept))
        mask = ew.convert(at_extremum, t.dtype)
        count = reduce_sum(mask, axes)
        return out, ew.div(reduce_sum(ew.mul(t, mask), axes), count)

    return p


reduce_max_p = _minmax("reduce_max", "max")
reduce_min_p = _minmax("reduce_min", "min")


def reduce_max(x, axes):
    axes = _norm_axes(axes)
    return bind(reduce_max_p, x, axes=axes) if axes else x


def reduce_min(x, axes):
    axes = _norm_axes(axes)
    return bind(reduce_min_p, x, axes=axes) if axes else x


def _zero_tangent(out):
    """The symbolic zero tangent of a primitive's output ``out``."""
    return Zero(tangent_aval(get_aval(out)))


def _scalar(value, dtype):
    """A scalar constant of ``dtype`` (a literal in traced programs)."""
    return np.array(value, dtype=dtype)[()]


def _check_dtype(name, x, kinds):
    ok = {"float": dtypes.is_float, "int": dtypes.is_int, "bool": dtypes.is_bool,
          "complex": dtypes.is_complex}
    if not any(ok[k](x.dtype) for k in kinds):
        raise DTypeError(f"{name}: operand dtype {x.dtype} is not supported (expects "
                         f"{' or '.join(kinds)}); convert with .astype first")


# -------------------------------------------------------------- reduce_prod

reduce_prod_p = _batch_reduce(Primitive("reduce_prod", traits=()))
reduce_prod_p.def_impl(lambda xp, x, *, axes: xp.prod(x, axis=axes, dtype=x.dtype))
reduce_prod_p.def_emit(lambda ins, axes: f"xp.prod({ins[0]}, axis={axes!r}, dtype={ins[0]}.dtype)")


@reduce_prod_p.def_abstract_eval
def _prod_aval(x, *, axes):
    _check_dtype("reduce_prod", x, ("float", "int", "complex"))  # the jvp is holomorphic
    return _reduced_aval("reduce_prod", x, axes)


def reduce_prod(x, axes):
    """The product of ``x`` over ``axes`` (lax level: no dtype promotion)."""
    axes = _norm_axes(axes)
    return bind(reduce_prod_p, x, axes=axes) if axes else x


@reduce_prod_p.def_jvp
def _prod_jvp(primals, tangents, *, axes):
    (x,), (t,) = primals, tangents
    out = reduce_prod(x, axes)
    if isinstance(t, Zero):
        return out, _zero_tangent(out)
    return out, _prod_tree_tangent(x, t, axes)


def _prod_tree_tangent(x, t, axes):
    """The tangent of ``prod(x, axes)`` by a pairwise product tree (as JAX).

    Each level multiplies the two halves with the product rule, so zeros in
    ``x`` get exact derivatives of every order (no division by ``x``).
    """
    from spmd.compiler import ops

    shape = np.shape(x)
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    kept_shape = tuple(shape[i] for i in kept)
    n = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    tdt = get_aval(t).dtype
    if n == 0:
        return ops.structural.zeros(kept_shape, tdt)
    x = ops.structural.reshape(ops.structural.transpose(x, tuple(axes) + kept), (n,) + kept_shape)
    t = ops.structural.reshape(ops.structural.transpose(t, tuple(axes) + kept), (n,) + kept_shape)
    rest = ((0, 0, 0),) * len(kept)
    while n > 1:
        n1 = (n + 1) // 2
        a, b = ops.slicing.slice_in_dim(x, 0, n1), ops.slicing.slice_in_dim(x, n1, n)
        ta, tb = ops.slicing.slice_in_dim(t, 0, n1), ops.slicing.slice_in_dim(t, n1, n)
        if n - n1 != n1:  # odd length: the second half gets a neutral 1 (tangent 0)
            b = ops.slicing.pad(b, _scalar(1, get_aval(x).dtype), ((0, 1, 0),) + rest)
            tb = ops.slicing.pad(tb, _scalar(0, tdt), ((0, 1, 0),) + rest)
        ew = ops.elementwise
        x, t = ew.mul(a, b), ew.add(ew.mul(ta, b), ew.mul(a, tb))
        n = n1
    return ops.structural.reshape(t, kept_shape)


# ------------------------------------------------------ reduce_and / or

def _bool_reduce(name, np_fn):
    p = _batch_reduce(Primitive(name, traits=()))
    p.def_impl(lambda xp, x, *, axes: getattr(xp, np_fn)(x, axis=axes))
    p.def_emit(lambda ins, axes: f"xp.{np_fn}({ins[0]}, axis={axes!r})")

    @p.def_abstract_eval
    def aval(x, *, axes):
        _check_dtype(name, x, ("bool",))
        return _reduced_aval(name, x, axes)

    @p.def_jvp
    def jvp(primals, tangents, *, axes):
        out = bind(p, *primals, axes=axes)
        return out, _zero_tangent(out)

    return p


reduce_and_p = _bool_reduce("reduce_and", "all")
reduce_or_p = _bool_reduce("reduce_or", "any")


def reduce_and(x, axes):
    """Logical and of a bool array over ``axes`` (True over an empty axis)."""
    axes = _norm_axes(axes)
    return bind(reduce_and_p, x, axes=axes) if axes else x


def reduce_or(x, axes):
    """Logical or of a bool array over ``axes`` (False over an empty axis)."""
    axes = _norm_axes(axes)
    return bind(reduce_or_p, x, axes=axes) if axes else x


# --------------------------------------------------------- argmax / argmin

def _arg_reduce(name, np_fn):
    p = _batch_reduce(Primitive(name, traits=()))

    @p.def_impl
    def impl(xp, x, *, axes, index_dtype):
        # numpy's argmax/argmin: the first occurrence wins, and a NaN counts as
        # the extremum (as in JAX).
        return getattr(xp, np_fn)(x, axis=axes[0]).astype(index_dtype, copy=False)

    p.def_emit(lambda ins, axes, index_dtype:
               f"xp.{np_fn}({ins[0]}, axis={axes[0]}).astype(xp.{index_dtype.name})")

    @p.def_abstract_eval
    def aval(x, *, axes, index_dtype):
        if len(axes) != 1:
            raise ArgumentError(f"{name}: needs exactly one axis, got axes={axes}")
        _check_dtype(name, x, ("float", "int", "bool", "complex"))  # complex: lexicographic
        if not dtypes.is_int(index_dtype):
            raise DTypeError(f"{name}: index_dtype must be an integer dtype, got {index_dtype}")
        out = _reduced_aval(name, x, axes, index_dtype)
        if x.shape[axes[0]] == 0:
            raise ArgumentError(f"{name}: axis {axes[0]} of the operand of shape {x.shape} is "
                                "empty; an empty sequence has no " + np_fn)
        return out.update(weak_type=False)

    @p.def_jvp
    def jvp(primals, tangents, **params):
        out = bind(p, *primals, **params)
        return out, _zero_tangent(out)

    return p


argmax_p = _arg_reduce("argmax", "argmax")
argmin_p = _arg_reduce("argmin", "argmin")


def argmax(operand, axis: int, index_dtype=np.int32):
    """Index of the maximum along ``axis`` (first occurrence), as ``lax.argmax``."""
    nd = len(np.shape(operand))
    a = int(axis) % nd if nd else int(axis)
    return bind(argmax_p, operand, axes=(a,), index_dtype=np.dtype(index_dtype))


def argmin(operand, axis: int, index_dtype=np.int32):
    """Index of the minimum along ``axis`` (first occurrence), as ``lax.argmin``."""
    nd = len(np.shape(operand))
    a = int(axis) % nd if nd else int(axis)
    return bind(argmin_p, operand, axes=(a,), index_dtype=np.dtype(index_dtype))


# ------------------------------------------------ cumulative reductions
#
# cumsum / cumprod / cummax / cummin(x, axis, reverse): the running reduction
# along one axis (from the end when ``reverse``).  cumsum is linear (its
# transpose is the cumsum the other way); the others differentiate through a
# parallel prefix scan of (value, tangent) pairs, as JAX's rules do.

def _cumulative(name, np_expr, kinds, emit_expr):
    p = Primitive(name, traits=())

    @p.def_impl
    def impl(xp, x, *, axis, reverse):
        if reverse:
            x = xp.flip(x, axis)
        out = np_expr(xp, x, axis)
        return xp.flip(out, axis) if reverse else out

    # The common forward case is one inline numpy call.
    p.def_emit(lambda ins, axis, reverse: None if reverse else emit_expr(ins[0], axis))

    @p.def_abstract_eval
    def aval(x, *, axis, reverse):
        _check_dtype(name, x, kinds)
        if not 0 <= axis < x.ndim:
            raise ArgumentError(f"{name}: axis {axis} is out of range for an operand of shape "
                                f"{x.shape}")
        return ShapedArray(x.shape, x.dtype, x.weak_type)

    @p.def_batch
    def batch(args, dims, *, axis, reverse):
        (x,), (d,) = args, dims
        # The batch axis stays where it is; the scanned axis moves past it.
        return bind(p, x, axis=axis + (d <= axis), reverse=reverse), d

    return p


cumsum_p = _cumulative("cumsum", lambda xp, x, a: xp.cumsum(x, axis=a, dtype=x.dtype),
                       ("float", "int", "complex"), lambda x, a: f"xp.cumsum({x}, axis={a}, dtype={x}.dtype)")
cumprod_p = _cumulative("cumprod", lambda xp, x, a: xp.cumprod(x, axis=a, dtype=x.dtype),
                        ("float", "int", "complex"),
                        lambda x, a: f"xp.cumprod({x}, axis={a}, dtype={x}.dtype)")


def _running(xp, x, axis, fn):
    """``fn.accumulate(x, axis)`` by doubling (Hillis-Steele), for array modules whose
    ufuncs lack ``accumulate`` (CuPy has it for add and multiply only): log2(n) rounds of
    ``out[i] = fn(out[i], out[i - k])``.  NaNs propagate as in numpy's accumulate."""
    n = x.shape[axis]
    out, k = x, 1
    while k < n:
        head, hi, lo = ([slice(None)] * x.ndim for _ in range(3))
        head[axis], hi[axis], lo[axis] = slice(None, k), slice(k, None), slice(None, n - k)
        out = xp.concatenate([out[tuple(head)], fn(out[tuple(hi)], out[tuple(lo)])], axis=axis)
        k *= 2
    return out


cummax_p = _cumulative("cummax", lambda xp, x, a: xp.maximum.accumulate(x, axis=a)
                       if xp is np else _running(xp, x, a, xp.maximum),
                       ("float", "int", "bool"),
                       lambda x, a: f"xp.maximum.accumulate({x}, axis={a})")
cummin_p = _cumulative("cummin", lambda xp, x, a: xp.minimum.accumulate(x, axis=a)
                       if xp is np else _running(xp, x, a, xp.minimum),
                       ("float", "int", "bool"),
                       lambda x, a: f"xp.minimum.accumulate({x}, axis={a})")
# Their inline code is numpy's; other array modules call the impl (spmd.compiler.engine.codegen).
cummax_p.rules.emit_numpy_only = cummin_p.rules.emit_numpy_only = True


def _cum_binder(p):
    def f(operand, axis: int = 0, reverse: bool = False):
        nd = len(np.shape(operand))
        a = int(axis)
        if nd and -nd <= a < nd:
            a %= nd
        return bind(p, operand, axis=a, reverse=bool(reverse))

    f.__name__ = p.name
    f.__doc__ = (f"``{p.name}`` of ``operand`` along ``axis`` (from the end when ``reverse``), "
                 f"as ``lax.{p.name}``.\n\n    >>> {p.name}(np.arange(1, 4), 0)  # doctest: +SKIP")
    return f


cumsum = _cum_binder(cumsum_p)
cumprod = _cum_binder(cumprod_p)
cummax = _cum_binder(cummax_p)
cummin = _cum_binder(cummin_p)

cumsum_p.linear = True


@cumsum_p.def_jvp
def _cumsum_jvp(primals, tangents, *, axis, reverse):
    out = bind(cumsum_p, primals[0], axis=axis, reverse=reverse)
    t = tangents[0]
    if isinstance(t, Zero):
        return out, _zero_tangent(out)
    return out, bind(cumsum_p, t, axis=axis, reverse=reverse)


@cumsum_p.def_transpose
def _cumsum_transpose(ct, x, *, axis, reverse):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    # Each input feeds every later output: the cotangent sums the other way.
    return [bind(cumsum_p, ct, axis=axis, reverse=not reverse)]


def _scan_jvp(p, combine_prim):
    """jvp of a cumulative op: a prefix scan of (value, tangent) pairs combined
    with ``combine_prim``'s own jvp rule (so ties and zeros follow its rules)."""
    def rule(primals, tangents, *, axis, reverse):
        from spmd.compiler import ops

        (x,), (t,) = primals, tangents
        out = bind(p, x, axis=axis, reverse=reverse)
        if isinstance(t, Zero):
            return out, _zero_tangent(out)

        def combine(a, b):
            return list(combine_prim.jvp((a[0], b[0]), (a[1], b[1])))

        if reverse:
            x, t = ops.slicing.rev(x, (axis,)), ops.slicing.rev(t, (axis,))
        _, tout = associative_scan(combine, [x, t], axis)
        return out, ops.slicing.rev(tout, (axis,)) if reverse else tout

    p.def_jvp(rule)


def _register_scan_jvps():
    from spmd.compiler import ops

    _scan_jvp(cumprod_p, ops.elementwise.mul_p)
    _scan_jvp(cummax_p, ops.elementwise.max_p)
    _scan_jvp(cummin_p, ops.elementwise.min_p)


_register_scan_jvps()


def associative_scan(combine, elems, axis: int):
    """Inclusive prefix scan of the arrays ``elems`` along ``axis`` (Blelloch-style).

    ``combine(a, b)`` maps two lists of arrays (earlier, later) to one list; it
    must be associative.  O(n) work in O(log n) levels of slices (JAX's
    ``lax.associative_scan``).

    >>> associative_scan(lambda a, b: [add(a[0], b[0])], [x], 0)  # doctest: +SKIP
    """
    from spmd.compiler import ops

    n = np.shape(elems[0])[axis]
    if n < 2:
        return list(elems)

    def sl(e, start, limit, stride=1):
        return ops.slicing.slice_in_dim(e, start, limit, stride, axis)

    # Combine adjacent pairs, scan those recursively: that gives the odd positions.
    odd = associative_scan(combine, combine([sl(e, 0, n - 1, 2) for e in elems],
                                            [sl(e, 1, n, 2) for e in elems]), axis)
    # Even positions (after the first) add one more element to an odd result.
    head = odd if n % 2 else [sl(o, 0, np.shape(o)[axis] - 1) for o in odd]
    even = combine(head, [sl(e, 2, n, 2) for e in elems])
    even = [ops.slicing.concatenate([sl(e, 0, 1), r], axis) for e, r in zip(elems, even)]
    return [_interleave(a, b, axis) for a, b in zip(even, odd)]


def _interleave(a, b, axis):
    """``a[0], b[0], a[1], b[1], ...`` along ``axis`` (``a`` may be one longer)."""
    from spmd.compiler import ops

    na, nb = np.shape(a)[axis], np.shape(b)[axis]
    nd = len(np.shape(a))
    cfg_a = [(0, 0, 0)] * nd
    cfg_b = [(0, 0, 0)] * nd
    cfg_a[axis] = (0, 1 if na == nb else 0, 1)
    cfg_b[axis] = (1, 0 if na == nb else 1, 1)
    dt = get_aval(a).dtype
    # Adding a zero is exact, so interleaving by padding and adding loses nothing.
    op = ops.elementwise.bitwise_or if dtypes.is_bool(dt) else ops.elementwise.add
    pad = ops.slicing.pad
    return op(pad(a, _scalar(0, dt), tuple(cfg_a)), pad(b, _scalar(0, dt), tuple(cfg_b)))
