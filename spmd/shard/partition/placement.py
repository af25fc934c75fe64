"""The partitioner's sharding of a value: where each dimension is split, and over
which mesh axes the value is a pending sum (PyTorch DTensor's Shard/Partial,
GSPMD's unreduced); replicated over every other axis."""

from __future__ import annotations

from typing import NamedTuple

from spmd.shard.arrays.spec import PartitionSpec


class Placement(NamedTuple):
    """``dims[d]``: the mesh axes dimension d is split over (major to minor);
    ``partial``: axes over which each device holds a summand of the value;
    ``reduced``: axes over which it is replicated with its cotangent left unreduced
    (JAX's reduced; a type only: it places the data as replicated)."""

    dims: tuple
    partial: frozenset = frozenset()
    reduced: frozenset = frozenset()

    @staticmethod
    def replicated(ndim: int) -> "Placement":
        return Placement(((),) * ndim)

    @staticmethod
    def from_spec(spec: PartitionSpec, ndim: int) -> "Placement":
        """The placement a spec names (its unreduced axes are the pending sum)."""
        return Placement(tuple(spec.axes_of(d) for d in range(ndim)),
                         frozenset(getattr(spec, "unreduced", ())),
                         frozenset(getattr(spec, "reduced", ())))

    def to_spec(self) -> PartitionSpec:
        parts = [None if not a else (a[0] if len(a) == 1 else tuple(a)) for a in self.dims]
        while parts and parts[-1] is None:
            parts.pop()
        return PartitionSpec(*parts, unreduced=self.partial, reduced=self.reduced)

    @property
    def axes(self) -> tuple:
        return tuple(a for d in self.dims for a in d)

    def local_shape(self, shape, mesh) -> tuple:
        return tuple(s // (mesh.axis_size(a) if a else 1) for s, a in zip(shape, self.dims))

    def without_partial(self) -> "Placement":
        return Placement(self.dims)

    def __str__(self):
        dims = ", ".join("+".join(a) if a else "_" for a in self.dims)
        part = f" partial({','.join(sorted(self.partial))})" if self.partial else ""
        if self.reduced:
            part += f" reduced({','.join(sorted(self.reduced))})"
        return f"[{dims}]{part}"
