"""The normal distribution (``jax.scipy.stats.norm``): ``pdf``, ``logpdf``, ``cdf``,
``logcdf``, ``sf``, ``logsf``, ``ppf``.

>>> from spmd.scipy.stats import norm
>>> float(norm.pdf(0.0))  # doctest: +ELLIPSIS
0.398942...
"""

from __future__ import annotations

import numpy as np

import spmd.numpy as snp
from spmd.numpy._util import promote_and_broadcast
from spmd.scipy import special

_HALF_LOG_2PI = 0.5 * float(np.log(2 * np.pi))


def _std(x, loc, scale, name):
    x, loc, scale = promote_and_broadcast(x, loc, scale, fname=f"spmd.scipy.stats.norm.{name}",
                                          to_float=True)
    return (x - loc) / scale, scale


def logpdf(x, loc=0, scale=1):
    """``log N(x; loc, scale^2)``."""
    z, s = _std(x, loc, scale, "logpdf")
    return -0.5 * z * z - _HALF_LOG_2PI - snp.log(s)


def pdf(x, loc=0, scale=1):
    """The density."""
    return snp.exp(logpdf(x, loc, scale))


def cdf(x, loc=0, scale=1):
    """The distribution function."""
    return special.ndtr(_std(x, loc, scale, "cdf")[0])


def logcdf(x, loc=0, scale=1):
    """``log cdf`` (accurate in the left tail)."""
    return special.log_ndtr(_std(x, loc, scale, "logcdf")[0])


def sf(x, loc=0, scale=1):
    """The survival function ``1 - cdf``."""
    return special.ndtr(-_std(x, loc, scale, "sf")[0])


def logsf(x, loc=0, scale=1):
    """``log sf`` (accurate in the right tail)."""
    return special.log_ndtr(-_std(x, loc, scale, "logsf")[0])


def ppf(q, loc=0, scale=1):
    """The quantile function (inverse of :func:`cdf`)."""
    q, loc, scale = promote_and_broadcast(q, loc, scale, fname="spmd.scipy.stats.norm.ppf",
                                          to_float=True)
    return loc + scale * special.ndtri(q)
