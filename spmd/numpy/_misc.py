"""isclose, allclose, isnan, isinf, copy, insert, convolve, correlate (numpy signatures).

>>> import spmd.numpy as snp
>>> bool(snp.allclose(snp.array([1.0, 2.0]), snp.array([1.0, 2.0 + 1e-9])))
True
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.ops import complex as cx
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.conv import conv
from spmd.errors import ArgumentError, IndexOutOfBoundsError, ShapeError
from spmd.numpy._creation import zeros
from spmd.numpy._reductions import all as all_
from spmd.numpy._shape import broadcast_to, moveaxis, ravel
from spmd.numpy._shape_more import concatenate
from spmd.numpy._take import take
from spmd.numpy._util import (canonicalize_axis, check_arraylike, promote_and_broadcast,
                              promote_dtypes, require_static, to_array)

__all__ = ["allclose", "convolve", "copy", "correlate", "insert", "isclose", "isinf", "isnan"]


def isnan(x, /):
    """Elementwise: is ``x`` NaN (always False for integers and bools)."""
    check_arraylike("spmd.numpy.isnan", x)
    a = to_array(x, fname="spmd.numpy.isnan")
    if dtypes.is_complex(a.dtype):  # NaN in either part, as numpy
        return ew.bitwise_or(isnan(_part(a, 0)), isnan(_part(a, 1)))
    if not dtypes.is_float(a.dtype):
        return zeros(a.shape, bool)
    return ew.ne(a, a)


def isinf(x, /):
    """Elementwise: is ``x`` +inf or -inf (always False for integers and bools)."""
    check_arraylike("spmd.numpy.isinf", x)
    a = to_array(x, fname="spmd.numpy.isinf")
    if dtypes.is_complex(a.dtype):  # inf in either part, as numpy
        return ew.bitwise_or(isinf(_part(a, 0)), isinf(_part(a, 1)))
    if not dtypes.is_float(a.dtype):
        return zeros(a.shape, bool)
    return ew.eq(ew.abs(a), np.array(np.inf, a.dtype))


def _part(a, which):
    return (cx.real, cx.imag, cx.conj)[which](a)


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan: bool = False):
    """Elementwise ``|a - b| <= atol + rtol * |b|``; infinities are close only to
    themselves, NaNs to nothing unless ``equal_nan``.

    >>> isclose(snp.array([1.0, snp.inf]), snp.array([1.0 + 1e-7, snp.inf]))
    Array([ True,  True], dtype=bool)
    """
    x, y = promote_and_broadcast(a, b, fname="spmd.numpy.isclose", to_float=True)
    dt = x.dtype
    rdt = dtypes.real_dtype(dt)  # |.| of a complex value is real
    tol = ew.add(np.array(atol, rdt), ew.mul(np.array(rtol, rdt), ew.abs(y)))
    finite = ew.bitwise_and(ew.is_finite(x), ew.is_finite(y))
    zero = np.array(0, dt)
    # Non-finite pairs are compared with ==; zero them first so inf - inf is not computed.
    diff = ew.abs(ew.sub(ew.select(finite, x, zero), ew.select(finite, y, zero)))
    out = ew.select(finite, ew.le(diff, tol), ew.eq(x, y))
    if equal_nan:
        out = ew.bitwise_or(out, ew.bitwise_and(ew.ne(x, x), ew.ne(y, y)))
    return out


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan: bool = False):
    """Whether every element of ``a`` is close to ``b`` (see :func:`isclose`); a
    0-d bool Array (``bool(...)`` gives a Python bool outside ``jit``)."""
    check_arraylike("spmd.numpy.allclose", a, b)
    return all_(isclose(a, b, rtol, atol, equal_nan))


def copy(a, order=None):
    """A copy of ``a`` (a new buffer for concrete arrays; traced values are values)."""
    if order not in (None, "K", "C", "A"):
        raise ArgumentError(f"spmd.numpy.copy: order={order!r} is not supported; arrays are "
                            "C-ordered")
    x = to_array(a, fname="spmd.numpy.copy")
    if isinstance(x, Array) and x is a:
        return x.copy()
    return x


# ------------------------------------------------------------------ insert

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


# ----------------------------------------------------- convolve, correlate

def convolve(a, v, mode: str = "full", *, precision=None, preferred_element_type=None):
    """The discrete linear convolution of 1-d ``a`` and ``v``, as ``numpy.convolve``
    (``mode``: ``'full'``, ``'same'`` or ``'valid'``); one ``conv_general_dilated``.

    >>> convolve(snp.array([1.0, 2.0, 3.0]), snp.array([0.0, 1.0, 0.5]))
    Array([0. , 1. , 2.5, 4. , 1.5], dtype=float32)
    """
    fname = "spmd.numpy.convolve"
    x, k = promote_dtypes(a, v, fname=fname)
    if preferred_element_type is not None:
        x, k = x.astype(preferred_element_type), k.astype(preferred_element_type)
    require_static(mode, fname, "mode", "str")
    if x.ndim != 1 or k.ndim != 1:
        raise ShapeError(f"{fname}: a and v must be 1-d, got shapes {x.shape} and {k.shape}")
    if x.size == 0 or k.size == 0:
        raise ShapeError(f"{fname}: a and v must not be empty (shapes {x.shape}, {k.shape})")
    if mode not in ("full", "same", "valid"):
        raise ArgumentError(f"{fname}: mode={mode!r} must be 'full', 'same' or 'valid'")
    if x.size < k.size:  # convolution commutes; slide the shorter operand
        x, k = k, x
    n, m = x.size, k.size
    s = (m - 1) // 2
    pad = {"full": (m - 1, m - 1), "same": (m - 1 - s, s), "valid": (0, 0)}[mode]
    # A convolution is a correlation (the primitive) with the flipped kernel.
    out = conv(x.reshape(1, 1, n), k[::-1].reshape(1, 1, m), (1,), [pad])
    return out.reshape(-1)


def correlate(a, v, mode: str = "valid", *, precision=None, preferred_element_type=None):
    """The cross-correlation ``c[k] = sum_n a[n + k] v[n]`` of 1-d ``a`` and ``v``, as
    ``numpy.correlate`` (complex ``v`` is conjugated, as numpy does).

    >>> correlate(snp.array([1.0, 2.0, 3.0]), snp.array([0.0, 1.0, 0.5]))
    Array([3.5], dtype=float32)
    """
    x, k = promote_dtypes(a, v, fname="spmd.numpy.correlate")
    if dtypes.is_complex(k.dtype):  # numpy conjugates v: sum_n a[n + k] conj(v[n])
        k = _part(k, 2)
    if k.ndim != 1:
        raise ShapeError(f"spmd.numpy.correlate: a and v must be 1-d, got shapes {x.shape} "
                         f"and {k.shape}")
    if x.ndim == 1 and x.size < k.size:
        # numpy slides the shorter operand: correlate(v, a) reversed ('same' centers
        # its window by the shorter length).
        return convolve(k, x[::-1], mode, preferred_element_type=preferred_element_type)[::-1]
    return convolve(x, k[::-1], mode, preferred_element_type=preferred_element_type)
