"""Diagonals and triangles: ``diagonal``, ``trace``, ``diag``, ``tril``, ``triu``,
built from the other ``spmd.numpy`` functions (so each differentiates, batches and
partitions through them).

>>> import spmd.numpy as snp
>>> snp.trace(snp.eye(3))
Array(3., dtype=float32)
"""

from __future__ import annotations

import numpy as np

from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._creation import zeros, zeros_like
from spmd.numpy._elementwise import where
from spmd.numpy._reductions import sum as sum_
from spmd.numpy._shape import moveaxis
from spmd.numpy._util import canonicalize_axis, checked_array

__all__ = ["diag", "diagonal", "trace", "tril", "triu"]


def diagonal(a, offset: int = 0, axis1: int = 0, axis2: int = 1):
    """The ``offset``-th diagonal of the 2-d slices over ``axis1`` and ``axis2``, as a
    last axis (numpy's layout)."""
    fname = "spmd.numpy.diagonal"
    x = checked_array(a, fname)
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
    x = checked_array(v, "spmd.numpy.diag")
    k = int(k)
    if x.ndim == 2:
        return diagonal(x, k)
    if x.ndim != 1:
        raise ShapeError(f"spmd.numpy.diag: v must be 1-d or 2-d, got shape {x.shape}")
    n = x.shape[0] + abs(k)
    i = np.arange(x.shape[0])
    return zeros((n, n), x.dtype).at[i + max(-k, 0), i + max(k, 0)].set(x)


def _triangle(m, k, lower, fname):
    x = checked_array(m, fname)
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
