"""Inserting values into an array before given indices: ``insert`` (numpy semantics),
a gather of the old elements and the new ones (``take``) after joining them.

>>> import spmd.numpy as snp
>>> snp.insert(snp.array([1, 2, 3]), 1, 9)
Array([1, 9, 2, 3], dtype=int32)
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core.array import Array
from spmd.errors import ArgumentError, IndexOutOfBoundsError, ShapeError
from spmd.numpy._joining import concatenate
from spmd.numpy._shape import broadcast_to, moveaxis, ravel
from spmd.numpy._take import take
from spmd.numpy._util import canonicalize_axis, check_arraylike, require_static, to_array

__all__ = ["insert"]


def insert(arr, obj, values, axis=None):
    """``arr`` with ``values`` inserted before the index or indices ``obj`` along
    ``axis`` (the flattened array when None), as ``numpy.insert``.  ``obj`` must be
    static (an int, a sequence of ints, or a slice), as in JAX.

    >>> insert(snp.array([1, 2, 3]), 1, 9)
    Array([1, 9, 2, 3], dtype=int32)
    """
    fname = "spmd.numpy.insert"
    check_arraylike(fname, arr, values)
    x = to_array(arr, fname=fname)
    if axis is None:
        x, axis = ravel(x), 0
    axis = canonicalize_axis(axis, x.ndim, fname)
    n = x.shape[axis]
    require_static(obj, fname, "obj", "int, sequence of ints or slice")
    if isinstance(obj, slice):
        idx = np.arange(*obj.indices(n))
    else:
        idx = np.asarray(obj.value if isinstance(obj, Array) else obj)
        if idx.dtype.kind not in "iu" and idx.size:
            raise ArgumentError(f"{fname}: obj={obj!r} must hold integers")
        idx = idx.astype(np.int64)
    if idx.ndim > 1:
        raise ArgumentError(f"{fname}: obj must be an int or a 1-d sequence, got shape "
                            f"{idx.shape}")
    v = to_array(values, x.dtype, fname)
    if idx.ndim == 0:
        # One index: values form a block; their first axis runs along ``axis``.
        v = v.reshape((1,) * (x.ndim - v.ndim) + v.shape) if v.ndim < x.ndim else v
        v = moveaxis(v, 0, axis) if x.ndim else v
        count = v.shape[axis] if x.ndim else v.size
    else:
        count = idx.shape[0]
    slot = x.shape[:axis] + (count,) + x.shape[axis + 1:]
    try:
        v = broadcast_to(v, slot)
    except ShapeError:
        raise ShapeError(f"{fname}: values of shape {np.shape(values)} do not fit the "
                         f"{count} inserted slot(s) of shape {slot}") from None
    try:
        # Where each output element comes from: original k -> k, inserted j -> n + j.
        pos = np.insert(np.arange(n), idx, -1 - np.arange(count))
    except IndexError:
        raise IndexOutOfBoundsError(f"{fname}: obj={obj!r} is out of bounds for axis {axis} "
                                    f"of size {n} (valid: -{n} to {n})") from None
    src = np.where(pos >= 0, pos, n - 1 - pos).astype(np.int32)
    return take(concatenate([x, v], axis=axis), src, axis=axis)
