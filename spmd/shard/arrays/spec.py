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
        unreduced = _axis_set(unreduced, "unreduced")
        reduced = _axis_set(reduced, "reduced")
        used = {a for p in parts if p is not None for a in ((p,) if isinstance(p, str) else p)}
        for name, kind in ((unreduced, "unreduced"), (reduced, "reduced")):
            if used & name:
                raise ShardingError(f"PartitionSpec: axes {sorted(used & name)} both split a "
                                    f"dimension and are {kind} in {parts!r}, {kind}="
                                    f"{set(name)!r}; an axis does one or the other")
        if unreduced & reduced:
            raise ShardingError(f"PartitionSpec: axes {sorted(unreduced & reduced)} are both "
                                "unreduced and reduced; an axis is one or the other")
        self = super().__new__(cls, parts)
        # Axes over which each device holds a summand of the value (JAX's unreduced):
        # made by out_sharding= of a contraction, reduced by a reshard without them.
        self.unreduced = unreduced
        # Axes over which the value is whole on every device but its cotangent is left
        # unreduced (JAX's reduced): a type, the data is replicated.
        self.reduced = reduced
        return self

    # A spec's unreduced axes are part of it: caches keyed on specs must tell them apart.
    def __eq__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return (tuple.__eq__(self, other)
                and self.unreduced == getattr(other, "unreduced", frozenset())
                and self.reduced == getattr(other, "reduced", frozenset()))

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        u, r = self.unreduced, self.reduced
        return tuple.__hash__(self) if not (u or r) else hash((tuple(self), u, r))

    def __repr__(self):
        body = ", ".join(map(repr, self)) + ("," if len(self) == 1 and
                                             isinstance(self[0], tuple) else "")
        for kind in ("unreduced", "reduced"):
            axes = getattr(self, kind)
            if axes:
                body += (", " if body else "") + f"{kind}={set(sorted(axes))!r}"
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
        if self.unreduced or self.reduced:
            return (_spec_with_unreduced, (tuple(self), tuple(sorted(self.unreduced)),
                                           tuple(sorted(self.reduced))))
        return (PartitionSpec, tuple(self))

    def update(self, *, partitions=None, unreduced=None, reduced=None) -> "PartitionSpec":
        """A copy with the given fields changed (JAX's ``PartitionSpec.update``).

        >>> P("x", unreduced={"y"}).update(unreduced=frozenset())
        PartitionSpec('x',)
        """
        return PartitionSpec(*(tuple(self) if partitions is None else partitions),
                             unreduced=self.unreduced if unreduced is None else unreduced,
                             reduced=self.reduced if reduced is None else reduced)


P = PartitionSpec


def ct_spec(spec: PartitionSpec) -> PartitionSpec:
    """The spec of the cotangent of a value placed by ``spec``: an unreduced value's
    cotangent is reduced, a reduced one's unreduced (JAX's types).

    >>> ct_spec(P("x", reduced={"y"}))
    PartitionSpec('x', unreduced={'y'})
    """
    if not (spec.unreduced or spec.reduced):
        return spec
    return spec.update(unreduced=spec.reduced, reduced=spec.unreduced)


def _axis_set(axes, kind: str) -> frozenset:
    if isinstance(axes, str):
        axes = (axes,)
    axes = frozenset(axes)
    if not all(isinstance(a, str) for a in axes):
        raise ShardingError(f"PartitionSpec: {kind}={set(axes)!r} must be mesh axis names")
    return axes


def _spec_with_unreduced(parts, unreduced, reduced=()):
    return PartitionSpec(*parts, unreduced=frozenset(unreduced), reduced=frozenset(reduced))


def check_spec(spec: PartitionSpec, mesh, shape, where: str) -> None:
    """Raise :class:`ShardingError` unless ``spec`` fits ``mesh`` and an array of ``shape``."""
    if not isinstance(spec, PartitionSpec):
        raise ShardingError(f"{where}: expected a PartitionSpec, got {spec!r}")
    for kind in ("unreduced", "reduced"):
        for a in sorted(getattr(spec, kind)):
            if a not in mesh.shape:
                raise ShardingError(f"{where}: spec {spec} names {kind} axis {a!r}, which is "
                                    f"not in the mesh (axes {mesh.axis_names})")
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
        for a in (*spec.mesh_axes, *sorted(spec.unreduced), *sorted(spec.reduced)):
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
        # (An unreduced array's devices hold different summands.)
        return not self.spec.mesh_axes and not self.spec.unreduced

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
    trailing unsplit dimensions (so P("i") == P(("i",)) == P("i", None) as placements),
    and its unreduced and reduced axes."""
    parts = [spec.axes_of(d) for d in range(len(spec))]
    while parts and not parts[-1]:
        parts.pop()
    return tuple(parts), spec.unreduced, spec.reduced


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
