"""Joining and splitting arrays: ``concatenate`` and the ``*stack`` functions,
``split`` and its variants (numpy semantics).

Each function is a thin composition of the structural primitives (``concatenate``,
``slice``, ``reshape``); all sizes, axes and split points are static.

>>> import spmd.numpy as snp
>>> [p.shape for p in snp.split(snp.arange(6), 3)]
[(2,), (2,), (2,)]
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core.array import Array
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.compiler.ops import slicing as sm
from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._shape import atleast_1d, atleast_2d, atleast_3d, ravel, reshape
from spmd.numpy._util import (canonicalize_axis, promote_dtypes, require_static, static_int,
                              to_array)

__all__ = ["array_split", "column_stack", "concatenate", "dstack", "hsplit", "hstack", "split",
           "vsplit", "vstack"]


def concatenate(arrays, axis=0, dtype=None):
    """Join arrays along an existing axis (``axis=None`` flattens them first).

    >>> concatenate([ones((2, 3)), zeros((1, 3))]).shape
    (3, 3)
    """
    if isinstance(arrays, Tracer) or hasattr(arrays, "aval"):
        arrays = list(arrays)  # an array is a sequence of its rows, as in numpy
    arrs = list(arrays)
    if not arrs:
        raise ArgumentError("spmd.numpy.concatenate: need at least one array to concatenate")
    arrs = promote_dtypes(*arrs, fname="spmd.numpy.concatenate")
    if dtype is not None:
        arrs = [to_array(a, dtype, "spmd.numpy.concatenate") for a in arrs]
    if axis is None:
        arrs, axis = [ravel(a) for a in arrs], 0
    shapes = [get_aval(a).shape for a in arrs]
    nd = len(shapes[0])
    if nd == 0:
        raise ShapeError("spmd.numpy.concatenate: zero-dimensional arrays cannot be "
                         "concatenated; use stack, or reshape them to 1-d first")
    ax = canonicalize_axis(axis, nd, "spmd.numpy.concatenate")
    for s in shapes[1:]:
        if len(s) != nd or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != ax):
            raise ShapeError(f"spmd.numpy.concatenate: array shapes {shapes} must match in "
                             f"every dimension except the concatenation axis {ax}")
    return sm.concatenate(arrs, ax)


def hstack(tup, dtype=None):
    """Stack along the second axis (the first for 1-d arrays)."""
    arrs = [atleast_1d(a) for a in tup]
    axis = 0 if arrs and get_aval(arrs[0]).ndim == 1 else 1
    return concatenate(arrs, axis=axis, dtype=dtype)


def vstack(tup, dtype=None):
    """Stack along the first axis, after making inputs at least 2-d."""
    return concatenate([atleast_2d(a) for a in tup], axis=0, dtype=dtype)


def dstack(tup, dtype=None):
    """Stack along the third axis, after making inputs at least 3-d."""
    return concatenate([atleast_3d(a) for a in tup], axis=2, dtype=dtype)


def column_stack(tup):
    """Stack 1-d arrays as columns of a 2-d array (2-d inputs as they are)."""
    arrs = []
    for a in tup:
        x = to_array(a)
        arrs.append(reshape(x, (-1, 1)) if get_aval(x).ndim < 2 else x)
    return concatenate(arrs, axis=1)


def _pieces(x, axis, bounds):
    """Slices ``x[b0:b1], x[b1:b2], ...`` along ``axis`` with Python's clamping."""
    n = get_aval(x).shape[axis]
    outs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        s, e, _ = slice(lo, hi).indices(n)
        outs.append(sm.slice_in_dim(x, s, max(s, e), 1, axis))
    return outs


def split(ary, indices_or_sections, axis: int = 0):
    """Split into equal sections (an int) or at the given indices (a sequence).

    >>> [p.shape for p in split(ones(6), 3)]
    [(2,), (2,), (2,)]
    """
    x = to_array(ary)
    shape = get_aval(x).shape
    ax = canonicalize_axis(axis, len(shape), "spmd.numpy.split")
    require_static(indices_or_sections, "spmd.numpy.split", "indices_or_sections",
                   "int or sequence of ints")
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0 or shape[ax] % k:
            raise ShapeError(f"spmd.numpy.split: array split does not result in an equal "
                             f"division: axis {ax} has size {shape[ax]}, not divisible into "
                             f"{k} sections (use array_split for unequal sections)")
        step = shape[ax] // k
        return _pieces(x, ax, [i * step for i in range(k + 1)])
    return _pieces(x, ax, [0] + _static_ints(indices_or_sections, "split") + [shape[ax]])


def array_split(ary, indices_or_sections, axis: int = 0):
    """Like :func:`split`, but ``n`` sections need not divide the axis evenly."""
    x = to_array(ary)
    shape = get_aval(x).shape
    ax = canonicalize_axis(axis, len(shape), "spmd.numpy.array_split")
    require_static(indices_or_sections, "spmd.numpy.array_split", "indices_or_sections",
                   "int or sequence of ints")
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0:
            raise ArgumentError(f"spmd.numpy.array_split: number of sections must be larger "
                                f"than 0, got {k}")
        each, extra = divmod(shape[ax], k)
        sizes = [each + 1] * extra + [each] * (k - extra)
        return _pieces(x, ax, [0] + list(np.cumsum(sizes)))
    return _pieces(x, ax, [0] + _static_ints(indices_or_sections, "array_split") + [shape[ax]])


def _static_ints(seq, fname):
    if not isinstance(seq, Array):
        seq = [static_int(i, f"spmd.numpy.{fname}", "indices_or_sections") for i in seq]
    return [int(i) for i in np.asarray(seq).reshape(-1)]


def hsplit(ary, indices_or_sections):
    """Split along the second axis (the first for 1-d arrays)."""
    return split(ary, indices_or_sections, axis=0 if get_aval(to_array(ary)).ndim == 1 else 1)


def vsplit(ary, indices_or_sections):
    """Split along the first axis."""
    return split(ary, indices_or_sections, axis=0)
