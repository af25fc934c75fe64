"""``spmd.scipy.special`` (as ``jax.scipy.special``).

>>> from spmd.scipy.special import logsumexp, expit
>>> float(expit(0.0))
0.5
"""

from __future__ import annotations

import numpy as np

import spmd.numpy as snp
from spmd import lax
from spmd.compiler.core import dtypes
from spmd.errors import DTypeError
from spmd.nn import logsumexp as lse
from spmd.numpy._util import check_arraylike, promote_and_broadcast, promote_to_float

__all__ = ["betaln", "digamma", "entr", "erf", "erfc", "erfinv", "expit", "gamma", "gammaln",
           "log_ndtr", "log_softmax", "logit", "logsumexp", "ndtr", "ndtri", "polygamma",
           "softmax", "xlog1py", "xlogy"]


def _f(x, name):
    check_arraylike(f"spmd.scipy.special.{name}", x)
    (a,) = promote_to_float(x, fname=f"spmd.scipy.special.{name}")
    return a


def erf(x):
    """The error function."""
    return lax.erf(_f(x, "erf"))


def erfc(x):
    """``1 - erf(x)``, accurate in the right tail."""
    return lax.erfc(_f(x, "erfc"))


def erfinv(x):
    """The inverse error function."""
    return lax.erf_inv(_f(x, "erfinv"))


def gammaln(x):
    """``log |Gamma(x)|``."""
    return lax.lgamma(_f(x, "gammaln"))


def gamma(x):
    """``Gamma(x)`` (sign from the reflection formula for negative ``x``)."""
    a = _f(x, "gamma")
    # Gamma is negative on (-2k-1, -2k) for k >= 0.
    neg = (a < 0) & (snp.floor(a) % 2 != 0)
    return snp.where(neg, -1.0, 1.0) * snp.exp(lax.lgamma(a))


def betaln(a, b):
    """``log |B(a, b)|``."""
    x, y = promote_and_broadcast(a, b, fname="spmd.scipy.special.betaln", to_float=True)
    return lax.lgamma(x) + lax.lgamma(y) - lax.lgamma(x + y)


def digamma(x):
    """The logarithmic derivative of Gamma."""
    return lax.digamma(_f(x, "digamma"))


def polygamma(n, x):
    """The ``n``-th derivative of digamma (``n`` a static int)."""
    return lax.polygamma(int(n), _f(x, "polygamma"))


def expit(x):
    """The logistic sigmoid ``1 / (1 + exp(-x))``."""
    return lax.logistic(_f(x, "expit"))


def logit(x):
    """``log(x / (1 - x))``."""
    a = _f(x, "logit")
    return snp.log(a) - snp.log1p(-a)


def xlogy(x, y):
    """``x * log(y)``, 0 where ``x == 0``."""
    a, b = promote_and_broadcast(x, y, fname="spmd.scipy.special.xlogy", to_float=True)
    zero = a == 0
    return snp.where(zero, 0.0, a * snp.log(snp.where(zero, 1.0, b)))


def xlog1py(x, y):
    """``x * log1p(y)``, 0 where ``x == 0``."""
    a, b = promote_and_broadcast(x, y, fname="spmd.scipy.special.xlog1py", to_float=True)
    zero = a == 0
    return snp.where(zero, 0.0, a * snp.log1p(snp.where(zero, 0.0, b)))


def entr(x):
    """``-x log x`` (0 at 0, ``-inf`` for negative ``x``)."""
    a = _f(x, "entr")
    if dtypes.is_complex(a.dtype):  # defined by the sign of x: real inputs only (as scipy)
        raise DTypeError(f"spmd.scipy.special.entr: complex input ({a.dtype}) is not "
                         "supported; pass a real array")
    neg = a < 0
    safe = snp.where(neg, 1.0, a)  # no log of a negative number, even in a masked branch
    return snp.where(neg, -np.inf, -xlogy(safe, safe))


def ndtr(x):
    """The standard normal CDF, ``erfc(-x / sqrt(2)) / 2`` (accurate in both tails)."""
    a = _f(x, "ndtr")
    return 0.5 * lax.erfc(-a * np.array(1 / np.sqrt(2.0), a.dtype))


def log_ndtr(x):
    """``log(ndtr(x))``, accurate in both tails (an asymptotic series below -8,
    ``log1p(-ndtr(-x))`` above 0)."""
    a = _f(x, "log_ndtr")
    far = a < -8.0
    s = snp.where(far, a, -8.0)
    z = 1.0 / (s * s)
    series = 1.0 - z + 3.0 * z * z - 15.0 * z ** 3
    asym = -0.5 * s * s - snp.log(-s) - 0.5 * np.log(2 * np.pi) + snp.log(series)
    mid = snp.where(far, 0.0, a)
    # Right of 0, log(1 - ndtr(-a)) keeps the tiny deficit that log(ndtr(a)) rounds away.
    right = snp.log1p(-ndtr(-snp.where(a > 0, mid, 0.0)))
    return snp.where(far, asym, snp.where(a > 0, right, snp.log(ndtr(mid))))


def ndtri(p):
    """The inverse of :func:`ndtr`."""
    a = _f(p, "ndtri")
    return np.array(np.sqrt(2.0), a.dtype) * lax.erf_inv(2.0 * a - 1.0)


def logsumexp(a, axis=None, b=None, keepdims: bool = False, return_sign: bool = False):
    """``log(sum(b * exp(a)))`` computed stably."""
    return lse(a, axis=axis, b=b, keepdims=keepdims, return_sign=return_sign)


def softmax(x, axis=None):
    """``exp(x) / sum(exp(x))`` over ``axis`` (all axes when None, as scipy)."""
    a = _f(x, "softmax")
    return snp.exp(a - logsumexp(a, axis=axis, keepdims=True))


def log_softmax(x, axis=None):
    """``x - logsumexp(x)`` over ``axis`` (all axes when None, as scipy)."""
    a = _f(x, "log_softmax")
    return a - logsumexp(a, axis=axis, keepdims=True)
