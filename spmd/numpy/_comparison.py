"""Comparisons that mind NaN and infinity: ``isnan``, ``isinf``, ``isclose``,
``allclose``, ``array_equal`` (numpy signatures).

>>> import spmd.numpy as snp
>>> bool(snp.allclose(snp.array([1.0, 2.0]), snp.array([1.0, 2.0 + 1e-9])))
True
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.ops import complex as cx, elementwise as ew
from spmd.numpy._creation import asarray, zeros
from spmd.numpy._reductions import all as all_
from spmd.numpy._util import check_arraylike, promote_and_broadcast, to_array

__all__ = ["allclose", "array_equal", "isclose", "isinf", "isnan"]


def isnan(x, /):
    """Elementwise: is ``x`` NaN (always False for integers and bools)."""
    check_arraylike("spmd.numpy.isnan", x)
    a = to_array(x, fname="spmd.numpy.isnan")
    if dtypes.is_complex(a.dtype):  # NaN in either part, as numpy
        return ew.bitwise_or(isnan(cx.real(a)), isnan(cx.imag(a)))
    if not dtypes.is_float(a.dtype):
        return zeros(a.shape, bool)
    return ew.ne(a, a)


def isinf(x, /):
    """Elementwise: is ``x`` +inf or -inf (always False for integers and bools)."""
    check_arraylike("spmd.numpy.isinf", x)
    a = to_array(x, fname="spmd.numpy.isinf")
    if dtypes.is_complex(a.dtype):  # inf in either part, as numpy
        return ew.bitwise_or(isinf(cx.real(a)), isinf(cx.imag(a)))
    if not dtypes.is_float(a.dtype):
        return zeros(a.shape, bool)
    return ew.eq(ew.abs(a), np.array(np.inf, a.dtype))


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


def array_equal(a1, a2, equal_nan: bool = False):
    """Whether the arrays have one shape and equal entries (a 0-d bool Array)."""
    check_arraylike("spmd.numpy.array_equal", a1, a2)
    x, y = to_array(a1), to_array(a2)
    if x.shape != y.shape:
        return asarray(False)
    eq = x == y
    if equal_nan:
        eq = eq | ((x != x) & (y != y))
    return all_(eq)
