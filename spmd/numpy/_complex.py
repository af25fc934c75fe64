"""Complex parts: ``real``, ``imag``, ``conj``, ``angle``, ``iscomplexobj`` (like
``jax.numpy``: on real arrays ``real`` and ``conj`` return the array, ``imag`` zeros)."""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.ops import complex as cx
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.structural import full
from spmd.compiler.core.trace import get_aval
from spmd.numpy._util import check_arraylike, promote_dtypes, to_array

__all__ = ["real", "imag", "conj", "conjugate", "angle", "iscomplexobj", "isrealobj"]


def _one(x, fname):
    check_arraylike(fname, x)
    (a,) = promote_dtypes(x, fname=fname)
    return a, dtypes.is_complex(get_aval(a).dtype)


def real(val, /):
    """The real part: ``real(np.array([1+2j])) -> [1.]``; a real array is returned as is."""
    a, c = _one(val, "spmd.numpy.real")
    return cx.real(a) if c else a


def imag(val, /):
    """The imaginary part: ``imag(np.array([1+2j])) -> [2.]``; zeros for a real array."""
    a, c = _one(val, "spmd.numpy.imag")
    if c:
        return cx.imag(a)
    return _zeros_like(a)


def _zeros_like(a):
    av = get_aval(a)
    return full(av.shape, 0, av.dtype)


def conjugate(x, /):
    """The complex conjugate: ``conj(np.array([1+2j])) -> [1-2j]``; real arrays unchanged."""
    a, c = _one(x, "spmd.numpy.conjugate")
    return cx.conj(a) if c else a


conj = conjugate


def angle(z, deg: bool = False):
    """The argument of ``z`` (``arctan2(imag, real)``) in radians, or degrees with ``deg``.

    >>> angle(np.array([1j]))  # doctest: +SKIP
    Array([1.5707964], dtype=float32)
    """
    a, c = _one(z, "spmd.numpy.angle")
    if c:
        re, im = cx.real(a), cx.imag(a)
    else:
        if not dtypes.is_float(get_aval(a).dtype):
            a = ew.convert(a, dtypes.default_float(), get_aval(a).weak_type)
        re, im = a, _zeros_like(a)
    out = ew.atan2(im, re)
    if deg:
        out = ew.mul(out, np.array(180 / np.pi, get_aval(out).dtype)[()])
    return out


def iscomplexobj(x, /) -> bool:
    """Whether ``x`` has a complex dtype (not whether any imaginary part is non-zero)."""
    return dtypes.is_complex(get_aval(to_array(x)).dtype)


def isrealobj(x, /) -> bool:
    """Whether ``x`` has a non-complex dtype."""
    return not iscomplexobj(x)
