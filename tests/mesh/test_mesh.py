"""Devices and meshes: geometry, identity, and the errors of bad meshes."""

import numpy as np
import pytest

import spmd
from spmd.mesh import Device, Mesh, make_mesh
from spmd.mesh.devices import DeviceError, reset_for_tests


@pytest.fixture
def fresh_devices(monkeypatch):
    """Let a test change SPMD_NUM_DEVICES; the device list is rebuilt before and after."""
    reset_for_tests()
    yield monkeypatch
    monkeypatch.undo()
    reset_for_tests()


def test_default_devices_are_eight_simulated_cpus():
    devs = spmd.devices()
    assert spmd.device_count() == len(devs) == 8
    assert [d.id for d in devs] == list(range(8))
    assert all(d.platform == "cpu" and d.process_index == 0 for d in devs)
    assert spmd.local_devices() == devs
    assert spmd.local_device_count() == 8
    assert spmd.process_index() == 0 and spmd.process_count() == 1
    assert repr(devs[3]) == "CPUDevice(id=3)"


def test_device_identity():
    a, b = Device(1, 0, 1), Device(1, 0, 1)
    assert a == b and hash(a) == hash(b)
    assert a != Device(2, 0, 2)
    assert a != Device(1, 0, 1, platform="gpu")
    assert sorted([Device(3, 0, 3), Device(0, 0, 0)])[0].id == 0


def test_num_devices_env(fresh_devices):
    fresh_devices.setenv("SPMD_NUM_DEVICES", "4")
    reset_for_tests()
    assert spmd.device_count() == 4
    assert len(spmd.local_devices()) == 4


@pytest.mark.parametrize("raw", ["abc", "0", "-2"])
def test_num_devices_env_errors(fresh_devices, raw):
    fresh_devices.setenv("SPMD_NUM_DEVICES", raw)
    reset_for_tests()
    with pytest.raises(DeviceError, match="SPMD_NUM_DEVICES"):
        spmd.devices()


@pytest.mark.parametrize("shape,names", [((8,), ("i",)), ((4, 2), ("i", "j")),
                                         ((2, 2, 2), ("x", "y", "z")), ((1, 8), ("a", "b"))])
def test_make_mesh_geometry(shape, names):
    mesh = make_mesh(shape, names)
    assert tuple(mesh.shape.items()) == tuple(zip(names, shape))
    assert mesh.axis_names == names
    assert mesh.axis_sizes == shape
    assert mesh.size == 8
    assert mesh.devices.shape == shape
    np.testing.assert_array_equal(mesh.device_ids, np.arange(8).reshape(shape))
    # Devices are laid out in row-major order, so coords invert the reshape.
    for d in spmd.devices():
        assert mesh.coords(d) == np.unravel_index(d.id, shape)
        assert mesh.devices[mesh.coords(d)] == d
    assert mesh.local_devices == spmd.devices()
    assert not mesh.is_multi_process


def test_axis_size_of_names():
    mesh = make_mesh((2, 2, 2), ("x", "y", "z"))
    assert mesh.axis_size("x") == 2
    assert mesh.axis_size(("x", "z")) == 4
    assert mesh.axis_size(()) == 1


def test_make_mesh_smaller_than_device_count():
    mesh = make_mesh((2, 2), ("i", "j"))
    assert [d.id for d in mesh.devices.flat] == [0, 1, 2, 3]


def test_make_mesh_explicit_devices():
    devs = spmd.devices()[::-1][:4]
    mesh = make_mesh((2, 2), ("i", "j"), devices=devs)
    np.testing.assert_array_equal(mesh.device_ids, [[7, 6], [5, 4]])
    assert mesh.coords(devs[0]) == (0, 0)
    assert mesh.coords(devs[3]) == (1, 1)


def test_mesh_equality_and_hash():
    a = make_mesh((4, 2), ("i", "j"))
    b = Mesh(np.array(spmd.devices()).reshape(4, 2), ("i", "j"))
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != make_mesh((4, 2), ("i", "k"))             # other names
    assert a != make_mesh((2, 4), ("i", "j"))             # other shape
    assert a != make_mesh((8,), ("i",))
    assert a != Mesh(np.array(spmd.devices()[::-1]).reshape(4, 2), ("i", "j"))  # other order
    assert a != "mesh"


