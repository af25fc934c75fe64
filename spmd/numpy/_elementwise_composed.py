"""Elementwise functions of numpy composed from the primitives' functions (so they
differentiate, batch and partition through them): logarithms and exponentials in
other bases, inverse hyperbolic functions, angle conversions, ``hypot``, ``cbrt``,
``sinc``, ``fmax``/``fmin``/``fmod``, rounding toward zero, ``isposinf``/``isneginf``,
``nan_to_num``.

>>> import spmd.numpy as snp
>>> snp.log10(snp.array([1.0, 100.0]))
Array([0., 2.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.ops import complex as cx
from spmd.compiler.ops.elementwise import rem
from spmd.errors import DTypeError
from spmd.numpy._elementwise import (abs as abs_, ceil, exp, floor, log, log1p, logaddexp, maximum,
                                     minimum, power, round as round_, sign, sin, sqrt, where)
from spmd.numpy._util import check_arraylike, promote_and_broadcast, promote_to_float, to_array

__all__ = ["arccosh", "arcsinh", "arctanh", "cbrt", "deg2rad", "degrees", "exp2", "fix",
           "float_power", "fmax", "fmin", "fmod", "heaviside", "hypot", "isneginf", "isposinf",
           "log10", "log2", "logaddexp2", "nan_to_num", "positive", "rad2deg", "radians", "rint",
           "sinc", "trunc"]


_LN2 = float(np.log(2.0))


_LN10 = float(np.log(10.0))


def _f(x, name):
    (a,) = promote_to_float(x, fname=f"spmd.numpy.{name}")
    return a


def _c(like, value):
    return np.array(value, like.dtype)


def log2(x, /):
    """Elementwise base-2 logarithm."""
    a = _f(x, "log2")
    return log(a) * _c(a, 1 / _LN2)


def log10(x, /):
    """Elementwise base-10 logarithm."""
    a = _f(x, "log10")
    return log(a) * _c(a, 1 / _LN10)


def exp2(x, /):
    """Elementwise ``2 ** x``."""
    a = _f(x, "exp2")
    return exp(a * _c(a, _LN2))


def logaddexp2(x1, x2, /):
    """``log2(2 ** x1 + 2 ** x2)`` without overflow."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.logaddexp2", to_float=True)
    return logaddexp(a * _c(a, _LN2), b * _c(b, _LN2)) * _c(a, 1 / _LN2)


def arcsinh(x, /):
    """Elementwise inverse hyperbolic sine (accurate near 0 and for large ``|x|``)."""
    a = _f(x, "arcsinh")
    neg = a < _c(a, 0)
    m = where(neg, -a, a)  # odd function: compute at |x| (a select keeps d/dx at 0)
    big = m > _c(a, 1e8)
    mm = where(big, _c(a, 1), m)
    small = log1p(mm + mm * mm / (_c(a, 1) + sqrt(_c(a, 1) + mm * mm)))
    large = log(where(big, m, _c(a, 1))) + _c(a, _LN2)
    r = where(big, large, small)
    return where(neg, -r, r)


def arccosh(x, /):
    """Elementwise inverse hyperbolic cosine (NaN below 1)."""
    a = _f(x, "arccosh")
    if dtypes.is_complex(a.dtype):  # the principal branch needs the roots taken apart
        return log(a + sqrt(a - _c(a, 1)) * sqrt(a + _c(a, 1)))
    return log(a + sqrt((a - _c(a, 1)) * (a + _c(a, 1))))


def arctanh(x, /):
    """Elementwise inverse hyperbolic tangent (``±inf`` at ``±1``)."""
    a = _f(x, "arctanh")
    return _c(a, 0.5) * (log1p(a) - log1p(-a))


def deg2rad(x, /):
    """Degrees to radians."""
    a = _f(x, "deg2rad")
    return a * _c(a, np.pi / 180)


def rad2deg(x, /):
    """Radians to degrees."""
    a = _f(x, "rad2deg")
    return a * _c(a, 180 / np.pi)


radians, degrees = deg2rad, rad2deg


