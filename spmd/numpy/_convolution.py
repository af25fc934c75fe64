"""One-dimensional convolution and correlation (``numpy.convolve``,
``numpy.correlate``), through the convolution primitive.

>>> import spmd.numpy as snp
>>> snp.convolve(snp.array([1.0, 2.0, 3.0]), snp.array([0.0, 1.0, 0.5]))
Array([0. , 1. , 2.5, 4. , 1.5], dtype=float32)
"""

from __future__ import annotations

from spmd.compiler.core import dtypes
from spmd.compiler.ops import complex as cx
from spmd.compiler.ops.conv import conv
from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._util import promote_dtypes, require_static

__all__ = ["convolve", "correlate"]


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
        k = cx.conj(k)
    if k.ndim != 1:
        raise ShapeError(f"spmd.numpy.correlate: a and v must be 1-d, got shapes {x.shape} "
                         f"and {k.shape}")
    if x.ndim == 1 and x.size < k.size:
        # numpy slides the shorter operand: correlate(v, a) reversed ('same' centers
        # its window by the shorter length).
        return convolve(k, x[::-1], mode, preferred_element_type=preferred_element_type)[::-1]
    return convolve(x, k[::-1], mode, preferred_element_type=preferred_element_type)
