"""Index helpers and small array utilities of numpy: ``unravel_index``,
``ravel_multi_index``, ``indices``, ``tril_indices``/``triu_indices``/``diag_indices``,
``rot90``, ``select``, ``append``, ``delete``, ``isin``, ``bincount``, ``vander``,
``cov``, ``corrcoef``, ``vectorize`` (composed from the other functions).

>>> import spmd.numpy as snp
>>> snp.select([snp.arange(3) < 1, snp.arange(3) > 1], [10, 20], -1)
Array([10, -1, 20], dtype=int32)
"""

from __future__ import annotations

import functools

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.trace import Tracer
from spmd.errors import ArgumentError, ConcretizationError, ShapeError
from spmd.numpy._calculus import diff, searchsorted
from spmd.numpy._complex import conj
from spmd.numpy._creation import arange, asarray, linspace, ones, zeros
from spmd.numpy._diagonals import diagonal
from spmd.numpy._elementwise import sqrt, where
from spmd.numpy._joining import concatenate
from spmd.numpy._reductions import any as any_, mean
from spmd.numpy._shape import broadcast_arrays, broadcast_to, stack, swapaxes
from spmd.numpy._take import take
from spmd.numpy._tiling import flip
from spmd.numpy._util import (canonicalize_axis, check_arraylike, promote_to_float,
                              require_static, to_array)

__all__ = ["append", "bincount", "corrcoef", "cov", "delete", "diag_indices", "histogram",
           "histogram_bin_edges", "indices", "isin", "ravel_multi_index", "rot90", "select",
           "tril_indices", "triu_indices", "unravel_index", "vander", "vectorize"]


def _arr(a, fname):
    check_arraylike(fname, a)
    return to_array(a, fname=fname)


def _static_shape(shape, fname):
    require_static(shape, fname, "shape", "tuple of ints")
    return tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))


def unravel_index(indices, shape):
    """Flat indices into a tuple of coordinate arrays for ``shape`` (C order);
    out-of-range indices are clipped, as JAX does."""
    fname = "spmd.numpy.unravel_index"
    shp = _static_shape(shape, fname)
    i = _arr(indices, fname)
    if not dtypes.is_int(i.dtype):
        raise ArgumentError(f"{fname}: indices must be integers, got {i.dtype}")
    total = int(np.prod(shp))
    i = ((i % total) + total) % total if total else i  # negative ones count from the end
    out = []
    for s in reversed(shp):
        out.append(i % s)
        i = i // s
    return tuple(reversed(out))


def ravel_multi_index(multi_index, dims, mode: str = "raise", order: str = "C"):
    """Coordinate arrays into flat indices for ``dims`` (``mode``: ``'clip'`` or
    ``'wrap'``; ``'raise'`` checks concrete indices)."""
    fname = "spmd.numpy.ravel_multi_index"
    shp = _static_shape(dims, fname)
    if len(multi_index) != len(shp) or order != "C":
        raise ArgumentError(f"{fname}: needs one index array per dimension of {shp} and "
                            "order='C'")
    out = 0
    for idx, s in zip(multi_index, shp):
        i = _arr(idx, fname)
        if mode == "clip":
            i = i.clip(0, s - 1)
        elif mode == "wrap":
            i = i % s
        elif mode == "raise":
            if not isinstance(idx, Tracer) and ((np.asarray(i) < 0).any() or
                                                (np.asarray(i) >= s).any()):
                raise ArgumentError(f"{fname}: an index is out of bounds for size {s} "
                                    "(mode='raise'); use mode='clip' or 'wrap'")
        else:
            raise ArgumentError(f"{fname}: mode={mode!r} must be 'raise', 'clip' or 'wrap'")
        out = out * s + i
    return out


def indices(dimensions, dtype=None, sparse: bool = False):
    """A grid of coordinate arrays (``numpy.indices``)."""
    shp = _static_shape(dimensions, "spmd.numpy.indices")
    dt = dtypes.default_int() if dtype is None else dtype
    grids = []
    for d, s in enumerate(shp):
        g = arange(s, dtype=dt).reshape(tuple(s if k == d else 1 for k in range(len(shp))))
        grids.append(g if sparse else broadcast_to(g, shp))
    return tuple(grids) if sparse else stack(grids) if grids else arange(0, dtype=dt)


