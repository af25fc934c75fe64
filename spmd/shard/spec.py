"""``PartitionSpec`` and ``NamedSharding``: where each block of an array lives."""

from __future__ import annotations

import math

import numpy as np

from spmd.errors import SpmdError
from spmd.mesh import AbstractMesh, Mesh
from spmd.mesh.devices import process_index


class ShardingError(SpmdError, ValueError):
    """A spec or sharding that does not fit its mesh or array."""


class PartitionSpec(tuple):
    """Per array dimension: ``None`` (not split), a mesh axis name, or a tuple of names
    (split over their product, major to minor).  Trailing dimensions may be omitted.

    >>> P("i", None), P(("i", "j"))
    (PartitionSpec('i', None), PartitionSpec(('i', 'j'),))
    """

    def __new__(cls, *parts, unreduced=frozenset(), reduced=frozenset()):
        for p in parts:
            if p is not None and not isinstance(p, str) and not (
                    isinstance(p, tuple) and all(isinstance(q, str) for q in p)):
                raise ShardingError(f"PartitionSpec: entry {p!r} must be None, a mesh axis "
                                    "name, or a tuple of axis names")
        if reduced:
            raise NotImplementedError(
                f"PartitionSpec(reduced={set(reduced)!r}): reduced axes (a value whole along "
                "them whose cotangent stays unreduced) are not supported yet; leave reduced= "
                "out (the gradient is then reduced where it is made)")
        if isinstance(unreduced, str):
            unreduced = (unreduced,)
        unreduced = frozenset(unreduced)
        if not all(isinstance(a, str) for a in unreduced):
            raise ShardingError(f"PartitionSpec: unreduced={set(unreduced)!r} must be mesh "
                                "axis names")
        used = {a for p in parts if p is not None for a in ((p,) if isinstance(p, str) else p)}
        if used & unreduced:
            raise ShardingError(f"PartitionSpec: axes {sorted(used & unreduced)} both split a "
                                f"dimension and are unreduced in {parts!r}, unreduced="
                                f"{set(unreduced)!r}; an axis does one or the other")
        self = super().__new__(cls, parts)
        # Axes over which each device holds a summand of the value (JAX's unreduced):
        # made by out_sharding= of a contraction, reduced by a reshard without them.
        self.unreduced = unreduced
        return self

    # A spec's unreduced axes are part of it: caches keyed on specs must tell them apart.
    def __eq__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return tuple.__eq__(self, other) and self.unreduced == getattr(other, "unreduced",
                                                                       frozenset())

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        u = self.unreduced
        return tuple.__hash__(self) if not u else hash((tuple(self), u))

    def __repr__(self):
        body = ", ".join(map(repr, self)) + ("," if len(self) == 1 and
                                             isinstance(self[0], tuple) else "")
        if self.unreduced:
            body += (", " if body else "") + f"unreduced={set(sorted(self.unreduced))!r}"
        return "PartitionSpec(" + body + ")"

    def axes_of(self, dim: int) -> tuple[str, ...]:
        """The mesh axes dimension ``dim`` is split over (empty when not split)."""
        if dim >= len(self) or self[dim] is None:
            return ()
        p = self[dim]
        return (p,) if isinstance(p, str) else tuple(p)

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        return tuple(a for d in range(len(self)) for a in self.axes_of(d))

    def __reduce__(self):
        if self.unreduced:
            return (_spec_with_unreduced, (tuple(self), tuple(sorted(self.unreduced))))
        return (PartitionSpec, tuple(self))


P = PartitionSpec


def _spec_with_unreduced(parts, unreduced):
    return PartitionSpec(*parts, unreduced=frozenset(unreduced))


def check_spec(spec: PartitionSpec, mesh, shape, where: str,
               allow_unreduced: bool = False) -> None:
    """Raise :class:`ShardingError` unless ``spec`` fits ``mesh`` and an array of ``shape``.
    ``allow_unreduced``: inside a program (a constraint) a spec may have unreduced axes;
    an Array, an argument or a result may not (each holds its value, not summands)."""
    if not isinstance(spec, PartitionSpec):
        raise ShardingError(f"{where}: expected a PartitionSpec, got {spec!r}")
    for a in sorted(spec.unreduced):
        if a not in mesh.shape:
            raise ShardingError(f"{where}: spec {spec} names unreduced axis {a!r}, which is "
                                f"not in the mesh (axes {mesh.axis_names})")
    if spec.unreduced and not allow_unreduced:
        raise ShardingError(
            f"{where}: spec {spec} has unreduced axes: an unreduced value (each device along "
            "them holding a summand) exists only inside a jitted program; reshard it to a "
            "spec without unreduced= first (spmd.sharding.reshard), which sums it")
    if len(spec) > len(shape):
        raise ShardingError(f"{where}: spec {spec} has {len(spec)} entries but the array has "
                            f"rank {len(shape)} (shape {tuple(shape)}); a spec may not be longer "
                            "than the array's rank")
    seen = set()
    for d in range(len(spec)):
        for a in spec.axes_of(d):
            if a not in mesh.shape:
                raise ShardingError(f"{where}: spec {spec} names axis {a!r}, which is not in the "
                                    f"mesh (axes {mesh.axis_names})")
            if a in seen:
                raise ShardingError(f"{where}: spec {spec} uses mesh axis {a!r} twice; each "
                                    "axis may split at most one dimension")
            seen.add(a)
        n = mesh.axis_size(spec.axes_of(d)) if spec.axes_of(d) else 1
        if shape[d] % n:
            raise ShardingError(f"{where}: dimension {d} of size {shape[d]} is not divisible by "
                                f"{n}, the size of mesh axes {spec.axes_of(d)}; pad the array or "
                                "choose a spec whose axes divide it")


