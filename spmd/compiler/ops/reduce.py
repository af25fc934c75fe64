"""Reductions over static axes: sum, max, min (more are added beside these)."""

from __future__ import annotations

import numpy as np

from spmd.compiler import dtypes
from spmd.compiler.ad_util import Zero, is_undefined
from spmd.compiler.avals import ShapedArray
from spmd.compiler.primitives import Primitive
from spmd.compiler.trace import bind, get_aval
from spmd.errors import ArgumentError


def _reduced_aval(name, x, axes, dtype=None):
    for a in axes:
        if not 0 <= a < x.ndim:
            raise ArgumentError(f"{name}: axis {a} is out of range for an array of shape "
                                f"{x.shape}")
    shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return ShapedArray(shape, dtype or x.dtype, x.weak_type)


def _batch_reduce(p):
    def rule(args, dims, *, axes, **params):
        from spmd.compiler.batching import move_to_front

        x = move_to_front(args[0], dims[0])
        return bind(p, x, axes=tuple(a + 1 for a in axes), **params), 0

    p.def_batch(rule)
    return p


def _norm_axes(axes):
    return tuple(sorted(int(a) for a in axes))


# --------------------------------------------------------------- reduce_sum

reduce_sum_p = _batch_reduce(Primitive("reduce_sum", linear=True))


@reduce_sum_p.def_impl
def _sum_impl(xp, x, *, axes):
    return xp.sum(x, axis=axes, dtype=x.dtype)


# numpy sums int32 into int64 unless told the dtype.
reduce_sum_p.def_emit(lambda ins, axes: f"xp.sum({ins[0]}, axis={axes!r}, dtype={ins[0]}.dtype)")
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
    from spmd.compiler.ops.structural import broadcast_in_dim

    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    shape = x.aval.shape
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    return [broadcast_in_dim(ct, shape, kept)]


# ------------------------------------------------------- reduce_max / min

def _minmax(name, np_fn):
    p = _batch_reduce(Primitive(name))
    p.def_impl(lambda xp, x, *, axes: getattr(xp, np_fn)(x, axis=axes))
    p.def_emit(lambda ins, axes: f"xp.{np_fn}({ins[0]}, axis={axes!r})")
    p.def_abstract_eval(lambda x, *, axes: _reduced_aval(name, x, axes))

    @p.def_jvp
    def jvp(primals, tangents, *, axes):
        # The tangent is the mean of the tangents at the positions attaining the
        # extremum (JAX's convention, so ties share the derivative).
        from spmd.compiler.ops.elementwise import convert, div, eq, mul
        from spmd.compiler.ops.structural import broadcast_in_dim

        (x,), (t,) = primals, tangents
        out = bind(p, x, axes=axes)
        if isinstance(t, Zero):
            return out, Zero(get_aval(out).update(weak_type=False, dtype=t.aval.dtype))
        shape = np.shape(x)
        kept = tuple(i for i in range(len(shape)) if i not in axes)
        mask = convert(eq(x, broadcast_in_dim(out, shape, kept)), t.dtype)
        count = reduce_sum(mask, axes)
        return out, div(reduce_sum(mul(t, mask), axes), count)

    return p


reduce_max_p = _minmax("reduce_max", "max")
reduce_min_p = _minmax("reduce_min", "min")


def reduce_max(x, axes):
    axes = _norm_axes(axes)
    return bind(reduce_max_p, x, axes=axes) if axes else x


def reduce_min(x, axes):
    axes = _norm_axes(axes)
    return bind(reduce_min_p, x, axes=axes) if axes else x
