"""Shape manipulation: reshape, transpose, expand_dims, stack (more beside these)."""

from __future__ import annotations

import math

from spmd.compiler.ops import structural as st
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.shard.explicit.modes import with_out_sharding
from spmd.numpy._util import (broadcast_shapes, canonicalize_axis, promote_dtypes, static_shape,
                              to_array)

__all__ = ["reshape", "transpose", "expand_dims", "stack", "swapaxes", "moveaxis",
           "squeeze", "broadcast_to", "broadcast_arrays", "ravel", "flatten",
           "atleast_1d", "atleast_2d", "atleast_3d"]


def reshape(a, shape, order: str = "C", *, out_sharding=None):
    """Reshape; one entry of ``shape`` may be -1.  ``out_sharding``: the result's sharding
    (on explicit axes it settles a reshape whose sharding is ambiguous)."""
    if out_sharding is not None:
        shape = tuple(shape) if isinstance(shape, (list, tuple)) else shape
        return with_out_sharding(_reshape, (a,), out_sharding, "spmd.numpy.reshape",
                                 (shape, order))
    return _reshape(shape, order, a)


def _reshape(shape, order, a):
    if order != "C":
        raise NotImplementedError("spmd.numpy.reshape: only order='C' is supported")
    x = to_array(a)
    av = get_aval(x)
    shape = static_shape(shape, "spmd.numpy.reshape", "shape")
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
    """Join arrays of equal shape along a new axis.

    >>> stack([ones(3), zeros(3)], axis=1).shape
    (3, 2)
    """
    arrays = list(arrays)
    if not arrays:
        raise ArgumentError("spmd.numpy.stack: need at least one array to stack")
    arrs = promote_dtypes(*arrays, fname="spmd.numpy.stack")
    shapes = {get_aval(a).shape for a in arrs}
    if len(shapes) != 1:
        raise ShapeError(f"spmd.numpy.stack: all input arrays must have the same shape, got "
                         f"{sorted(shapes)}")
    from spmd.numpy._joining import concatenate  # here: _joining imports this module

    ax = canonicalize_axis(axis, len(next(iter(shapes))) + 1, "spmd.numpy.stack")
    return concatenate([expand_dims(a, ax) for a in arrs], axis=ax)


def swapaxes(a, axis1: int, axis2: int):
    """Exchange two axes.

    >>> swapaxes(ones((2, 3)), 0, 1).shape
    (3, 2)
    """
    x = to_array(a)
    nd = get_aval(x).ndim
    a1 = canonicalize_axis(axis1, nd, "spmd.numpy.swapaxes", "axis1")
    a2 = canonicalize_axis(axis2, nd, "spmd.numpy.swapaxes", "axis2")
    perm = list(range(nd))
    perm[a1], perm[a2] = a2, a1
    return st.transpose(x, tuple(perm))


def moveaxis(a, source, destination):
    """Move axes ``source`` to positions ``destination`` (ints or equal-length sequences).

    >>> moveaxis(ones((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    x = to_array(a)
    nd = get_aval(x).ndim
    src = _axes_tuple(source, nd, "source")
    dst = _axes_tuple(destination, nd, "destination")
    if len(src) != len(dst):
        raise ArgumentError(f"spmd.numpy.moveaxis: source {source} and destination "
                            f"{destination} must have the same number of elements")
    order = [i for i in range(nd) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return st.transpose(x, tuple(order))


def _axes_tuple(axes, nd, argname, fname="spmd.numpy.moveaxis"):
    axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    out = tuple(canonicalize_axis(a, nd, fname, argname) for a in axes)
    if len(set(out)) != len(out):
        raise ArgumentError(f"{fname}: repeated axis in {argname}={axes}")
    return out


def squeeze(a, axis=None):
    """Remove axes of size 1 (all of them when ``axis`` is None).

    >>> squeeze(ones((1, 3, 1)), axis=0).shape
    (3, 1)
    """
    x = to_array(a)
    shape = get_aval(x).shape
    if axis is None:
        return st.squeeze(x, tuple(i for i, s in enumerate(shape) if s == 1))
    axes = _axes_tuple(axis, len(shape), "axis", "spmd.numpy.squeeze")
    for ax in axes:
        if shape[ax] != 1:
            raise ShapeError(f"spmd.numpy.squeeze: cannot select axis {ax} to squeeze: it has "
                             f"size {shape[ax]}, not 1 (array shape {shape})")
    return st.squeeze(x, axes)


def broadcast_to(array, shape):
    """Broadcast ``array`` to ``shape`` with numpy's rules.

    >>> broadcast_to(ones(3), (2, 3)).shape
    (2, 3)
    """
    x = to_array(array)
    shape = static_shape(shape, "spmd.numpy.broadcast_to", "shape")
    xs = get_aval(x).shape
    nd = len(shape)
    ok = len(xs) <= nd and all(s in (1, t) for s, t in zip(xs, shape[nd - len(xs):]))
    if not ok or any(s < 0 for s in shape):
        raise ShapeError(f"spmd.numpy.broadcast_to: cannot broadcast an array of shape {xs} "
                         f"to shape {shape} (numpy broadcasting rules)")
    return st.broadcast_in_dim(x, shape, tuple(range(nd - len(xs), nd)))


def broadcast_arrays(*args):
    """The arguments broadcast against each other (a list).

    >>> [a.shape for a in broadcast_arrays(ones(3), ones((2, 1)))]
    [(2, 3), (2, 3)]
    """
    arrs = [to_array(a) for a in args]
    shape = broadcast_shapes(*(get_aval(a).shape for a in arrs),
                             fname="spmd.numpy.broadcast_arrays")
    return [broadcast_to(a, shape) for a in arrs]


def ravel(a, order: str = "C"):
    """The flattened (1-d) array, in C order."""
    if order != "C":
        raise NotImplementedError("spmd.numpy.ravel: only order='C' is supported")
    x = to_array(a)
    return st.reshape(x, (get_aval(x).size,))


def flatten(a, order: str = "C"):
    """``a.flatten()``: like :func:`ravel` (arrays are immutable, so no copy is needed)."""
    return ravel(a, order)


def atleast_1d(*arys):
    """Each input viewed with at least one dimension (a list when several are given)."""
    return _atleast(arys, lambda s: (1,) if not s else s)


def atleast_2d(*arys):
    return _atleast(arys, lambda s: (1,) * (2 - len(s)) + s if len(s) < 2 else s)


def atleast_3d(*arys):
    def shape3(s):
        if len(s) == 0:
            return (1, 1, 1)
        if len(s) == 1:
            return (1,) + s + (1,)
        if len(s) == 2:
            return s + (1,)
        return s

    return _atleast(arys, shape3)


def _atleast(arys, new_shape):
    outs = []
    for a in arys:
        x = to_array(a)
        outs.append(st.reshape(x, new_shape(get_aval(x).shape)))
    return outs[0] if len(outs) == 1 else outs
