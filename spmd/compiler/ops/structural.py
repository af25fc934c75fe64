"""Structural primitives: broadcast, reshape, transpose, squeeze, iota.

They move or replicate data without arithmetic; all are linear.
"""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.compiler.core.array import Array
from spmd.compiler import ops  # sibling families, read at call time (rules build each other's ops)
from spmd.compiler.transforms.batching import move_to_front


def _linear_jvp(p):
    """jvp of a primitive linear in its single operand: apply it to the tangent."""
    def rule(primals, tangents, **params):
        out = bind(p, *primals, **params)
        (t,) = tangents
        if isinstance(t, Zero):
            return out, Zero(get_aval(out).update(weak_type=False, dtype=t.aval.dtype))
        return out, bind(p, t, **params)

    p.def_jvp(rule)
    p.linear = True
    return p


# --------------------------------------------------------- broadcast_in_dim

broadcast_in_dim_p = _linear_jvp(Primitive("broadcast_in_dim", traits=("view", "broadcast")))
broadcast_in_dim_p.unreduced = "keep"


@broadcast_in_dim_p.def_impl
def _bid_impl(xp, x, *, shape, broadcast_dimensions):
    expanded = xp.reshape(x, _expanded_shape(np.shape(x), shape, broadcast_dimensions))
    return xp.broadcast_to(expanded, shape)


def _expanded_shape(in_shape, shape, bdims):
    out = [1] * len(shape)
    for d, s in zip(bdims, in_shape):
        out[d] = s
    return tuple(out)


@broadcast_in_dim_p.def_abstract_eval
def _bid_aval(x, *, shape, broadcast_dimensions):
    if len(broadcast_dimensions) != x.ndim:
        raise ShapeError(f"broadcast_in_dim: operand of shape {x.shape} needs {x.ndim} "
                         f"broadcast_dimensions, got {broadcast_dimensions}")
    # As in JAX: the operand's axes keep their order (the impl and the code
    # generator rely on it); a transposition is an explicit `transpose` first.
    if any(a >= b for a, b in zip(broadcast_dimensions, broadcast_dimensions[1:])):
        raise ShapeError(f"broadcast_in_dim: broadcast_dimensions must be strictly increasing, "
                         f"got {tuple(broadcast_dimensions)} for operand shape {x.shape} and "
                         f"shape {tuple(shape)}; transpose the operand first to reorder its axes")
    for d, s in zip(broadcast_dimensions, x.shape):
        if not 0 <= d < len(shape) or s not in (1, shape[d]):
            raise ShapeError(f"broadcast_in_dim: cannot broadcast shape {x.shape} to {shape} "
                             f"with broadcast_dimensions={broadcast_dimensions}")
    return ShapedArray(shape, x.dtype, x.weak_type)


def _bid_emit(ins, shape, broadcast_dimensions):
    # With increasing broadcast_dimensions the operand's axes keep their order, so
    # inserting the missing axes gives the expanded shape; otherwise call impl.
    if list(broadcast_dimensions) != sorted(broadcast_dimensions):
        return None
    # The missing axes are inserted by indexing with None (a view, as expand_dims
    # gives, at half its cost: 2.7 against 4.4 us a call); none are needed when the
    # operand's axes are the trailing ones, which numpy's broadcasting aligns itself.
    n, dims = len(shape), tuple(broadcast_dimensions)
    if dims == tuple(range(n - len(dims), n)):
        return f"xp.broadcast_to({ins[0]}, {shape!r})"
    idx = ", ".join(":" if d in dims else "None" for d in range(n))
    return f"xp.broadcast_to({ins[0]}[{idx}], {shape!r})"


broadcast_in_dim_p.def_emit(_bid_emit)


def _bid_emit_avals(ins, in_avals, *, xp, shape, broadcast_dimensions, **_):
    """Only unit axes inserted (a replicated value given its device axis inside a
    ``shard_map``): indexing with ``None`` there, a view at a tenth of
    ``broadcast_to``'s cost (0.3 against 4-10 us a call, once per pipeline tick)."""
    dims = tuple(broadcast_dimensions)
    if tuple(in_avals[0].shape) == tuple(shape[d] for d in dims) and \
            all(shape[d] == 1 for d in range(len(shape)) if d not in dims) and \
            list(dims) == sorted(dims) and dims != tuple(range(len(shape))):
        return f"{ins[0]}[{', '.join(':' if d in dims else 'None' for d in range(len(shape)))}]"
    return _bid_emit(ins, shape, broadcast_dimensions)


