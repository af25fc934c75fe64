"""``vmap``: vectorise a function over a batch axis of its arguments."""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.compiler.transforms.batching import NamedAxes, batch_flat, broadcast_prefix  # noqa: F401
from spmd.compiler.core.jit import flatten_outputs
from spmd.errors import ArgumentError
from spmd.shard.call.tracebacks import api_boundary
from spmd.shard.explicit.types import type_of


def vmap(fun: Callable, in_axes=0, out_axes=0, axis_name=None, axis_size=None,
         spmd_axis_name=None):
    """Map ``fun`` over axis ``in_axes`` of its arguments.

    ``spmd_axis_name`` (a mesh axis name or a tuple of them) splits the mapped axis over
    those mesh axes where it meets a ``shard_map`` (its specs gain the axes at the batch
    dimension, so each device maps over its part of the batch) or a
    ``with_sharding_constraint``, as in JAX.

    >>> vmap(lambda x, y: x @ y, in_axes=(0, None))(np.ones((5, 3)), np.ones(3))  # doctest: +SKIP
    """
    if not callable(fun):
        raise TypeError(f"vmap: expected a function, got {type(fun).__name__}")
    spmd_name = _spmd_axis_name(spmd_axis_name)
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    fname = f"vmap({getattr(fun, '__name__', 'fun')})"

    @api_boundary
    @functools.wraps(fun)
    def batched(*args, **kwargs):
        # As in JAX, keyword arguments are mapped over their leading axis.
        axes_tree = in_axes
        if isinstance(axes_tree, tuple) and len(axes_tree) != len(args):
            raise ArgumentError(f"{fname}: in_axes has {len(axes_tree)} entries but the function "
                                f"was called with {len(args)} positional arguments")
        leaves, in_tree = tree_util.tree_flatten(args)
        dims = broadcast_prefix(axes_tree if isinstance(axes_tree, tuple) else
                                tuple([axes_tree] * len(args)), args, "in_axes", fname)
        kw_leaves, kw_tree = tree_util.tree_flatten(kwargs)
        paths = [p for p, _ in tree_util.tree_flatten_with_path(args)[0]]
        norm_dims, size = _mapped_dims(fname, leaves, dims, paths, kw_leaves, axis_size)
        out_tree_box: list = []

        def flat(*all_leaves):
            a = tree_util.tree_unflatten(in_tree, all_leaves[:len(leaves)])
            kw = tree_util.tree_unflatten(kw_tree, all_leaves[len(leaves):])
            outs, out_tree = flatten_outputs(fun(*a, **kw), fname)
            out_tree_box[:] = [out_tree, outs]
            return outs

        level = _batch_level(fname, leaves, norm_dims, size, axis_name, spmd_name,
                             spmd_axis_name)
        outs = batch_flat(flat, leaves + kw_leaves, norm_dims + [0] * len(kw_leaves), size,
                          level, _OutDims(out_tree_box, out_axes, fname))
        return tree_util.tree_unflatten(out_tree_box[0], outs)

    return batched


def _mapped_dims(fname, leaves, dims, paths, kw_leaves, axis_size) -> tuple:
    """``(dims, size)``: each positional leaf's mapped axis made non-negative (None where
    unmapped), checked in range, and the mapped axis's one size (keyword leaves are
    mapped over their leading axis; ``axis_size`` when nothing is mapped)."""
    norm_dims = []
    size, size_from = axis_size, "axis_size"
    for leaf, d, path in zip(leaves, dims, paths):
        if d is None:
            norm_dims.append(None)
            continue
        nd = np.ndim(leaf)
        if not -nd <= d < nd:
            raise ArgumentError(f"{fname}: in_axes={d} is out of range for argument"
                                f"{tree_util.keystr(path)} of shape {np.shape(leaf)}")
        d %= nd
        n = np.shape(leaf)[d]
        where = f"argument{tree_util.keystr(path)} (axis {d}, shape {np.shape(leaf)})"
        if size is None:
            size, size_from = n, where
        elif n != size:
            raise ArgumentError(f"{fname}: inconsistent sizes of the mapped axis: {n} for "
                                f"{where} but {size} for {size_from}")
        norm_dims.append(d)
    for leaf in kw_leaves:
        n = np.shape(leaf)[0] if np.ndim(leaf) else None
        if size is None:
            size = n
        elif n != size:
            raise ArgumentError(f"{fname}: keyword argument has mapped size {n}, expected "
                                f"{size}")
    if size is None:
        raise ArgumentError(f"{fname}: no argument is mapped (all in_axes are None); pass "
                            "axis_size= to say how many copies to make")
    return norm_dims, size


class _OutDims:
    """The outputs' mapped axes: ``out_axes`` is a prefix of the outputs, known only
    after tracing (``box``: [their tree, the outputs], filled by the trace), so it is
    resolved lazily, when iterated."""

    def __init__(self, box: list, out_axes, fname: str):
        self.box, self.out_axes, self.fname = box, out_axes, fname

    def __iter__(self):
        out_tree, outs = self.box
        full = tree_util.tree_unflatten(out_tree, list(range(len(outs))))
        return iter(broadcast_prefix(self.out_axes, full, "out_axes", self.fname))


def _batch_level(fname, leaves, dims, size, axis_name, spmd_name, spmd_axis_name):
    """The batch level's name: ``axis_name``, or the named axes that say how the batch
    is split over mesh axes (``spmd_axis_name``, or the arguments' explicit axes)."""
    explicit = _explicit_batch_axes(leaves, dims)
    if explicit is not None and spmd_name is not None and explicit == spmd_name:
        explicit = None  # both say the same split
    if explicit is not None and spmd_name is not None:
        raise ArgumentError(
            f"{fname}: spmd_axis_name={spmd_axis_name!r}, and the mapped arguments are "
            f"split over explicit mesh axes {explicit} along the mapped axis; only one "
            "of the two can say how the batch is split (as in JAX): drop "
            "spmd_axis_name, or reshard the arguments whole along the mapped axis")
    if spmd_name is None and explicit is None:
        return axis_name
    names = () if axis_name is None else (axis_name,)
    return NamedAxes(names, (size,) * len(names), spmd_name=spmd_name, explicit_axes=explicit)


def _explicit_batch_axes(leaves, dims):
    """The explicit mesh axes the mapped arguments' types split the mapped axis over,
    when they all agree (else None: the batch is whole where it meets a constraint)."""
    found = set()
    for leaf, d in zip(leaves, dims):
        if d is None:
            continue
        t = type_of(leaf)
        found.add(None if t is None or t[1] is None else tuple(t[1].dims[d]))
    if len(found) != 1:
        return None
    axes = found.pop()
    return axes or None


def _spmd_axis_name(name):
    """``spmd_axis_name`` as a tuple of mesh axis names (None when not given)."""
    if name is None:
        return None
    names = (name,) if isinstance(name, str) else name
    if not isinstance(names, tuple) or not names or not all(isinstance(n, str) for n in names):
        raise ArgumentError(f"vmap: spmd_axis_name must be a mesh axis name or a tuple of "
                            f"them, got {name!r}")
    return names

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()
