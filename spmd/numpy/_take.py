"""``take`` and ``take_along_axis`` (numpy signatures, JAX's out-of-bounds modes), on the
parsing and gathering helpers of :mod:`spmd.numpy._indexing`."""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import to_host
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import indexing as ix
from spmd.compiler.ops import structural as st
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.numpy._indexing import (_broadcast, _check_int_index, _default_fill, _normalized,
                                  _place_b)
from spmd.numpy._util import canonicalize_axis, to_array

__all__ = ["take", "take_along_axis"]


def _index_operand(indices, fname):
    """An integer index array: numpy (static) or traced."""
    if isinstance(indices, Tracer):
        _check_int_index(indices.dtype)
        return indices
    a = to_host(indices.value if isinstance(indices, Array) else indices)
    if a.size == 0 and a.dtype.kind == "f" and not isinstance(indices, np.ndarray):
        a = a.astype(np.intp)
    if not dtypes.is_int(a.dtype):
        raise DTypeError(f"{fname}: indices must be integers, got dtype {a.dtype}")
    return a


def _take_mode(mode, fname):
    mode = "fill" if mode is None else mode
    if mode not in ("fill", "clip", "wrap", "promise_in_bounds"):
        raise ArgumentError(f"{fname}: mode={mode!r} is not supported; use 'fill' (the "
                            "default), 'clip', 'wrap' or 'promise_in_bounds'")
    return mode


def _wrapped(i, n):
    if isinstance(i, np.ndarray):
        return np.mod(i, n).astype(dtypes.default_int())
    dt = get_aval(i).dtype
    r = ew.rem(i, ix._scalar(n, dt))
    return ew.select(ew.lt(r, ix._scalar(0, dt)), ew.add(r, ix._scalar(n, dt)), r)


def _prepare_index(i, n, mode):
    return _wrapped(i, n) if mode == "wrap" else _normalized(i, n)


def take(a, indices, axis=None, mode=None, unique_indices=False, indices_are_sorted=False,
         fill_value=None):
    """Elements of ``a`` at ``indices`` along ``axis`` (the flattened array when None).

    As in JAX, out-of-bounds indices give ``fill_value`` (default NaN for floats)
    unless ``mode='clip'`` or ``'wrap'``.

    >>> import spmd.numpy as snp
    >>> snp.take(snp.arange(5) * 10, [4, 0, -1])
    Array([40,  0, 40], dtype=int32)
    """
    fname = "spmd.numpy.take"
    x = to_array(a)
    if axis is None:
        x, axis = st.reshape(x, (math.prod(x.shape),)), 0
    axis = canonicalize_axis(axis, x.ndim, fname)
    mode = _take_mode(mode, fname)
    n = x.shape[axis]
    i = _prepare_index(_index_operand(indices, fname), n, mode)
    fill = (_default_fill(x.dtype) if fill_value is None else fill_value)
    out = ix.gather(x, [i], (axis,), "fill" if mode == "fill" else "clip",
                    fill if mode == "fill" else None)
    return _place_b(out, len(np.shape(i)), axis)


def take_along_axis(arr, indices, axis=-1, mode=None, fill_value=None):
    """``out[..., j, ...] = arr[..., indices[..., j, ...], ...]`` along ``axis``.

    >>> import spmd.numpy as snp
    >>> snp.take_along_axis(snp.array([[1., 2., 3.]]), snp.array([[2, 0]]), axis=1)
    Array([[3., 1.]], dtype=float32)
    """
    fname = "spmd.numpy.take_along_axis"
    x = to_array(arr)
    i = _index_operand(indices, fname)
    if axis is None:
        if np.ndim(i) != 1:
            raise ShapeError(f"{fname}: with axis=None, indices must be 1-dimensional, got "
                             f"shape {np.shape(i)}")
        x, axis = st.reshape(x, (math.prod(x.shape),)), 0
    if np.ndim(i) != x.ndim:
        raise ShapeError(f"{fname}: indices of shape {np.shape(i)} must have the rank of the "
                         f"array of shape {x.shape}")
    axis = canonicalize_axis(axis, x.ndim, fname)
    mode = _take_mode(mode, fname)
    i_shape = tuple(np.shape(i))
    out_shape = []
    for d, (s, k) in enumerate(zip(x.shape, i_shape)):
        if d != axis and s != k and 1 not in (s, k):
            raise ShapeError(f"{fname}: array of shape {x.shape} and indices of shape {i_shape} "
                             f"do not broadcast in dimension {d}")
        out_shape.append(k if d == axis else max(s, k) if 0 not in (s, k) else 0)
    out_shape = tuple(out_shape)
    x_shape = out_shape[:axis] + (x.shape[axis],) + out_shape[axis + 1:]
    x = st.broadcast_in_dim(x, x_shape, tuple(range(x.ndim))) if x.shape != x_shape else x
    i = _prepare_index(i, x.shape[axis], mode)
    idx = [_broadcast(i, out_shape) if d == axis else
           st.iota(dtypes.default_int(), out_shape, d) for d in range(x.ndim)]
    fill = (_default_fill(x.dtype) if fill_value is None else fill_value)
    return ix.gather(x, idx, tuple(range(x.ndim)), "fill" if mode == "fill" else "clip",
                     fill if mode == "fill" else None)