def test_mesh_single_name_string():
    mesh = Mesh(np.array(spmd.devices()), "i")
    assert mesh.axis_names == ("i",)
    assert make_mesh((8,), "i") == mesh


def test_mesh_repr_and_context_manager():
    mesh = make_mesh((4, 2), ("i", "j"))
    assert repr(mesh) == "Mesh({'i': 4, 'j': 2})"
    with mesh as m:
        assert m is mesh


def test_make_mesh_too_many_devices_names_env_var():
    with pytest.raises(DeviceError, match=r"needs 16 devices but only 8.*SPMD_NUM_DEVICES=16"):
        make_mesh((4, 4), ("i", "j"))


def test_make_mesh_too_few_explicit_devices():
    with pytest.raises(DeviceError, match="pass more devices"):
        make_mesh((2, 2), ("i", "j"), devices=spmd.devices()[:3])


def test_make_mesh_errors():
    with pytest.raises(DeviceError, match="2 axis sizes .* 1 names"):
        make_mesh((4, 2), ("i",))
    with pytest.raises(DeviceError, match="positive"):
        make_mesh((0, 2), ("i", "j"))


@pytest.mark.parametrize("shapes, expected", [((-1,), (8,)), ((-1, 2), (4, 2)),
                                              ((2, -1), (2, 4)), ((2, -1, 2), (2, 2, 2)),
                                              ((-1, 8), (1, 8))])
def test_make_mesh_minus_one_takes_the_rest_of_the_devices(shapes, expected):
    names = ("a", "b", "c")[:len(shapes)]
    mesh = make_mesh(shapes, names)
    assert mesh.axis_sizes == expected
    assert [d.id for d in mesh.devices.flat] == list(range(8))  # (all of them, in order)
    assert make_mesh(shapes, names) == make_mesh(expected, names)


def test_make_mesh_minus_one_over_explicit_devices():
    devs = spmd.devices()[2:8]
    mesh = make_mesh((-1, 2), ("i", "j"), devices=devs)
    assert mesh.axis_sizes == (3, 2) and list(mesh.devices.flat) == devs


def test_make_mesh_minus_one_errors():
    with pytest.raises(DeviceError, match=r"-1 for \['i', 'j'\]; only one axis"):
        make_mesh((-1, -1), ("i", "j"))
    with pytest.raises(DeviceError, match=r"'i' = -1 takes the rest of the 8 devices, but "
                                          r"the other axes' sizes \(3,\) \(product 3\) do not "
                                          r"divide 8"):
        make_mesh((-1, 3), ("i", "j"))
    with pytest.raises(DeviceError, match="positive"):
        make_mesh((-2, 2), ("i", "j"))
    with pytest.raises(DeviceError, match="positive"):
        make_mesh((-1, 0), ("i", "j"))


def test_mesh_wrong_number_of_names():
    devs = np.array(spmd.devices()).reshape(4, 2)
    with pytest.raises(DeviceError, match=r"2 dimensions .* 1 axis names"):
        Mesh(devs, ("i",))
    with pytest.raises(DeviceError, match=r"2 dimensions .* 3 axis names"):
        Mesh(devs, ("i", "j", "k"))


def test_mesh_duplicate_names():
    with pytest.raises(DeviceError, match="repeat"):
        Mesh(np.array(spmd.devices()).reshape(4, 2), ("i", "i"))


@pytest.mark.parametrize("name", ["", 3, None])
def test_mesh_bad_names(name):
    with pytest.raises(DeviceError, match="non-empty strings"):
        Mesh(np.array(spmd.devices()), (name,))


def test_mesh_non_device_entries():
    with pytest.raises(DeviceError, match="Device objects"):
        Mesh(np.arange(8).reshape(4, 2), ("i", "j"))
    devs = list(spmd.devices()[:3]) + ["gpu0"]
    with pytest.raises(DeviceError, match="Device objects"):
        Mesh(np.array(devs, dtype=object), ("i",))


def test_mesh_repeated_device():
    d = spmd.devices()
    with pytest.raises(DeviceError, match="twice"):
        Mesh(np.array([d[0], d[1], d[0], d[2]], dtype=object), ("i",))


def test_device_error_is_a_value_error():
    assert issubclass(DeviceError, ValueError)
    assert issubclass(DeviceError, spmd.errors.SpmdError)
