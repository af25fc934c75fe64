"""``Mesh``: an n-d array of devices with named axes; ``AbstractMesh``: its axis names,
sizes and types without the devices; ``AxisType``."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from typing import Sequence

import numpy as np

from spmd.mesh.devices import Device, DeviceError, process_index
from spmd.mesh.devices import devices as all_devices


class AxisType(enum.Enum):
    """How a mesh axis is used (JAX's names).  ``Auto``: the partitioner places values
    along it (spmd's meshes); ``Manual``: the body of a ``shard_map`` over it works on
    blocks (the axes of ``get_abstract_mesh()`` there); ``Explicit``: shardings are
    part of array types (``spmd.typeof(x).sharding``; docs/explicit_sharding.md).  A mesh
    may mix ``Auto`` and ``Explicit`` axes: types then name the explicit ones only."""

    Auto = "Auto"
    Explicit = "Explicit"
    Manual = "Manual"

    def __repr__(self):
        return self.name


def _axis_types(axis_types, axis_names: tuple, where: str, allowed) -> tuple:
    """``axis_types`` as a tuple of one AxisType per axis (default: all ``Auto``)."""
    if axis_types is None:
        return (AxisType.Auto,) * len(axis_names)
    if isinstance(axis_types, AxisType):
        axis_types = (axis_types,)
    axis_types = tuple(axis_types)
    bad = [t for t in axis_types if not isinstance(t, AxisType)]
    if bad:
        raise DeviceError(f"{where}: axis_types must be spmd.sharding.AxisType values, got "
                          f"{bad[0]!r} in {axis_types!r}")
    if len(axis_types) != len(axis_names):
        raise DeviceError(f"{where}: {len(axis_types)} axis_types {axis_types} for "
                          f"{len(axis_names)} axis names {axis_names}; give one per axis")
    if AxisType.Explicit in axis_types and AxisType.Explicit not in allowed:
        raise DeviceError(f"{where}: axis_types={axis_types}: explicit axes are not allowed "
                          "here")
    if AxisType.Manual in axis_types and AxisType.Manual not in allowed:
        raise DeviceError(f"{where}: axis_types={axis_types}: Manual axes are those of a "
                          "shard_map body (get_abstract_mesh() there); a mesh's are Auto")
    return axis_types


class _AxesByType:
    """The axis names of each type (JAX's ``mesh.auto_axes``, ``explicit_axes``,
    ``manual_axes``)."""

    def _of(self, t) -> tuple[str, ...]:
        return tuple(n for n, a in zip(self.axis_names, self.axis_types) if a == t)

    auto_axes = property(lambda self: self._of(AxisType.Auto))
    explicit_axes = property(lambda self: self._of(AxisType.Explicit))
    manual_axes = property(lambda self: self._of(AxisType.Manual))


class Mesh(_AxesByType):
    """Devices laid out in an n-d array whose axes have names.

    >>> mesh = Mesh(np.array(spmd.devices()).reshape(4, 2), ("i", "j"))
    >>> mesh.shape
    OrderedDict([('i', 4), ('j', 2)])
    """

    def __init__(self, devices: np.ndarray | Sequence, axis_names: Sequence[str] | str,
                 axis_types=None):
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
        self.axis_types = _axis_types(axis_types, axis_names, "Mesh",
                                      (AxisType.Auto, AxisType.Explicit))
        arr = np.asarray(devices, dtype=object)
        if arr.ndim != len(axis_names):
            raise DeviceError(f"Mesh: the device array has {arr.ndim} dimensions "
                              f"{arr.shape} but {len(axis_names)} axis names {axis_names} were "
                              "given; give one name per dimension")
        for name in axis_names:
            if not isinstance(name, str) or not name:
                raise DeviceError(f"Mesh: axis names must be non-empty strings, got {name!r}")
        if len(set(axis_names)) != len(axis_names):
            raise DeviceError(f"Mesh: axis names {axis_names} repeat a name")
        flat = list(arr.flat)
        if not all(isinstance(d, Device) for d in flat):
            raise DeviceError("Mesh: the device array must hold spmd Device objects "
                              "(from spmd.devices())")
        if len(set(flat)) != len(flat):
            raise DeviceError("Mesh: a device appears twice in the device array")
        self.devices = arr
        self.axis_names = axis_names
        self._hash = hash((tuple(d.id for d in flat), arr.shape, axis_names, self.axis_types))
        self._coords = {d: idx for idx, d in np.ndenumerate(arr)}

    # ----------------------------------------------------------- geometry
    @property
    def shape(self) -> "OrderedDict[str, int]":
        return OrderedDict(zip(self.axis_names, self.devices.shape))

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        return tuple(self.devices.shape)

    @property
    def size(self) -> int:
        return self.devices.size

    @property
    def device_ids(self) -> np.ndarray:
        return np.vectorize(lambda d: d.id, otypes=[int])(self.devices)

    def axis_size(self, names) -> int:
        """The product of the sizes of one axis name or a tuple of them."""
        names = (names,) if isinstance(names, str) else tuple(names)
        return math.prod(self.shape[n] for n in names)

    def coords(self, device: Device) -> tuple[int, ...]:
        """The position of ``device`` in the mesh, one index per axis."""
        return self._coords[device]

    @property
    def local_devices(self) -> list[Device]:
        me = process_index()
        return [d for d in self.devices.flat if d.process_index == me]

    @property
    def is_multi_process(self) -> bool:
        return len({d.process_index for d in self.devices.flat}) > 1

    @property
    def abstract_mesh(self) -> "AbstractMesh":
        """Its axis names, sizes and types, without the devices."""
        return AbstractMesh(self.axis_sizes, self.axis_names, self.axis_types)

    def __eq__(self, other):
        return (isinstance(other, Mesh) and self.axis_names == other.axis_names
                and self.axis_types == other.axis_types
                and self.devices.shape == other.devices.shape
                and all(a == b for a, b in zip(self.devices.flat, other.devices.flat)))

    def __hash__(self):
        return self._hash

    def __repr__(self):
        axes = ", ".join(f"'{n}': {s}" for n, s in self.shape.items())
        if AxisType.Explicit in self.axis_types:
            return f"Mesh({{{axes}}}, axis_types={self.axis_types})"
        return f"Mesh({{{axes}}})"

    # JAX lets a mesh be a context manager; shard_map takes it explicitly here.
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class AbstractMesh(_AxesByType):
    """A mesh's axis names, sizes and types, without devices (``jax.sharding.AbstractMesh``):
    what ``get_abstract_mesh()`` returns, and what ``shard_map(mesh=...)`` accepts where a
    mesh of that shape is in context.

    >>> AbstractMesh((4, 2), ("i", "j")).shape
    OrderedDict([('i', 4), ('j', 2)])
    """

    def __init__(self, axis_sizes: Sequence[int], axis_names: Sequence[str], axis_types=None):
        axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        axis_sizes = tuple(int(s) for s in axis_sizes)
        if len(axis_sizes) != len(axis_names):
            raise DeviceError(f"AbstractMesh: {len(axis_sizes)} axis sizes {axis_sizes} but "
                              f"{len(axis_names)} names {axis_names}")
        self.axis_sizes, self.axis_names = axis_sizes, axis_names
        self.axis_types = _axis_types(axis_types, axis_names, "AbstractMesh",
                                      (AxisType.Auto, AxisType.Manual, AxisType.Explicit))

    @property
    def shape(self) -> "OrderedDict[str, int]":
        return OrderedDict(zip(self.axis_names, self.axis_sizes))

    @property
    def size(self) -> int:
        return math.prod(self.axis_sizes)

    @property
    def empty(self) -> bool:
        """No axes (outside any mesh context)."""
        return not self.axis_names

    def axis_size(self, names) -> int:
        names = (names,) if isinstance(names, str) else tuple(names)
        return math.prod(self.shape[n] for n in names)

    def _key(self):
        return self.axis_sizes, self.axis_names, self.axis_types

    def __eq__(self, other):
        return isinstance(other, AbstractMesh) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        axes = ", ".join(f"'{n}': {s}" for n, s in self.shape.items())
        return f"AbstractMesh({{{axes}}}, axis_types={self.axis_types})"


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str], axis_types=None, *,
              devices: Sequence[Device] | None = None) -> Mesh:
    """A mesh of the first ``prod(axis_shapes)`` devices (or of ``devices``); its
    ``axis_types`` (one ``AxisType`` per axis) are ``Auto`` unless given (``Explicit``:
    shardings in types, docs/explicit_sharding.md).  One axis size may be ``-1``: that
    axis takes the rest of the devices (all of them over the other axes' product,
    which must divide their number), so a program follows the job's size.

    >>> mesh = make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Auto,) * 2)
    >>> make_mesh((-1, 2), ("data", "model")).shape   # doctest: +SKIP
    {'data': 4, 'model': 2}
    """
    axis_shapes = tuple(int(s) for s in axis_shapes)
    axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    axis_types = _axis_types(axis_types, axis_names, "make_mesh",
                             (AxisType.Auto, AxisType.Explicit))
    if len(axis_shapes) != len(axis_names):
        raise DeviceError(f"make_mesh: {len(axis_shapes)} axis sizes {axis_shapes} but "
                          f"{len(axis_names)} names {axis_names}")
    pool = list(devices) if devices is not None else all_devices()
    axis_shapes = _rest_of_the_devices(axis_shapes, axis_names, len(pool))
    if any(s < 1 for s in axis_shapes):
        raise DeviceError(f"make_mesh: axis sizes must be positive (or one -1: the rest of "
                          f"the devices), got {axis_shapes}")
    need = math.prod(axis_shapes)
    if need > len(pool):
        have = len(pool)
        from spmd.launch.runtime import launched_by_mpi

        if devices is not None:
            hint = "pass more devices"
        elif launched_by_mpi():
            hint = ("launch more ranks (spmd-run -n N) or give each rank more devices "
                    "(--local-devices / SPMD_LOCAL_DEVICES)")
        else:
            hint = f"set SPMD_NUM_DEVICES={need} (or more) before importing spmd"
        raise DeviceError(f"make_mesh: a mesh of shape {axis_shapes} needs {need} devices but "
                          f"only {have} exist; {hint}")
    return Mesh(np.array(pool[:need], dtype=object).reshape(axis_shapes), axis_names,
                axis_types)


def _rest_of_the_devices(shapes: tuple, names: tuple, have: int) -> tuple:
    """``shapes`` with its one ``-1`` replaced by ``have`` over the others' product."""
    rest = [i for i, s in enumerate(shapes) if s == -1]
    if not rest:
        return shapes
    if len(rest) > 1:
        raise DeviceError(f"make_mesh: axis_shapes {shapes} has -1 for "
                          f"{[names[i] for i in rest]}; only one axis can take the rest of "
                          "the devices: give the others' sizes")
    if any(s < 1 for s in shapes if s != -1):
        return shapes  # (the caller's check names the bad size)
    others = math.prod(s for s in shapes if s != -1)
    if have % others:
        raise DeviceError(f"make_mesh: axis {names[rest[0]]!r} = -1 takes the rest of the "
                          f"{have} devices, but the other axes' sizes "
                          f"{tuple(s for s in shapes if s != -1)} (product {others}) do not "
                          f"divide {have}; give sizes whose product divides {have}")
    return tuple(have // others if s == -1 else s for s in shapes)