def block_shape(spec: PartitionSpec, mesh, shape) -> tuple[int, ...]:
    """The per-device block shape of a global ``shape`` under ``spec``."""
    return tuple(s // (mesh.axis_size(spec.axes_of(d)) if spec.axes_of(d) else 1)
                 for d, s in enumerate(shape))


def global_shape(spec: PartitionSpec, mesh, block) -> tuple[int, ...]:
    return tuple(s * (mesh.axis_size(spec.axes_of(d)) if spec.axes_of(d) else 1)
                 for d, s in enumerate(block))


class NamedSharding:
    """A mesh and a spec: the placement of an array's blocks on the mesh's devices.

    >>> NamedSharding(mesh, P("i", None)).shard_shape((8, 3))
    (2, 3)
    """

    def __init__(self, mesh, spec: PartitionSpec = PartitionSpec()):
        # An AbstractMesh too, as in JAX: a type's mesh inside a partial-manual body
        # (spmd.typeof there), which names no devices.
        if not isinstance(mesh, (Mesh, AbstractMesh)):
            raise ShardingError(f"NamedSharding: expected a Mesh, got {type(mesh).__name__}")
        if not isinstance(spec, PartitionSpec):
            # A tuple reads like a spec but is not one (JAX refuses it too): accepting
            # it would make ("i", "j") ambiguous between P("i", "j") and P(("i", "j")).
            if isinstance(spec, (tuple, list)):
                fix = f"write P({', '.join(map(repr, spec))})"
            elif isinstance(spec, str) or spec is None:
                fix = f"write P({spec!r})"
            else:
                fix = "pass spmd.P(...) (spmd.sharding.PartitionSpec)"
            raise ShardingError(
                f"NamedSharding: spec must be a PartitionSpec, got the {type(spec).__name__} "
                f"{spec!r}; {fix}")
        for a in (*spec.mesh_axes, *sorted(spec.unreduced)):
            if a not in mesh.shape:
                raise ShardingError(f"NamedSharding: spec {spec} names axis {a!r}, not in the "
                                    f"mesh (axes {mesh.axis_names})")
        self.mesh = mesh
        self.spec = spec

    def shard_shape(self, shape) -> tuple[int, ...]:
        check_spec(self.spec, self.mesh, shape, "NamedSharding")
        return block_shape(self.spec, self.mesh, shape)

    def device_index(self, device, shape) -> tuple[slice, ...]:
        """The global index (slices) of the block that ``device`` holds."""
        coords = dict(zip(self.mesh.axis_names, self.mesh.coords(device)))
        idx = []
        for d, s in enumerate(shape):
            axes = self.spec.axes_of(d)
            if not axes:
                idx.append(slice(None))
                continue
            k = 0
            for a in axes:  # major to minor
                k = k * self.mesh.shape[a] + coords[a]
            n = s // self.mesh.axis_size(axes)
            idx.append(slice(k * n, (k + 1) * n))
        return tuple(idx)

    def devices_indices_map(self, shape) -> dict:
        return {d: self.device_index(d, shape) for d in self.mesh.devices.flat}

    @property
    def device_set(self) -> set:
        return set(self.mesh.devices.flat)

    def is_fully_replicated(self) -> bool:
        return not self.spec.mesh_axes

    @property
    def is_fully_addressable(self) -> bool:
        """Whether every device of the mesh belongs to this process."""
        me = process_index()
        return all(d.process_index == me for d in self.mesh.devices.flat)

    def __eq__(self, other):
        return (isinstance(other, NamedSharding) and self.mesh == other.mesh
                and _norm(self.spec) == _norm(other.spec))

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:  # (mesh and spec are not reassigned after construction)
            h = self.__dict__["_hash"] = hash((self.mesh, _norm(self.spec)))
        return h

    def __repr__(self):
        return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r})"


def _norm(spec):
    """The placement a spec describes: per dimension its tuple of mesh axes, without
    trailing unsplit dimensions (so P("i") == P(("i",)) == P("i", None) as placements)."""
    parts = [spec.axes_of(d) for d in range(len(spec))]
    while parts and not parts[-1]:
        parts.pop()
    return tuple(parts)


def block_coord(sharding: NamedSharding, device) -> tuple[int, ...]:
    """The block ``device`` holds, as a block number per split dimension of the spec."""
    mesh, spec = sharding.mesh, sharding.spec
    coords = dict(zip(mesh.axis_names, mesh.coords(device)))
    out = []
    for d in range(len(spec)):
        k = 0
        for a in spec.axes_of(d):  # major to minor
            k = k * mesh.shape[a] + coords[a]
        out.append(k)
    return tuple(out)