broadcast_in_dim_p.rules.emit_avals = _bid_emit_avals


def broadcast_in_dim(x, shape, broadcast_dimensions):
    """Broadcast ``x`` to ``shape``; operand dim i maps to output dim ``broadcast_dimensions[i]``."""
    shape = tuple(int(s) for s in shape)
    bdims = tuple(int(d) for d in broadcast_dimensions)
    if np.shape(x) == shape and bdims == tuple(range(len(shape))):
        return x
    return bind(broadcast_in_dim_p, x, shape=shape, broadcast_dimensions=bdims)


@broadcast_in_dim_p.def_transpose
def _bid_transpose(ct, x, *, shape, broadcast_dimensions):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    in_shape = x.aval.shape
    summed = tuple(d for d in range(len(shape)) if d not in broadcast_dimensions)
    stretched = tuple(d for d, s in zip(broadcast_dimensions, in_shape) if s == 1 and shape[d] != 1)
    out = ct
    if summed or stretched:
        out = ops.reduce.reduce_sum(ct, tuple(sorted(summed + stretched)))
    return [reshape(out, in_shape)]


@broadcast_in_dim_p.def_batch
def _bid_batch(args, dims, *, shape, broadcast_dimensions):
    (x,), (d,) = args, dims
    x = move_to_front(x, d)
    size = np.shape(x)[0]
    return broadcast_in_dim(x, (size,) + tuple(shape),
                            (0,) + tuple(b + 1 for b in broadcast_dimensions)), 0


# ------------------------------------------------------------------ reshape

reshape_p = _linear_jvp(Primitive("reshape", traits=("view", "same_order")))
reshape_p.unreduced = "keep"
reshape_p.def_impl(lambda xp, x, *, new_sizes: xp.reshape(x, new_sizes))
# The method, not ``xp.reshape`` (a Python-level numpy function): 0.1 µs against 0.6.
# The generated code's values are arrays or numpy scalars, which both have it.
reshape_p.def_emit(lambda ins, new_sizes: f"{ins[0]}.reshape({new_sizes!r})")


@reshape_p.def_abstract_eval
def _reshape_aval(x, *, new_sizes):
    if math.prod(new_sizes) != x.size:
        raise ShapeError(f"reshape: cannot reshape an array of shape {x.shape} (size {x.size}) "
                         f"into shape {tuple(new_sizes)} (size {math.prod(new_sizes)})")
    return ShapedArray(new_sizes, x.dtype, x.weak_type)


def reshape(x, new_sizes):
    new_sizes = tuple(int(s) for s in new_sizes)
    if tuple(np.shape(x)) == new_sizes:
        return x
    return bind(reshape_p, x, new_sizes=new_sizes)


@reshape_p.def_transpose
def _reshape_transpose(ct, x, *, new_sizes):
    return [Zero(x.aval) if isinstance(ct, Zero) else reshape(ct, x.aval.shape)]


@reshape_p.def_batch
def _reshape_batch(args, dims, *, new_sizes):
    x = move_to_front(args[0], dims[0])
    return reshape(x, (np.shape(x)[0],) + tuple(new_sizes)), 0


# ---------------------------------------------------------------- transpose

transpose_p = _linear_jvp(Primitive("transpose", traits=("view",)))
transpose_p.unreduced = "keep"
transpose_p.def_impl(lambda xp, x, *, permutation: xp.transpose(x, permutation))
transpose_p.def_emit(lambda ins, permutation: f"xp.transpose({ins[0]}, {permutation!r})")


@transpose_p.def_abstract_eval
def _transpose_aval(x, *, permutation):
    if sorted(permutation) != list(range(x.ndim)):
        raise ArgumentError(f"transpose: permutation {permutation} is not a permutation of "
                            f"the {x.ndim} axes of an array of shape {x.shape}")
    return ShapedArray(tuple(x.shape[p] for p in permutation), x.dtype, x.weak_type)


