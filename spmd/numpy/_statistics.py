"""Counting and statistics: ``count_nonzero``, the NaN-ignoring reductions
(``nansum``, ``nanmean``, ``nanmax``, ``nanmin``), ``average``, ``quantile``,
``percentile``, ``median``, built from the other ``spmd.numpy`` functions.

>>> import spmd.numpy as snp
>>> snp.median(snp.array([3.0, 1.0, 2.0]))
Array(2., dtype=float32)
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.numpy._elementwise import floor, where
from spmd.numpy._reductions import (all as all_, any as any_, max as max_, mean, min as min_, sort,
                                    sum as sum_)
from spmd.numpy._shape import broadcast_to, moveaxis
from spmd.numpy._take import take
from spmd.numpy._util import canonicalize_axis, checked_array, promote_to_float, to_array

__all__ = ["average", "count_nonzero", "median", "nanmax", "nanmean", "nanmin", "nansum",
           "percentile", "quantile"]


def count_nonzero(a, axis=None, keepdims: bool = False):
    """The number of non-zero entries (default int)."""
    x = checked_array(a, "spmd.numpy.count_nonzero")
    return sum_(x != 0, axis=axis, dtype=dtypes.default_int(), keepdims=keepdims)


def _nan_masked(a, fill, fname):
    x = checked_array(a, fname)
    if not dtypes.is_inexact(x.dtype):  # complex: NaN in either part (x != x)
        return x, None
    nan = x != x
    return where(nan, np.array(fill, x.dtype), x), nan


def nansum(a, axis=None, dtype=None, keepdims: bool = False):
    """``sum`` with NaNs counted as zero."""
    x, _ = _nan_masked(a, 0, "spmd.numpy.nansum")
    return sum_(x, axis=axis, dtype=dtype, keepdims=keepdims)


def nanmean(a, axis=None, dtype=None, keepdims: bool = False):
    """``mean`` over the non-NaN entries (NaN where there are none)."""
    x, nan = _nan_masked(a, 0, "spmd.numpy.nanmean")
    (x,) = promote_to_float(x, fname="spmd.numpy.nanmean")
    count = sum_(~nan if nan is not None else (x == x), axis=axis, dtype=x.dtype,
                 keepdims=keepdims)
    return sum_(x, axis=axis, dtype=dtype, keepdims=keepdims) / count


def _nan_extreme(a, axis, keepdims, largest):
    fname = "spmd.numpy.nanmax" if largest else "spmd.numpy.nanmin"
    x, nan = _nan_masked(a, -np.inf if largest else np.inf, fname)
    out = (max_ if largest else min_)(x, axis=axis, keepdims=keepdims)
    if nan is None:
        return out
    return where(all_(nan, axis=axis, keepdims=keepdims), np.array(np.nan, x.dtype), out)


def nanmax(a, axis=None, keepdims: bool = False):
    """``max`` ignoring NaNs (NaN where every entry is NaN)."""
    return _nan_extreme(a, axis, keepdims, True)


def nanmin(a, axis=None, keepdims: bool = False):
    """``min`` ignoring NaNs (NaN where every entry is NaN)."""
    return _nan_extreme(a, axis, keepdims, False)


def average(a, axis=None, weights=None, returned: bool = False, keepdims: bool = False):
    """The (weighted) mean; with ``returned=True`` also the sum of the weights."""
    fname = "spmd.numpy.average"
    (x,) = promote_to_float(checked_array(a, fname), fname=fname)
    if weights is None:
        out = mean(x, axis=axis, keepdims=keepdims)
        if not returned:
            return out
        count = x.size if axis is None else np.prod(
            [x.shape[canonicalize_axis(i, x.ndim, fname)]
             for i in (axis if isinstance(axis, (tuple, list)) else (axis,))])
        return out, broadcast_to(np.array(count, out.dtype), out.shape)
    x, w = promote_to_float(x, checked_array(weights, fname), fname=fname)
    if w.shape != x.shape:
        if axis is None or w.ndim != 1 or isinstance(axis, (tuple, list)):
            raise ShapeError(f"{fname}: weights of shape {w.shape} differ from a's shape "
                             f"{x.shape}; 1-d weights need an int axis")
        ax = canonicalize_axis(axis, x.ndim, fname)
        if w.shape[0] != x.shape[ax]:
            raise ShapeError(f"{fname}: {w.shape[0]} weights for axis {ax} of size "
                             f"{x.shape[ax]}")
        w = w.reshape(tuple(w.shape[0] if d == ax else 1 for d in range(x.ndim)))
        w = broadcast_to(w, x.shape)
    wsum = sum_(w, axis=axis, keepdims=keepdims)
    out = sum_(x * w, axis=axis, keepdims=keepdims) / wsum
    return (out, broadcast_to(wsum, out.shape)) if returned else out


def quantile(a, q, axis=None, method: str = "linear", keepdims: bool = False):
    """The ``q``-th quantiles (``q`` in [0, 1], a scalar or 1-d) along ``axis`` with
    linear interpolation; NaN where the data holds a NaN (as numpy)."""
    fname = "spmd.numpy.quantile"
    if dtypes.is_complex(get_aval(checked_array(a, fname)).dtype):
        # JAX refuses too: a quantile of complex numbers is poorly defined.
        raise DTypeError(f"{fname}: complex input ({get_aval(checked_array(a, fname)).dtype}) "
                         "is not supported (JAX refuses it too: complex numbers have no order to "
                         "interpolate along); use snp.real(x), snp.imag(x) or snp.abs(x)")
    if method != "linear":
        raise ArgumentError(f"{fname}: method={method!r} is not supported; use 'linear'")
    (x,) = promote_to_float(checked_array(a, fname), fname=fname)
    if axis is None:
        x, ax = x.reshape(-1), 0
        kept = (1,) * checked_array(a, fname).ndim
    else:
        ax = canonicalize_axis(axis, x.ndim, fname)
        kept = tuple(1 if d == ax else s for d, s in enumerate(x.shape))
    x = moveaxis(x, ax, -1)
    n = x.shape[-1]
    qa = to_array(q, x.dtype, fname)
    if qa.ndim > 1:
        raise ShapeError(f"{fname}: q must be a scalar or 1-d, got shape {qa.shape}")
    s = sort(x, axis=-1)
    pos = qa * (n - 1)
    lo = floor(pos)
    frac = pos - lo
    lo_i = lo.astype(np.int32)
    hi_i = (lo_i + 1).clip(0, n - 1)
    lo_v, hi_v = take(s, lo_i.reshape(-1), axis=-1), take(s, hi_i.reshape(-1), axis=-1)
    out = lo_v + (hi_v - lo_v) * frac.reshape(-1)            # (..., Q)
    out = where(any_(x != x, axis=-1, keepdims=True), np.array(np.nan, x.dtype), out)
    if keepdims:
        out = _keep_quantile(out, kept, ax if axis is not None else None)
    out = moveaxis(out, -1, 0)
    return out[0] if qa.ndim == 0 else out


def _keep_quantile(out, kept, ax):
    """``out`` (..., Q) with the reduced axis kept as size 1 (before the Q axis)."""
    shape = list(kept) if ax is None else [s for d, s in enumerate(kept) if d != ax]
    if ax is None:
        return out.reshape(tuple(shape) + (out.shape[-1],))
    shape.insert(ax, 1)
    return out.reshape(tuple(shape) + (out.shape[-1],))


def percentile(a, q, axis=None, method: str = "linear", keepdims: bool = False):
    """The ``q``-th percentiles (``q`` in [0, 100]); see :func:`quantile`."""
    (qa,) = promote_to_float(to_array(q, fname="spmd.numpy.percentile"),
                             fname="spmd.numpy.percentile")
    return quantile(a, qa / 100, axis=axis, method=method, keepdims=keepdims)


def median(a, axis=None, keepdims: bool = False):
    """The median (the 0.5 quantile) along ``axis``."""
    return quantile(a, 0.5, axis=axis, keepdims=keepdims)
