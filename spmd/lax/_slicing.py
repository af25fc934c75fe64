"""``lax`` conveniences over the primitives: slicing along one dimension, top-k.

>>> import numpy as np
>>> from spmd import lax
>>> lax.dynamic_slice_in_dim(np.arange(6), 2, 3)
Array([2, 3, 4], dtype=int32)
>>> lax.top_k(np.array([3.0, 1.0, 4.0, 1.5]), 2)
(Array([4., 3.], dtype=float32), Array([2, 0], dtype=int32))
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.indexing import dynamic_slice, dynamic_update_slice
from spmd.compiler.ops.slicing import slice_in_dim
from spmd.compiler.ops.sort import sort
from spmd.compiler.ops.structural import iota, squeeze
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._util import canonicalize_axis, to_array


def _operand(x, fname):
    return to_array(x, fname=fname)


def _axis(axis, ndim, fname):
    return canonicalize_axis(axis, ndim, fname)


def _start(index, size, fname, allow_negative):
    """A scalar integer start; negative values count from the end when allowed."""
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        i = int(index)
        return i + size if (i < 0 and allow_negative) else i
    i = _operand(index, fname)
    aval = get_aval(i)
    if aval.shape != () or not dtypes.is_int(aval.dtype):
        raise ArgumentError(f"{fname}: the index must be a scalar integer, got {aval}")
    if not allow_negative:
        return i
    zero = np.array(0, aval.dtype)
    return ew.select(ew.lt(i, zero), ew.add(i, np.array(size, aval.dtype)), i)


def dynamic_slice_in_dim(operand, start_index, slice_size: int, axis: int = 0, *,
                         allow_negative_indices: bool = True):
    """``operand[..., start:start + slice_size, ...]`` along ``axis``, with a traced
    ``start_index`` (clamped so the window fits, as ``lax.dynamic_slice``)."""
    fname = "spmd.lax.dynamic_slice_in_dim"
    x = _operand(operand, fname)
    ax = _axis(axis, x.ndim, fname)
    starts = [0] * x.ndim
    starts[ax] = _start(start_index, x.shape[ax], fname, allow_negative_indices)
    sizes = list(x.shape)
    sizes[ax] = int(slice_size)
    return dynamic_slice(x, [_as_index(s) for s in starts], sizes)


def dynamic_index_in_dim(operand, index, axis: int = 0, keepdims: bool = True, *,
                         allow_negative_indices: bool = True):
    """``operand``'s entry ``index`` along ``axis`` (kept as a size-1 axis when
    ``keepdims``)."""
    x = _operand(operand, "spmd.lax.dynamic_index_in_dim")
    ax = _axis(axis, x.ndim, "spmd.lax.dynamic_index_in_dim")
    out = dynamic_slice_in_dim(x, index, 1, ax, allow_negative_indices=allow_negative_indices)
    return out if keepdims else squeeze(out, (ax,))


def dynamic_update_slice_in_dim(operand, update, start_index, axis: int, *,
                                allow_negative_indices: bool = True):
    """``operand`` with ``update`` written at ``start_index`` along ``axis`` (clamped)."""
    fname = "spmd.lax.dynamic_update_slice_in_dim"
    x, u = _operand(operand, fname), _operand(update, fname)
    ax = _axis(axis, x.ndim, fname)
    starts = [0] * x.ndim
    starts[ax] = _start(start_index, x.shape[ax], fname, allow_negative_indices)
    return dynamic_update_slice(x, u, [_as_index(s) for s in starts])


def _as_index(s):
    if isinstance(s, int):
        return np.array(s, dtypes.default_int())
    return s


# ---------------------------------------------------------------------- top-k

def _descending_key(x):
    """An array whose ascending order is ``x``'s descending order, ties kept in
    index order (NaNs first, as the largest values)."""
    dt = get_aval(x).dtype
    if dtypes.is_bool(dt):
        return ew.bitwise_not(x)
    if dtypes.is_int(dt):
        return ew.bitwise_not(x)  # ~x = -x - 1 reverses the order without overflow
    # -x sorts NaN last; NaN counts as the largest value in top_k, so map it to -inf.
    return ew.select(ew.ne(x, x), np.array(-np.inf, dt), ew.neg(x))


def _top_k_along(x, k, axis, fname, largest=True):
    shape = get_aval(x).shape
    if isinstance(k, Tracer):
        raise ArgumentError(f"{fname}: k must be a static int, got a traced value")
    k = int(k)
    if not 0 <= k <= shape[axis]:
        raise ShapeError(f"{fname}: k={k} must be between 0 and the size {shape[axis]} of "
                         f"the reduced dimension (operand shape {shape})")
    idx = iota(np.dtype(np.int32), shape, axis)
    # The sort is stable, so equal values keep their index order.  Ascending order
    # (approx_min_k) puts NaNs last, as the largest values.
    key = _descending_key(x) if largest else x
    _, vals, ids = sort((key, x, idx), axis, True, 1)
    return slice_in_dim(vals, 0, k, axis=axis), slice_in_dim(ids, 0, k, axis=axis)


def top_k(operand, k: int):
    """The ``k`` largest entries along the last axis, descending, and their int32
    indices (the lower index first among equal values; NaN counts as largest)."""
    x = _operand(operand, "spmd.lax.top_k")
    if x.ndim == 0:
        raise ShapeError("spmd.lax.top_k: the operand must have at least one dimension")
    return _top_k_along(x, k, x.ndim - 1, "spmd.lax.top_k")


def approx_max_k(operand, k: int, reduction_dimension: int = -1, recall_target: float = 0.95,
                 reduction_input_size_override: int = -1, aggregate_to_topk: bool = True):
    """The ``k`` largest entries along ``reduction_dimension`` and their indices.  The
    result is exact (recall 1, which meets any ``recall_target``)."""
    x = _operand(operand, "spmd.lax.approx_max_k")
    ax = _axis(reduction_dimension, x.ndim, "spmd.lax.approx_max_k")
    return _top_k_along(x, k, ax, "spmd.lax.approx_max_k")


def approx_min_k(operand, k: int, reduction_dimension: int = -1, recall_target: float = 0.95,
                 reduction_input_size_override: int = -1, aggregate_to_topk: bool = True):
    """The ``k`` smallest entries along ``reduction_dimension``, ascending, and their
    indices (exact)."""
    x = _operand(operand, "spmd.lax.approx_min_k")
    ax = _axis(reduction_dimension, x.ndim, "spmd.lax.approx_min_k")
    return _top_k_along(x, k, ax, "spmd.lax.approx_min_k", largest=False)