def transpose(x, permutation):
    permutation = tuple(int(p) for p in permutation)
    if permutation == tuple(range(len(permutation))):
        return x
    return bind(transpose_p, x, permutation=permutation)


@transpose_p.def_transpose
def _transpose_transpose(ct, x, *, permutation):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    return [transpose(ct, tuple(np.argsort(permutation)))]


@transpose_p.def_batch
def _transpose_batch(args, dims, *, permutation):
    x = move_to_front(args[0], dims[0])
    return transpose(x, (0,) + tuple(p + 1 for p in permutation)), 0


# ------------------------------------------------------------------ squeeze

squeeze_p = _linear_jvp(Primitive("squeeze", traits=("view",)))
squeeze_p.unreduced = "keep"
squeeze_p.def_impl(lambda xp, x, *, dimensions: xp.squeeze(x, dimensions))
squeeze_p.def_emit(lambda ins, dimensions: f"xp.squeeze({ins[0]}, {dimensions!r})")


@squeeze_p.def_abstract_eval
def _squeeze_aval(x, *, dimensions):
    for d in dimensions:
        if not 0 <= d < x.ndim or x.shape[d] != 1:
            raise ShapeError(f"squeeze: cannot squeeze axis {d} of an array of shape {x.shape} "
                             "(only axes of size 1 can be squeezed)")
    return ShapedArray(tuple(s for i, s in enumerate(x.shape) if i not in dimensions),
                       x.dtype, x.weak_type)


def squeeze(x, dimensions):
    dimensions = tuple(sorted(int(d) for d in dimensions))
    if not dimensions:
        return x
    return bind(squeeze_p, x, dimensions=dimensions)


@squeeze_p.def_transpose
def _squeeze_transpose(ct, x, *, dimensions):
    return [Zero(x.aval) if isinstance(ct, Zero) else reshape(ct, x.aval.shape)]


@squeeze_p.def_batch
def _squeeze_batch(args, dims, *, dimensions):
    x = move_to_front(args[0], dims[0])
    return squeeze(x, tuple(d + 1 for d in dimensions)), 0


# --------------------------------------------------------------------- iota

iota_p = Primitive("iota", traits=())


@iota_p.def_impl
def _iota_impl(xp, *, dtype, shape, dimension):
    r = xp.arange(shape[dimension], dtype=dtype)
    return xp.broadcast_to(xp.reshape(r, _expanded_shape((shape[dimension],), shape,
                                                         (dimension,))), shape)


iota_p.def_abstract_eval(lambda *, dtype, shape, dimension: ShapedArray(shape, dtype, False))
iota_p.def_batch(lambda args, dims, **params: (bind(iota_p, **params), None))


@iota_p.def_jvp
def _iota_jvp(primals, tangents, **params):
    out = bind(iota_p, **params)
    return out, Zero(tangent_aval(get_aval(out)))


def iota(dtype, size_or_shape, dimension: int = 0):
    """``0, 1, ..., n-1`` along ``dimension`` of ``shape``."""
    shape = (int(size_or_shape),) if np.ndim(size_or_shape) == 0 and not isinstance(
        size_or_shape, tuple) else tuple(int(s) for s in size_or_shape)
    return bind(iota_p, dtype=dtypes.check_dtype(dtype, "iota"), shape=shape,
                dimension=int(dimension))


# ------------------------------------------------------------- constants

def full(shape, fill_value, dtype, weak_type: bool = False):
    """An array of ``shape`` filled with a scalar (a broadcast literal in programs)."""
    dtype = dtypes.check_dtype(dtype, "full")
    shape = tuple(int(s) for s in shape)
    if np.ndim(fill_value) == 0 and not hasattr(fill_value, "_trace"):
        scalar = Array(np.array(fill_value, dtype=dtype),
                       ShapedArray((), dtype, weak_type)) if not isinstance(fill_value, Array) \
            else fill_value
        return broadcast_in_dim(scalar, shape, ()) if shape else scalar

    v = ops.elementwise.convert(fill_value, dtype, weak_type)
    return broadcast_in_dim(v, shape, tuple(range(len(shape) - np.ndim(v), len(shape))))


def zeros(shape, dtype):
    return full(shape, 0, dtype)
