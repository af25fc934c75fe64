"""Shape manipulation: reshape, transpose, expand_dims, stack (more beside these)."""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.ops import structural as st
from spmd.compiler.trace import get_aval
from spmd.errors import ShapeError
from spmd.numpy._util import canonicalize_axis, promote_dtypes, to_array


def reshape(a, shape, order: str = "C"):
    """Reshape; one entry of ``shape`` may be -1."""
    if order != "C":
        raise NotImplementedError("spmd.numpy.reshape: only order='C' is supported")
    x = to_array(a)
    av = get_aval(x)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"spmd.numpy.reshape: can only specify one unknown dimension, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or av.size % known:
            raise ShapeError(f"spmd.numpy.reshape: cannot reshape an array of shape {av.shape} "
                             f"(size {av.size}) into shape {shape}")
        shape = tuple(av.size // known if s == -1 else s for s in shape)
    return st.reshape(x, shape)


def transpose(a, axes=None):
    x = to_array(a)
    nd = get_aval(x).ndim
    if axes is None:
        axes = tuple(reversed(range(nd)))
    axes = tuple(canonicalize_axis(ax, nd, "spmd.numpy.transpose", "axes") for ax in axes)
    return st.transpose(x, axes)


def expand_dims(a, axis):
    x = to_array(a)
    shape = list(get_aval(x).shape)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    nd = len(shape) + len(axes)
    axes = sorted(canonicalize_axis(ax, nd, "spmd.numpy.expand_dims") for ax in axes)
    for ax in axes:
        shape.insert(ax, 1)
    return st.reshape(x, tuple(shape))


def stack(arrays, axis: int = 0):
    arrs = promote_dtypes(*arrays, fname="spmd.numpy.stack")
    shapes = {get_aval(a).shape for a in arrs}
    if len(shapes) != 1:
        raise ShapeError(f"spmd.numpy.stack: all input arrays must have the same shape, got "
                         f"{sorted(shapes)}")
    from spmd.numpy._shape_more import concatenate

    ax = canonicalize_axis(axis, len(next(iter(shapes))) + 1, "spmd.numpy.stack")
    return concatenate([expand_dims(a, ax) for a in arrs], axis=ax)
