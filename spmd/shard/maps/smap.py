"""``smap``: a ``shard_map`` over one mesh axis, its specs given as array axes (JAX's
``jax.smap``).

``smap(f, in_axes=0, out_axes=0, axis_name="i")`` is ``shard_map(f, in_specs=...,
out_specs=..., axis_names={"i"})`` over the mesh of ``set_mesh``/``use_mesh``, where an
argument's spec splits its axis ``in_axes`` over ``"i"`` (``None``: the whole argument
on every device) and an output's spec joins its axis ``out_axes`` over ``"i"``.  The
body is manual along ``"i"`` only; the mesh's other axes stay automatic, so smaps over
different axes nest (each inner one maps over a further axis).
"""

from __future__ import annotations

from typing import Any, Callable

from spmd import tree_util
from spmd.errors import ArgumentError
from spmd.mesh.mesh import AxisType
from spmd.shard.explicit.mesh_context import get_mesh
from spmd.shard.maps.shard_map import shard_map
from spmd.shard.maps.args import Infer
from spmd.shard.arrays.spec import PartitionSpec

__all__ = ["smap"]


def _spec(axis_name, axis: int | None, ndim: int | None, what: str) -> PartitionSpec:
    """The spec that maps array axis ``axis`` over ``axis_name``."""
    if axis is None:
        return PartitionSpec()
    if ndim is not None:
        if not -ndim <= axis < ndim:
            raise ArgumentError(f"smap: {what}={axis} is out of range for an argument of rank "
                                f"{ndim} (give an axis in [{-ndim}, {ndim}))")
        axis %= ndim
    elif axis < 0:
        raise ArgumentError(f"smap: {what}={axis}: give output axes as non-negative numbers "
                            "(the output's rank is not known before it is traced)")
    return PartitionSpec(*([None] * axis), axis_name)


def _check_axes(tree, what: str) -> None:
    leaves = tree_util.tree_leaves(tree, is_leaf=lambda x: x is None)
    bad = [v for v in leaves if v is not None and (isinstance(v, bool) or not isinstance(v, int))]
    if bad:
        raise ArgumentError(f"smap: {what} must be an int, None, or a container of them; got "
                            f"{bad[0]!r} in {tree!r}")


def smap(f: Callable | None = None, /, *, in_axes: Any = Infer, out_axes: Any,
         axis_name) -> Callable:
    """Map ``f`` over the mesh axis ``axis_name`` of the current mesh, splitting each
    argument along its axis ``in_axes`` (an int or None for all, or a tuple with one
    entry per positional argument, each a pytree prefix of it) and joining each output
    along ``out_axes``.  ``in_axes`` left out: each argument's spec is that of its
    sharding, as ``shard_map`` infers it.

    >>> with spmd.sharding.use_mesh(spmd.make_mesh((4, 2), ("i", "j"))):
    ...     y = smap(lambda b: b * 2, in_axes=0, out_axes=0, axis_name="i")(x)  # doctest: +SKIP
    """
    if isinstance(axis_name, (list, tuple, set, frozenset)):
        raise ArgumentError(f"smap: axis_name must be one mesh axis name, got {axis_name!r} "
                            "(nest smaps to map over several axes)")
    if in_axes is not Infer:
        if not (in_axes is None or isinstance(in_axes, (int, tuple))) or \
                isinstance(in_axes, bool):
            raise ArgumentError(f"smap: in_axes must be an int, None, or a tuple with one "
                                f"entry per positional argument; got {in_axes!r}")
        _check_axes(in_axes, "in_axes")
    _check_axes(out_axes, "out_axes")
    if f is None:
        return lambda g: smap(g, in_axes=in_axes, out_axes=out_axes, axis_name=axis_name)
    if not callable(f):
        raise ArgumentError(f"smap: expected a function first, got {type(f).__name__}")
    out_specs = tree_util.tree_map(lambda a: _spec(axis_name, a, None, "out_axes"), out_axes,
                                   is_leaf=lambda x: x is None)

    def mapped(*args):
        if in_axes is Infer:
            _check_inferrable(axis_name)
            in_specs = Infer
        else:
            per_arg = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
            if len(per_arg) != len(args):
                raise ArgumentError(f"smap: in_axes has {len(per_arg)} entries for "
                                    f"{len(args)} positional arguments")
            in_specs = tuple(_arg_specs(axis_name, axes, arg)
                             for axes, arg in zip(per_arg, args))
        return shard_map(f, in_specs=in_specs, out_specs=out_specs,
                         axis_names={axis_name})(*args)

    return mapped


def _check_inferrable(axis_name):
    """Without ``in_axes`` the arguments' specs come from their types: that needs
    ``axis_name`` to be an explicit axis of the current mesh, as in JAX."""

    mesh = get_mesh()
    types = dict(zip(mesh.axis_names, mesh.axis_types)) if mesh is not None else {}
    if types.get(axis_name) != AxisType.Explicit:
        raise SmapArgumentError(
            f"smap: in_axes was not specified, and axis {axis_name!r} is not an Explicit axis "
            f"of the current mesh ({mesh}); the arguments' placements along it are then "
            "unknown: pass in_axes= (an int, None, or a tuple with one entry per argument)")


class SmapArgumentError(ArgumentError, TypeError):
    """smap's arguments cannot be mapped as given (a TypeError, as JAX's)."""


def _arg_specs(axis_name, axes, arg):
    """The specs of ``arg``'s leaves: ``axes`` (an int or None, or a pytree prefix of
    ``arg`` of them) broadcast over the leaves below each entry."""
    def under(a, sub):
        return tree_util.tree_map(lambda x: _spec(axis_name, a, _ndim(x), "in_axes"), sub)

    if axes is None or isinstance(axes, int):
        return under(axes, arg)
    return tree_util.tree_map(under, axes, arg, is_leaf=lambda x: x is None)


def _ndim(x) -> int:
    import numpy as np

    shape = getattr(x, "shape", None)
    return len(shape) if shape is not None else np.ndim(x)
