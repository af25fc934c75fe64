"""Reductions over static axes: sum, max, min, and, or, argmax, argmin.

The product and the cumulative reductions, whose derivatives take slices of the
operand, are :mod:`spmd.compiler.ops.cumulative`'s."""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, DTypeError
from spmd.compiler import ops  # sibling families, read at call time (rules build each other's ops)
from spmd.compiler.transforms.batching import move_to_front


def _reduced_aval(name, x, axes, dtype=None):
    for a in axes:
        if not 0 <= a < x.ndim:
            raise ArgumentError(f"{name}: axis {a} is out of range for an array of shape "
                                f"{x.shape}")
    shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return ShapedArray(shape, dtype or x.dtype, x.weak_type)


def _batch_reduce(p):
    def rule(args, dims, *, axes, **params):
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


def narrow_sum(xp, x, axes):
    """reduce_sum of a narrow float (bfloat16, float8): accumulated in float32 and
    rounded once at the end, as JAX's ``sum`` does (ml_dtypes' own ``np.sum`` adds in
    bfloat16, rounding at every step: a thousand ones sum to 256)."""
    return xp.sum(x, axis=axes, dtype=np.float32).astype(x.dtype)


def sum_numpy(x, axes):
    """reduce_sum on numpy: a product with ones where :func:`_sum_plan` allows it,
    else ``np.sum`` (in ``x``'s dtype: numpy would sum int32 into int64)."""
    if dtypes.is_narrow_float(x.dtype):
        return narrow_sum(np, x, axes)
    plan = _sum_plan(x.shape, x.dtype, axes)
    if plan is None:
        return np.sum(x, axis=axes, dtype=x.dtype)
    return _blas_sum(x, axes, *plan)


@reduce_sum_p.def_impl
def _sum_impl(xp, x, *, axes):
    if xp is np:
        return sum_numpy(x, axes)
    if dtypes.is_narrow_float(x.dtype):
        return narrow_sum(xp, x, axes)
    return xp.sum(x, axis=axes, dtype=x.dtype)


def _sum_emit(names, avals, *, axes, xp=np, out=None):
    (x,) = avals
    if dtypes.is_narrow_float(x.dtype):
        return None  # the impl's float32 sum (the emitted xp.sum may be given out=)
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
