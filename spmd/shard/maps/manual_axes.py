"""The manual axes of a partial-manual ``shard_map`` (``axis_names={...}``): which
they are, specs that may name only them, and the error for a collective over one of
the other (automatic) axes.  The partitioner splits the body along the automatic
axes (:mod:`spmd.shard.partition.manual`)."""

from __future__ import annotations

from spmd.collectives.primitives import CollectiveAxisError
from spmd.mesh.mesh import AxisType
from spmd.shard.maps.args import ShardMapError
from spmd.shard.arrays.spec import PartitionSpec


def _shard_map_error(msg):
    return ShardMapError(msg)


def _manual_axes(axis_names, mesh, fname):
    """The manual axes: all of the mesh's (None), or those of ``axis_names``.

    The other axes of a partial-manual shard_map are not in scope in the body and
    no spec may name them: the partitioner splits the body along them."""
    if axis_names is None:
        return None
    names = set(axis_names)
    unknown = sorted(names - set(mesh.axis_names))
    if unknown:
        raise _shard_map_error(f"{fname}: axis_names={sorted(names)} names {unknown[0]!r}, "
                               f"which is not an axis of the mesh (axes {mesh.axis_names})")
    if names == set(mesh.axis_names):
        return None
    return tuple(a for a in mesh.axis_names if a in names)


def _check_manual_spec(spec, manual, where, fname):
    auto = [a for a in spec.mesh_axes if a not in manual]
    if auto:
        raise _shard_map_error(f"{fname}: {where}={spec} names mesh axis {auto[0]!r}, which "
                               f"is not manual (axis_names={list(manual)}); a partial-manual "
                               "shard_map's specs may name only its manual axes")


def _automatic_axis_error(e, mesh, manual, fname):
    """A collective over an automatic axis of a partial-manual shard_map (as in JAX,
    an error): say so, rather than that the axis is not in scope."""
    a = getattr(e, "axis", None)
    if manual is None or a not in mesh.shape:
        return e
    return CollectiveAxisError(
        f"{fname}: {e.collective} over mesh axis {a!r}, which is automatic in this "
        f"partial-manual shard_map (axis_names={list(manual)}): collectives may name only "
        f"the manual axes. The partitioner splits the body along {a!r} (place values along "
        f"it with with_sharding_constraint), or add {a!r} to axis_names to make it manual")


def typed_axes(mesh, manual) -> frozenset:
    """The explicit axes of ``mesh`` outside a partial-manual body's ``manual`` ones: a
    spec may name them too, and the body's values are typed along them (as in JAX)."""
    if manual is None:
        return frozenset()
    return frozenset(a for a, t in zip(mesh.axis_names, getattr(mesh, "axis_types", ()))
                     if a not in manual and t == AxisType.Explicit)


def split_typed(spec, typed):
    """``(spec along the other axes, spec along the ``typed`` ones)`` of a spec of a
    partial-manual shard_map: its block's split, and the block's type inside."""
    def part(keep):
        parts = []
        for d in range(len(spec)):
            axes = tuple(a for a in spec.axes_of(d) if keep(a))
            parts.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        return PartitionSpec(*parts)

    return part(lambda a: a not in typed), part(lambda a: a in typed)
