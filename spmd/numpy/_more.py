"""More of numpy's API, built from the other ``spmd.numpy`` functions (so every one
differentiates, batches and partitions through them): diagonals and triangles,
``meshgrid``, ``diff``, ``kron``, ``cross``, counting and comparison, NaN-ignoring
reductions, ``average``, quantiles, ``searchsorted``, ``interp``, ``polyval``,
``trapezoid``, ``logspace``.

>>> import spmd.numpy as snp
>>> snp.trace(snp.eye(3))
Array(3., dtype=float32)
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.numpy._creation import asarray, linspace, zeros, zeros_like
from spmd.numpy._elementwise import floor, where
from spmd.numpy._reductions import (all as all_, any as any_, max as max_, mean, min as min_, sort,
                                    sum as sum_)
from spmd.numpy._shape import broadcast_to, moveaxis, stack
from spmd.numpy._shape_more import concatenate
from spmd.numpy._take import take
from spmd.numpy._util import (canonicalize_axis, check_arraylike, promote_dtypes, promote_to_float,
                              require_static, to_array)

__all__ = ["array_equal", "average", "count_nonzero", "cross", "diag", "diagonal", "diff",
           "interp", "kron", "logspace", "median", "meshgrid", "nanmax", "nanmean", "nanmin",
           "nansum", "percentile", "polyval", "quantile", "searchsorted", "trace",
           "trapezoid", "tril", "triu"]


def _arr(a, fname):
    check_arraylike(fname, a)
    return to_array(a, fname=fname)


# ------------------------------------------------------ diagonals, triangles

def diagonal(a, offset: int = 0, axis1: int = 0, axis2: int = 1):
    """The ``offset``-th diagonal of the 2-d slices over ``axis1`` and ``axis2``, as a
    last axis (numpy's layout)."""
    fname = "spmd.numpy.diagonal"
    x = _arr(a, fname)
    if x.ndim < 2:
        raise ShapeError(f"{fname}: needs at least 2 dimensions, got shape {x.shape}")
    ax1, ax2 = canonicalize_axis(axis1, x.ndim, fname, "axis1"), \
        canonicalize_axis(axis2, x.ndim, fname, "axis2")
    if ax1 == ax2:
        raise ArgumentError(f"{fname}: axis1 and axis2 are both {ax1}; they must differ")
    off = int(offset)
    x = moveaxis(x, (ax1, ax2), (-2, -1))
    n, m = x.shape[-2:]
    r0, c0 = max(-off, 0), max(off, 0)
    k = max(0, min(n - r0, m - c0))
    i = np.arange(k)
    return x[..., i + r0, i + c0]


def trace(a, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype=None):
    """The sum of the ``offset``-th diagonal (see :func:`diagonal`)."""
    return sum_(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


def diag(v, k: int = 0):
    """A 1-d ``v`` on the ``k``-th diagonal of a square matrix, or a 2-d ``v``'s
    ``k``-th diagonal."""
    x = _arr(v, "spmd.numpy.diag")
    k = int(k)
    if x.ndim == 2:
        return diagonal(x, k)
    if x.ndim != 1:
        raise ShapeError(f"spmd.numpy.diag: v must be 1-d or 2-d, got shape {x.shape}")
    n = x.shape[0] + abs(k)
    i = np.arange(x.shape[0])
    return zeros((n, n), x.dtype).at[i + max(-k, 0), i + max(k, 0)].set(x)


def _triangle(m, k, lower, fname):
    x = _arr(m, fname)
    if x.ndim < 2:
        raise ShapeError(f"{fname}: needs at least 2 dimensions, got shape {x.shape}")
    n, c = x.shape[-2:]
    mask = np.tri(n, c, int(k), dtype=bool)
    return where(mask if lower else ~np.tri(n, c, int(k) - 1, dtype=bool), x, zeros_like(x))


def tril(m, k: int = 0):
    """``m`` with the entries above the ``k``-th diagonal zeroed (last two axes)."""
    return _triangle(m, k, True, "spmd.numpy.tril")


def triu(m, k: int = 0):
    """``m`` with the entries below the ``k``-th diagonal zeroed (last two axes)."""
    return _triangle(m, k, False, "spmd.numpy.triu")


# ------------------------------------------------------------- shape makers

def meshgrid(*xi, copy: bool = True, sparse: bool = False, indexing: str = "xy"):
    """Coordinate arrays from 1-d coordinate vectors, as ``numpy.meshgrid``."""
    if indexing not in ("xy", "ij"):
        raise ArgumentError(f"spmd.numpy.meshgrid: indexing={indexing!r} must be 'xy' or 'ij'")
    arrs = [_arr(x, "spmd.numpy.meshgrid").reshape(-1) for x in xi]
    nd = len(arrs)
    out = []
    for i, x in enumerate(arrs):
        shape = [1] * nd
        shape[i] = x.shape[0]
        if indexing == "xy" and nd > 1 and i < 2:
            shape[i] = 1
            shape[1 - i] = x.shape[0]
        out.append(x.reshape(tuple(shape)))
    if sparse:
        return out
    full = tuple(np.broadcast_shapes(*[o.shape for o in out]))
    return [broadcast_to(o, full) for o in out]


def diff(a, n: int = 1, axis: int = -1, prepend=None, append=None):
    """The ``n``-th discrete difference along ``axis`` (``!=`` for bools, as numpy)."""
    fname = "spmd.numpy.diff"
    x = _arr(a, fname)
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


def kron(a, b):
    """The Kronecker product (block ``a[i, j] * b``), as ``numpy.kron``."""
    x, y = _promote(a, b, "kron")
    nd = max(x.ndim, y.ndim)
    x = x.reshape((1,) * (nd - x.ndim) + x.shape)
    y = y.reshape((1,) * (nd - y.ndim) + y.shape)
    xe = x.reshape(tuple(s for d in x.shape for s in (d, 1)))
    ye = y.reshape(tuple(s for d in y.shape for s in (1, d)))
    return (xe * ye).reshape(tuple(p * q for p, q in zip(x.shape, y.shape)))


def _promote(a, b, name):
    return promote_dtypes(a, b, fname=f"spmd.numpy.{name}")


def cross(a, b, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis=None):
    """The cross product of 3-vectors (2-vectors give the z component), as numpy."""
    x, y = _promote(a, b, "cross")
    if axis is not None:
        axisa = axisb = axisc = axis
    x = moveaxis(x, canonicalize_axis(axisa, x.ndim, "spmd.numpy.cross", "axisa"), -1)
    y = moveaxis(y, canonicalize_axis(axisb, y.ndim, "spmd.numpy.cross", "axisb"), -1)
    if x.shape[-1] not in (2, 3) or y.shape[-1] not in (2, 3):
        raise ShapeError(f"spmd.numpy.cross: the vector axes must have 2 or 3 components, got "
                         f"{x.shape[-1]} and {y.shape[-1]}")
    a0, a1 = x[..., 0], x[..., 1]
    b0, b1 = y[..., 0], y[..., 1]
    a2 = x[..., 2] if x.shape[-1] == 3 else None
    b2 = y[..., 2] if y.shape[-1] == 3 else None
    if a2 is None and b2 is None:
        return a0 * b1 - a1 * b0
    a2 = 0 if a2 is None else a2
    b2 = 0 if b2 is None else b2
    out = stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)
    return moveaxis(out, -1, canonicalize_axis(axisc, out.ndim, "spmd.numpy.cross", "axisc"))


# ---------------------------------------------------------------- counting

def count_nonzero(a, axis=None, keepdims: bool = False):
    """The number of non-zero entries (default int)."""
    x = _arr(a, "spmd.numpy.count_nonzero")
    return sum_(x != 0, axis=axis, dtype=dtypes.default_int(), keepdims=keepdims)


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


# ------------------------------------------------------- NaN-ignoring ones

def _nan_masked(a, fill, fname):
    x = _arr(a, fname)
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
    (x,) = promote_to_float(_arr(a, fname), fname=fname)
    if weights is None:
        out = mean(x, axis=axis, keepdims=keepdims)
        if not returned:
            return out
        count = x.size if axis is None else np.prod(
            [x.shape[canonicalize_axis(i, x.ndim, fname)]
             for i in (axis if isinstance(axis, (tuple, list)) else (axis,))])
        return out, broadcast_to(np.array(count, out.dtype), out.shape)
    x, w = promote_to_float(x, _arr(weights, fname), fname=fname)
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


# ---------------------------------------------------------------- quantiles

def quantile(a, q, axis=None, method: str = "linear", keepdims: bool = False):
    """The ``q``-th quantiles (``q`` in [0, 1], a scalar or 1-d) along ``axis`` with
    linear interpolation; NaN where the data holds a NaN (as numpy)."""
    fname = "spmd.numpy.quantile"
    if dtypes.is_complex(get_aval(_arr(a, fname)).dtype):
        # JAX refuses too: a quantile of complex numbers is poorly defined.
        raise DTypeError(f"{fname}: complex input ({get_aval(_arr(a, fname)).dtype}) is not "
                         "supported (JAX refuses it too: complex numbers have no order to "
                         "interpolate along); use snp.real(x), snp.imag(x) or snp.abs(x)")
    if method != "linear":
        raise ArgumentError(f"{fname}: method={method!r} is not supported; use 'linear'")
    (x,) = promote_to_float(_arr(a, fname), fname=fname)
    if axis is None:
        x, ax = x.reshape(-1), 0
        kept = (1,) * _arr(a, fname).ndim
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


# ------------------------------------------------------------ 1-d lookups

def searchsorted(a, v, side: str = "left", sorter=None, *, method: str = "compare_all"):
    """Indices where ``v``'s entries would be inserted in the sorted 1-d ``a`` to keep
    it sorted (``side='right'``: after equal entries).  Compares every pair
    (``len(a) * v.size`` work)."""
    fname = "spmd.numpy.searchsorted"
    check_arraylike(fname, a, v)
    x, y = _promote(a, v, "searchsorted")
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
    c, xs = _promote(p, x, "polyval")
    if c.ndim != 1:
        raise ShapeError(f"spmd.numpy.polyval: p must be 1-d, got shape {c.shape}")
    out = xs * 0
    for k in range(c.shape[0]):
        out = out * xs + c[k]
    return out


def trapezoid(y, x=None, dx: float = 1.0, axis: int = -1):
    """The integral of ``y`` along ``axis`` by the trapezoidal rule."""
    fname = "spmd.numpy.trapezoid"
    (ys,) = promote_to_float(_arr(y, fname), fname=fname)
    ax = canonicalize_axis(axis, ys.ndim, fname)
    hi = tuple(slice(1, None) if d == ax else slice(None) for d in range(ys.ndim))
    lo = tuple(slice(None, -1) if d == ax else slice(None) for d in range(ys.ndim))
    avg = (ys[hi] + ys[lo]) * 0.5
    if x is None:
        return sum_(avg, axis=ax) * dx
    d = diff(_arr(x, fname), axis=ax if _arr(x, fname).ndim > 1 else -1)
    if d.ndim == 1 and ys.ndim > 1:
        d = d.reshape(tuple(d.shape[0] if k == ax else 1 for k in range(ys.ndim)))
    return sum_(avg * d, axis=ax)


def logspace(start, stop, num: int = 50, endpoint: bool = True, base=10.0, dtype=None,
             axis: int = 0):
    """``base ** linspace(start, stop, num)``."""
    out = to_array(base) ** linspace(start, stop, num, endpoint=endpoint, axis=axis)
    return out if dtype is None else out.astype(dtype)
