"""Differences, integration and interpolation: ``diff``, ``trapezoid``,
``searchsorted``, ``interp``, ``polyval``, built from the other ``spmd.numpy``
functions.

>>> import spmd.numpy as snp
>>> snp.diff(snp.array([1.0, 4.0, 9.0]))
Array([3., 5.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._elementwise import where
from spmd.numpy._joining import concatenate
from spmd.numpy._reductions import sum as sum_
from spmd.numpy._shape import broadcast_to
from spmd.numpy._util import (canonicalize_axis, check_arraylike, checked_array, promote_dtypes,
                              promote_to_float, require_static, to_array)

__all__ = ["diff", "interp", "polyval", "searchsorted", "trapezoid"]


def diff(a, n: int = 1, axis: int = -1, prepend=None, append=None):
    """The ``n``-th discrete difference along ``axis`` (``!=`` for bools, as numpy)."""
    fname = "spmd.numpy.diff"
    x = checked_array(a, fname)
    require_static(n, fname, "n")
    if int(n) < 0:
        raise ArgumentError(f"{fname}: n={n} must be non-negative")
    ax = canonicalize_axis(axis, x.ndim, fname)
    parts = []
    for extra, side in ((prepend, 0), (append, 1)):
        if extra is None:
            continue
        e = to_array(extra, fname=fname)
        if e.ndim == 0:
            shape = list(x.shape)
            shape[ax] = 1
            e = _full_like_shape(e, shape)
        parts.append((side, e))
    pieces = [e for w, e in parts if w == 0] + [x] + [e for w, e in parts if w == 1]
    if len(pieces) > 1:
        x = concatenate(pieces, axis=ax)
    for _ in range(int(n)):
        hi = tuple(slice(1, None) if d == ax else slice(None) for d in range(x.ndim))
        lo = tuple(slice(None, -1) if d == ax else slice(None) for d in range(x.ndim))
        x = (x[hi] != x[lo]) if x.dtype == np.bool_ else x[hi] - x[lo]
    return x


def _full_like_shape(e, shape):
    return broadcast_to(e, tuple(shape))


def searchsorted(a, v, side: str = "left", sorter=None, *, method: str = "compare_all"):
    """Indices where ``v``'s entries would be inserted in the sorted 1-d ``a`` to keep
    it sorted (``side='right'``: after equal entries).  Compares every pair
    (``len(a) * v.size`` work)."""
    fname = "spmd.numpy.searchsorted"
    check_arraylike(fname, a, v)
    x, y = promote_dtypes(a, v, fname="spmd.numpy.searchsorted")
    if x.ndim != 1:
        raise ShapeError(f"{fname}: a must be 1-d, got shape {x.shape}")
    if side not in ("left", "right"):
        raise ArgumentError(f"{fname}: side={side!r} must be 'left' or 'right'")
    if sorter is not None:
        x = x[to_array(sorter)]
    cmp = (x < y[..., None]) if side == "left" else (x <= y[..., None])
    return sum_(cmp, axis=-1, dtype=np.int32)


def interp(x, xp, fp, left=None, right=None, period=None):
    """Linear interpolation of the points ``(xp, fp)`` (``xp`` increasing) at ``x``;
    ``left``/``right`` (default ``fp[0]``/``fp[-1]``) outside them."""
    fname = "spmd.numpy.interp"
    if period is not None:
        raise ArgumentError(f"{fname}: period is not supported")
    check_arraylike(fname, x, xp, fp)
    xs, xps, fps = promote_to_float(x, xp, fp, fname=fname)
    if xps.ndim != 1 or fps.shape != xps.shape or xps.shape[0] == 0:
        raise ShapeError(f"{fname}: xp and fp must be 1-d of one non-zero length, got shapes "
                         f"{xps.shape} and {fps.shape}")
    n = xps.shape[0]
    i = searchsorted(xps, xs, side="right").clip(1, n - 1) if n > 1 else None
    if i is None:
        out = fps[0] + xs * 0
    else:
        x0, x1, f0, f1 = xps[i - 1], xps[i], fps[i - 1], fps[i]
        dx = x1 - x0
        t = where(dx == 0, np.array(0, xs.dtype), (xs - x0) / where(dx == 0, 1, dx))
        out = f0 + t * (f1 - f0)
    lo = fps[0] if left is None else left
    hi = fps[-1] if right is None else right
    out = where(xs < xps[0], lo, out)
    return where(xs > xps[-1], hi, out)


def polyval(p, x):
    """The polynomial with coefficients ``p`` (highest power first) at ``x`` (Horner)."""
    check_arraylike("spmd.numpy.polyval", p, x)
    c, xs = promote_dtypes(p, x, fname="spmd.numpy.polyval")
    if c.ndim != 1:
        raise ShapeError(f"spmd.numpy.polyval: p must be 1-d, got shape {c.shape}")
    out = xs * 0
    for k in range(c.shape[0]):
        out = out * xs + c[k]
    return out


def trapezoid(y, x=None, dx: float = 1.0, axis: int = -1):
    """The integral of ``y`` along ``axis`` by the trapezoidal rule."""
    fname = "spmd.numpy.trapezoid"
    (ys,) = promote_to_float(checked_array(y, fname), fname=fname)
    ax = canonicalize_axis(axis, ys.ndim, fname)
    hi = tuple(slice(1, None) if d == ax else slice(None) for d in range(ys.ndim))
    lo = tuple(slice(None, -1) if d == ax else slice(None) for d in range(ys.ndim))
    avg = (ys[hi] + ys[lo]) * 0.5
    if x is None:
        return sum_(avg, axis=ax) * dx
    d = diff(checked_array(x, fname), axis=ax if checked_array(x, fname).ndim > 1 else -1)
    if d.ndim == 1 and ys.ndim > 1:
        d = d.reshape(tuple(d.shape[0] if k == ax else 1 for k in range(ys.ndim)))
    return sum_(avg * d, axis=ax)