def hypot(x1, x2, /):
    """``sqrt(x1**2 + x2**2)`` without overflow or underflow."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.hypot", to_float=True)
    _real_only(a, "hypot")
    a, b = abs_(a), abs_(b)
    hi, lo = maximum(a, b), minimum(a, b)
    zero = hi == _c(hi, 0)
    r = lo / where(zero, _c(hi, 1), hi)
    return where(zero, _c(hi, 0), hi * sqrt(_c(hi, 1) + r * r))


def cbrt(x, /):
    """Elementwise real cube root."""
    a = _f(x, "cbrt")
    return sign(a) * power(abs_(a), _c(a, 1 / 3))


def sinc(x, /):
    """``sin(pi x) / (pi x)``, 1 at 0 (with a smooth derivative there)."""
    a = _f(x, "sinc")
    zero = a == _c(a, 0)
    px = _c(a, np.pi) * where(zero, _c(a, 1), a)
    return where(zero, _c(a, 1), sin(px) / px)


def heaviside(x1, x2, /):
    """0 where ``x1 < 0``, ``x2`` where ``x1 == 0``, 1 where ``x1 > 0``."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.heaviside")
    _real_only(a, "heaviside")
    return where(a < 0, _c(a, 0), where(a > 0, _c(a, 1), b))


def fmax(x1, x2, /):
    """Elementwise maximum ignoring NaNs (NaN only where both are)."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.fmax")
    return where(a != a, b, where(b != b, a, maximum(a, b)))


def fmin(x1, x2, /):
    """Elementwise minimum ignoring NaNs (NaN only where both are)."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.fmin")
    return where(a != a, b, where(b != b, a, minimum(a, b)))


def fmod(x1, x2, /):
    """The C remainder: the result has the sign of ``x1`` (``lax.rem``)."""
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.fmod")
    _real_only(a, "fmod")
    return rem(a, b)


def _real_only(a, name):
    if dtypes.is_complex(a.dtype):
        raise DTypeError(f"spmd.numpy.{name}: complex input ({a.dtype}) is not supported "
                         "(numpy refuses it too); apply it to snp.real(x) and snp.imag(x)")


def trunc(x, /):
    """Round toward zero."""
    a = to_array(x, fname="spmd.numpy.trunc")
    check_arraylike("spmd.numpy.trunc", x)
    _real_only(a, "trunc")
    if not dtypes.is_float(a.dtype):
        return a
    return where(a < 0, ceil(a), floor(a))


fix = trunc


def rint(x, /):
    """Round to the nearest integer, halves to even (a float result)."""
    return round_(_f(x, "rint"))


def positive(x, /):
    """``+x``."""
    check_arraylike("spmd.numpy.positive", x)
    return to_array(x)


def float_power(x1, x2, /):
    """``x1 ** x2`` in the widest float (float64 with x64, else float32)."""
    wide = np.float64 if dtypes.x64_enabled() else np.float32
    a, b = promote_and_broadcast(x1, x2, fname="spmd.numpy.float_power", to_float=True)
    if dtypes.is_complex(a.dtype):
        wide = dtypes.complex_dtype(np.dtype(wide))
    return power(a.astype(wide), b.astype(wide))


def isposinf(x, /):
    """Elementwise ``x == +inf``."""
    a = to_array(x, fname="spmd.numpy.isposinf")
    check_arraylike("spmd.numpy.isposinf", x)
    _real_only(a, "isposinf")
    return a == _c(a, np.inf) if dtypes.is_float(a.dtype) else a != a


def isneginf(x, /):
    """Elementwise ``x == -inf``."""
    a = to_array(x, fname="spmd.numpy.isneginf")
    check_arraylike("spmd.numpy.isneginf", x)
    _real_only(a, "isneginf")
    return a == _c(a, -np.inf) if dtypes.is_float(a.dtype) else a != a


def nan_to_num(x, copy: bool = True, nan=0.0, posinf=None, neginf=None):
    """NaN -> ``nan``, +inf -> ``posinf`` (the dtype's max), -inf -> ``neginf`` (its min)."""
    check_arraylike("spmd.numpy.nan_to_num", x)
    a = to_array(x)
    if dtypes.is_complex(a.dtype):  # each part on its own, as numpy
        parts = [nan_to_num(p(a), copy, nan, posinf, neginf) for p in (cx.real, cx.imag)]
        return cx.make_complex(*parts)
    if not dtypes.is_float(a.dtype):
        return a
    info = np.finfo(a.dtype)
    hi = info.max if posinf is None else posinf
    lo = info.min if neginf is None else neginf
    a = where(a != a, _c(a, nan), a)
    a = where(a == _c(a, np.inf), _c(a, hi), a)
    return where(a == _c(a, -np.inf), _c(a, lo), a)
