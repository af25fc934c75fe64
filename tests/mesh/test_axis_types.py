"""``AxisType``, a mesh's ``axis_types`` and ``AbstractMesh`` (JAX's names): meshes are
``Auto`` by default or ``Explicit`` (shardings in types: tests/shard/test_explicit.py),
or a mix of the two; ``Manual`` is for the abstract meshes of shard_map bodies.  Errors name the argument and the fix."""

from __future__ import annotations

import pytest

import spmd
from spmd.errors import DeviceError
from spmd.mesh import AbstractMesh, AxisType


def test_meshes_are_auto_and_say_so():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    same = spmd.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Auto,) * 2)
    assert same == mesh and hash(same) == hash(mesh)
    assert spmd.make_mesh((8,), "i", AxisType.Auto).axis_types == (AxisType.Auto,)
    assert repr(mesh.abstract_mesh) == "AbstractMesh({'i': 4, 'j': 2}, axis_types=(Auto, Auto))"


def test_explicit_meshes_differ_from_auto_ones():
    auto = spmd.make_mesh((4, 2), ("i", "j"))
    explicit = spmd.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Explicit,) * 2)
    assert explicit.axis_types == (AxisType.Explicit,) * 2
    # Same devices and names, another type: caches keyed on meshes must tell them apart.
    assert explicit != auto and hash(explicit) != hash(auto)
    assert repr(explicit) == "Mesh({'i': 4, 'j': 2}, axis_types=(Explicit, Explicit))"
    assert explicit.abstract_mesh.axis_types == (AxisType.Explicit,) * 2


def test_abstract_mesh():
    am = AbstractMesh((4, 2), ("i", "j"), (AxisType.Manual, AxisType.Auto))
    assert dict(am.shape) == {"i": 4, "j": 2} and am.size == 8 and not am.empty
    assert am.manual_axes == ("i",) and am.axis_size(("i", "j")) == 8
    assert am == AbstractMesh((4, 2), ("i", "j"), (AxisType.Manual, AxisType.Auto))
    assert am != AbstractMesh((4, 2), ("i", "j"))
    assert len({am, AbstractMesh((4, 2), ("i", "j"), (AxisType.Manual, AxisType.Auto))}) == 1
    assert AbstractMesh((), ()).empty


def test_bad_axis_types_are_named():
    mixed = spmd.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Explicit, AxisType.Auto))
    assert mixed.axis_types == (AxisType.Explicit, AxisType.Auto)
    with pytest.raises(DeviceError, match=r"make_mesh: axis_types=\(Manual,\): Manual axes are "
                                          r"those of a shard_map body"):
        spmd.make_mesh((8,), ("i",), axis_types=(AxisType.Manual,))
    with pytest.raises(DeviceError, match=r"make_mesh: 1 axis_types \(Auto,\) for 2 axis names"):
        spmd.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Auto,))
    with pytest.raises(DeviceError, match=r"axis_types must be spmd.sharding.AxisType values, "
                                          r"got 'auto'"):
        spmd.make_mesh((8,), ("i",), axis_types=("auto",))
    with pytest.raises(DeviceError, match=r"AbstractMesh: 2 axis sizes \(4, 2\) but 1 names"):
        AbstractMesh((4, 2), ("i",))


def test_axes_by_type():
    E, A, M = AxisType.Explicit, AxisType.Auto, AxisType.Manual
    mesh = spmd.make_mesh((2, 2, 2), ("x", "y", "z"), axis_types=(E, A, E))
    assert (mesh.explicit_axes, mesh.auto_axes, mesh.manual_axes) == (("x", "z"), ("y",), ())
    am = AbstractMesh((2, 2, 2), ("x", "y", "z"), axis_types=(M, E, A))
    assert (am.manual_axes, am.explicit_axes, am.auto_axes) == (("x",), ("y",), ("z",))
    assert mesh.abstract_mesh.explicit_axes == ("x", "z")