def _static_indices(fn, *args):
    return tuple(asarray(a.astype(dtypes.default_int())) for a in fn(*args))


def tril_indices(n: int, k: int = 0, m: int | None = None):
    """Indices of the lower triangle of an ``(n, m)`` array (static)."""
    return _static_indices(np.tril_indices, int(n), int(k), m)


def triu_indices(n: int, k: int = 0, m: int | None = None):
    """Indices of the upper triangle of an ``(n, m)`` array (static)."""
    return _static_indices(np.triu_indices, int(n), int(k), m)


def diag_indices(n: int, ndim: int = 2):
    """Indices of the main diagonal of an ``n``-sided ``ndim``-d array (static)."""
    return _static_indices(np.diag_indices, int(n), int(ndim))


def rot90(m, k: int = 1, axes=(0, 1)):
    """``m`` rotated by 90 degrees ``k`` times in the plane of ``axes``."""
    x = _arr(m, "spmd.numpy.rot90")
    a0, a1 = (canonicalize_axis(a, x.ndim, "spmd.numpy.rot90", "axes") for a in axes)
    if a0 == a1:
        raise ArgumentError(f"spmd.numpy.rot90: axes={axes} must name two different axes")
    k = int(k) % 4
    if k == 0:
        return x
    if k == 2:
        return flip(flip(x, a0), a1)
    if k == 1:
        return swapaxes(flip(x, a1), a0, a1)
    return flip(swapaxes(x, a0, a1), a1)


def select(condlist, choicelist, default=0):
    """The first ``choicelist[i]`` whose ``condlist[i]`` holds, else ``default``."""
    if len(condlist) != len(choicelist):
        raise ArgumentError(f"spmd.numpy.select: {len(condlist)} conditions and "
                            f"{len(choicelist)} choices; they must match")
    if not condlist:
        raise ArgumentError("spmd.numpy.select: condlist must not be empty")
    out = default
    for c, v in zip(reversed(condlist), reversed(choicelist)):
        c = to_array(c)
        if c.dtype != np.bool_:
            raise ArgumentError(f"spmd.numpy.select: conditions must be bool arrays, got "
                                f"{c.dtype}")
        out = where(c, v, out)
    return out


def append(arr, values, axis=None):
    """``arr`` with ``values`` appended along ``axis`` (both flattened when None)."""
    check_arraylike("spmd.numpy.append", arr, values)
    x, v = to_array(arr), to_array(values)
    if axis is None:
        return concatenate([x.reshape(-1), v.reshape(-1)])
    return concatenate([x, v], axis=axis)


def delete(arr, obj, axis=None):
    """``arr`` without the entries ``obj`` (a static int, sequence or slice) along
    ``axis`` (the flattened array when None)."""
    fname = "spmd.numpy.delete"
    x = _arr(arr, fname)
    if axis is None:
        x, axis = x.reshape(-1), 0
    ax = canonicalize_axis(axis, x.ndim, fname)
    n = x.shape[ax]
    require_static(obj, fname, "obj", "int, sequence of ints or slice")
    drop = np.arange(n)[obj] if isinstance(obj, slice) else np.asarray(obj)
    if drop.dtype.kind not in "iu" and drop.size:
        raise ArgumentError(f"{fname}: obj={obj!r} must hold integers")
    drop = drop.astype(np.int64).reshape(-1)
    if ((drop < -n) | (drop >= n)).any():
        raise ArgumentError(f"{fname}: obj={obj!r} is out of bounds for axis {ax} of size {n}")
    keep = np.setdiff1d(np.arange(n), drop % n if n else drop)
    return take(x, keep.astype(np.int32), axis=ax)


def isin(element, test_elements, assume_unique: bool = False, invert: bool = False):
    """Elementwise: is ``element`` among ``test_elements`` (compares every pair)."""
    check_arraylike("spmd.numpy.isin", element, test_elements)
    e, t = to_array(element), to_array(test_elements).reshape(-1)
    out = any_(e[..., None] == t, axis=-1)
    return ~out if invert else out


def bincount(x, weights=None, minlength: int = 0, *, length: int | None = None):
    """Counts (or summed ``weights``) of each non-negative int in ``x``; under ``jit``
    pass a static ``length`` (values at or past it are dropped, as in JAX)."""
    fname = "spmd.numpy.bincount"
    v = _arr(x, fname)
    if v.ndim != 1 or not dtypes.is_int(v.dtype):
        raise ArgumentError(f"{fname}: x must be a 1-d integer array, got {v}")
    if length is None:
        if isinstance(x, Tracer) or isinstance(v, Tracer):
            raise ConcretizationError(f"{fname}: the output length depends on max(x); pass "
                                      "length=... (a static int) under jit")
        length = max(int(np.asarray(v).max(initial=-1)) + 1, int(minlength))
    w = 1 if weights is None else _arr(weights, fname)
    dt = dtypes.default_int() if weights is None else \
        promote_to_float(w, fname=fname)[0].dtype if not dtypes.is_int(to_array(w).dtype) \
        else to_array(w).dtype
    return zeros(int(length), dt).at[v].add(w, mode="drop")


def histogram_bin_edges(a, bins=10, range=None, weights=None):  # noqa: A002
    """The edges of ``bins`` equal bins over ``range`` (default: ``a``'s min to max,
    widened by 0.5 each way when they are equal), or ``bins`` itself when it is an
    array of edges; in ``a``'s inexact dtype (``weights`` is unused, as in JAX).

    >>> histogram_bin_edges(snp.asarray([2, 5, 3, 6, 4, 1]), bins=5)  # doctest: +SKIP
    Array([1., 2., 3., 4., 5., 6.], dtype=float32)
    """
    fname = "spmd.numpy.histogram_bin_edges"
    v = _arr(a, fname)
    dt = v.dtype if dtypes.is_inexact(v.dtype) else dtypes.default_float()
    if isinstance(bins, str):
        raise ArgumentError(f"{fname}: bins={bins!r}: named binning rules are not "
                            "supported (as in JAX); give a number of bins or the edges")
    if np.ndim(bins) == 1:
        return asarray(bins, dtype=dt)
    if isinstance(bins, Tracer) or np.ndim(bins) != 0 or isinstance(bins, bool) or \
            not float(np.asarray(bins)).is_integer() or int(np.asarray(bins)) < 1:
        raise ArgumentError(f"{fname}: bins must be a positive int (static under jit) or a "
                            f"1-d array of edges, got {bins!r}")
    lo, hi = (v.min(), v.max()) if range is None else range
    if range is not None and np.shape(range) != (2,):
        raise ArgumentError(f"{fname}: range must be None or (min, max), got {range!r}")
    lo, hi = asarray(lo, dtype=dt), asarray(hi, dtype=dt)
    same = lo == hi  # (numpy's rule: one point spreads over a unit-wide range)
    lo, hi = where(same, lo - 0.5, lo), where(same, hi + 0.5, hi)
    return linspace(lo, hi, int(np.asarray(bins)) + 1, dtype=dt)


def histogram(a, bins=10, range=None, weights=None, density=None):  # noqa: A002
    """``(counts, edges)`` of ``a``'s values (flattened) in the bins of
    :func:`histogram_bin_edges`: each bin holds ``[edge, next edge)``, the last one its
    right edge too; values outside the edges are not counted.  ``weights`` (the shape
    of ``a``) sum instead of counting; ``density`` divides by the total and the bin
    widths.  The counts are floats, as in JAX.

    >>> counts, edges = histogram(snp.asarray([1, 2, 3, 10, 11, 15, 19, 25]), bins=8)  # doctest: +SKIP
    """
    fname = "spmd.numpy.histogram"
    v = _arr(a, fname)
    dt = v.dtype if dtypes.is_inexact(v.dtype) else dtypes.default_float()
    if weights is None:
        w = ones(v.shape, dt)
    else:
        w = _arr(weights, fname)
        if w.shape != v.shape:
            raise ShapeError(f"{fname}: weights of shape {w.shape} must have a's shape "
                             f"{v.shape}")
        dt = np.result_type(dt, w.dtype) if dtypes.is_inexact(w.dtype) else dt
        w = w.astype(dt)
    edges = histogram_bin_edges(v, bins, range)
    flat = v.astype(dt).reshape(-1)
    n = edges.shape[0]
    # Bin k + 1 for a value in [edges[k], edges[k + 1]); 0 and n: outside (dropped).
    idx = searchsorted(edges, flat, side="right")
    idx = where(flat == edges[n - 1], n - 1, idx)
    counts = zeros(n + 1, dt).at[idx].add(w.reshape(-1))[1:n]
    if density:
        counts = counts / (diff(edges) * counts.sum())
    return counts, edges


def vander(x, N: int | None = None, increasing: bool = False):
    """The Vandermonde matrix: columns are powers of ``x``."""
    v = _arr(x, "spmd.numpy.vander")
    if v.ndim != 1:
        raise ShapeError(f"spmd.numpy.vander: x must be 1-d, got shape {v.shape}")
    n = v.shape[0] if N is None else int(N)
    p = arange(n) if increasing else arange(n - 1, -1, -1)
    return v[:, None] ** p.astype(v.dtype)


def cov(m, y=None, rowvar: bool = True, bias: bool = False, ddof: int | None = None,
        fweights=None, aweights=None):
    """The covariance matrix of the variables (rows, or columns when not ``rowvar``)."""
    fname = "spmd.numpy.cov"
    if fweights is not None or aweights is not None:
        raise ArgumentError(f"{fname}: fweights and aweights are not supported")
    (x,) = promote_to_float(_arr(m, fname), fname=fname)
    x = x.reshape(1, -1) if x.ndim == 1 else x
    if not rowvar:
        x = x.T
    if y is not None:
        (yy,) = promote_to_float(_arr(y, fname), fname=fname)
        yy = yy.reshape(1, -1) if yy.ndim == 1 else yy
        x = concatenate([x, yy if rowvar else yy.T], axis=0)
    n = x.shape[1]
    d = (0 if bias else 1) if ddof is None else int(ddof)
    xc = x - mean(x, axis=1, keepdims=True)
    c = (xc @ conj(xc).T) / (n - d)  # conj: complex covariances are Hermitian (numpy)
    return c[0, 0] if c.shape == (1, 1) else c


def corrcoef(x, y=None, rowvar: bool = True):
    """Pearson correlation coefficients (``cov`` normalised by the standard deviations)."""
    c = cov(x, y, rowvar)
    if c.ndim == 0:
        return c / c
    d = sqrt(diagonal(c))
    return (c / d[:, None] / d[None, :]).clip(-1, 1)


def vectorize(pyfunc=None, *, excluded=frozenset(), signature: str | None = None):
    """``pyfunc`` applied elementwise over its broadcast array arguments, by ``vmap``
    over every dimension (``jax.numpy.vectorize`` without ``signature``)."""
    if pyfunc is None:
        return functools.partial(vectorize, excluded=excluded, signature=signature)
    if signature is not None:
        raise NotImplementedError("spmd.numpy.vectorize: signature= is not supported; "
                                  "vmap the core function over the loop dimensions")

    @functools.wraps(pyfunc)
    def wrapped(*args, **kwargs):
        # Another front end: import spmd.numpy loads none of them (nor their installer calls).
        from spmd.vectorize import vmap

        dyn = [i for i in range(len(args)) if i not in excluded]
        arrays = broadcast_arrays(*[args[i] for i in dyn]) if dyn else []

        def call(*vals):
            full = list(args)
            for i, v in zip(dyn, vals):
                full[i] = v
            return pyfunc(*full, **kwargs)

        f = call
        for _ in range(arrays[0].ndim if arrays else 0):
            f = vmap(f)
        return f(*arrays)

    return wrapped
