"""Sharded Arrays: device_put, addressable shards, make_array_from_callback, visualize."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.shard import Shard, ShardedArray, SingleDeviceSharding
from spmd.shard.arrays.spec import ShardingError

MESHES = {
    (8,): ("i",),
    (4, 2): ("i", "j"),
    (2, 2, 2): ("x", "y", "z"),
}
SPECS = {
    (8,): [P(), P("i"), P(None, "i"), P("i", None)],
    (4, 2): [P(), P("i"), P("j"), P("i", "j"), P("j", "i"), P(None, ("i", "j")),
             P(("j", "i")), P(None, "j")],
    (2, 2, 2): [P(), P("x", "y"), P(("x", "y", "z")), P("z", ("x", "y")), P(None, "y"),
                P(("y", "x"), "z")],
}
CASES = [(shape, spec) for shape in MESHES for spec in SPECS[shape]]


def _mesh(shape):
    return spmd.make_mesh(shape, MESHES[shape])


def _value(shape=(8, 16), dtype=np.float32):
    return np.arange(np.prod(shape), dtype=dtype).reshape(shape)


# --------------------------------------------------------------- device_put

@pytest.mark.parametrize("mesh_shape,spec", CASES)
def test_device_put_round_trip_and_shards(mesh_shape, spec):
    mesh = _mesh(mesh_shape)
    x = _value()
    s = NamedSharding(mesh, spec)
    a = spmd.device_put(x, s)
    assert isinstance(a, spmd.Array)
    np.testing.assert_array_equal(np.asarray(a), x)
    assert a.sharding is s
    assert a.shape == x.shape and a.dtype == np.float32
    shards = a.addressable_shards
    assert [sh.device for sh in shards] == list(mesh.devices.flat)
    imap = s.devices_indices_map(x.shape)
    for sh in shards:
        assert isinstance(sh, Shard)
        assert sh.index == imap[sh.device]
        assert isinstance(sh.data, spmd.Array)
        assert sh.data.shape == s.shard_shape(x.shape)
        assert sh.data.dtype == a.dtype
        np.testing.assert_array_equal(np.asarray(sh.data), x[sh.index])
        assert sh.data.sharding == SingleDeviceSharding(sh.device)
    assert a.is_fully_addressable
    assert a.is_fully_replicated == (not spec.mesh_axes)


@pytest.mark.parametrize("mesh_shape,spec", CASES)
def test_replica_ids_number_the_copies(mesh_shape, spec):
    mesh = _mesh(mesh_shape)
    a = spmd.device_put(_value(), NamedSharding(mesh, spec))
    copies = mesh.size // (mesh.axis_size(spec.mesh_axes) if spec.mesh_axes else 1)
    by_block: dict = {}
    for sh in a.addressable_shards:
        key = tuple((sl.start, sl.stop) for sl in sh.index)
        by_block.setdefault(key, []).append(sh.replica_id)
    assert all(ids == list(range(copies)) for ids in by_block.values())
    assert len(by_block) == mesh.size // copies


def test_addressable_data():
    a = spmd.device_put(_value((8,)), NamedSharding(_mesh((8,)), P("i")))
    np.testing.assert_array_equal(np.asarray(a.addressable_data(5)), [5.0])


def test_unplaced_array_is_on_device_zero():
    a = snp.arange(6)
    s = a.sharding
    assert isinstance(s, SingleDeviceSharding)
    assert s.device == spmd.devices()[0] and s.device_set == {spmd.devices()[0]}
    assert s.is_fully_replicated() and a.is_fully_replicated and a.is_fully_addressable
    (sh,) = a.addressable_shards
    assert sh.device == spmd.devices()[0] and sh.replica_id == 0
    assert sh.index == (slice(None),)
    np.testing.assert_array_equal(np.asarray(sh.data), np.arange(6))


def test_device_put_without_sharding():
    a = spmd.device_put(np.ones((2, 3)))
    assert isinstance(a, spmd.Array) and not isinstance(a, ShardedArray)
    assert isinstance(a.sharding, SingleDeviceSharding)
    b = snp.ones(3)
    assert spmd.device_put(b) is b


def test_device_put_on_a_device():
    d = spmd.devices()[3]
    a = spmd.device_put(np.ones(3), d)
    assert a.sharding == SingleDeviceSharding(d)
    assert a.addressable_shards[0].device == d


def test_device_put_copies_numpy_input():
    x = np.zeros(8, np.float32)
    a = spmd.device_put(x, NamedSharding(_mesh((8,)), P("i")))
    x[0] = 7.0
    assert np.asarray(a)[0] == 0.0


def test_device_put_resharding_an_array():
    mesh = _mesh((4, 2))
    a = spmd.device_put(_value(), NamedSharding(mesh, P("i")))
    b = spmd.device_put(a, NamedSharding(mesh, P(None, "j")))
    assert b.sharding.spec == P(None, "j") and a.sharding.spec == P("i")
    np.testing.assert_array_equal(np.asarray(b), _value())
    assert b.addressable_shards[1].data.shape == (8, 8)


def test_device_put_canonicalizes_dtypes():
    mesh = _mesh((8,))
    a = spmd.device_put(np.arange(8, dtype=np.float64), NamedSharding(mesh, P("i")))
    assert a.dtype == np.float32
    b = spmd.device_put(np.arange(8, dtype=np.int64))
    assert b.dtype == np.int32
    c = spmd.device_put(np.arange(8, dtype=np.uint8))
    assert c.dtype == np.uint8


def test_device_put_x64():
    prev = spmd.config.enable_x64
    spmd.config.update("enable_x64", True)
    try:
        a = spmd.device_put(np.arange(8, dtype=np.float64), NamedSharding(_mesh((8,)), P("i")))
        assert a.dtype == np.float64
        assert spmd.device_put(1.5).dtype == np.float64
    finally:
        spmd.config.update("enable_x64", prev)


def test_device_put_scalars_stay_weak():
    a = spmd.device_put(2.0)
    assert a.shape == () and a.dtype == np.float32 and a.weak_type
    b = spmd.device_put(np.float32(2.0), NamedSharding(_mesh((8,)), P()))
    assert not b.weak_type and b.is_fully_replicated
    assert spmd.device_put(True).dtype == np.bool_


def test_device_put_pytree_with_one_sharding():
    mesh = _mesh((4, 2))
    s = NamedSharding(mesh, P("i"))
    tree = {"w": _value((8, 2)), "b": [np.ones(4), np.ones((4, 3))]}
    out = spmd.device_put(tree, s)
    assert set(out) == {"w", "b"} and isinstance(out["b"], list)
    for leaf in (out["w"], out["b"][0], out["b"][1]):
        assert leaf.sharding is s
    np.testing.assert_array_equal(np.asarray(out["w"]), tree["w"])


def test_device_put_pytree_prefix():
    mesh = _mesh((4, 2))
    row, rep = NamedSharding(mesh, P("i")), NamedSharding(mesh, P())
    tree = {"w": (_value((8, 2)), _value((4,))), "b": np.ones(3)}
    out = spmd.device_put(tree, {"w": (row, None), "b": rep})
    assert out["w"][0].sharding is row
    assert isinstance(out["w"][1].sharding, SingleDeviceSharding)
    assert out["b"].sharding is rep


def test_device_put_error_names_the_path():
    mesh = _mesh((4, 2))
    tree = {"w": [np.ones((8, 2)), np.ones((6, 2))]}
    with pytest.raises(ShardingError, match=r"device_put: x\['w'\]\[1\]: dimension 0 of size 6 "
                                            r"is not divisible by 4"):
        spmd.device_put(tree, NamedSharding(mesh, P("i")))
    with pytest.raises(ShardingError, match=r"device_put: x: spec .* has 2 entries but the "
                                            r"array has rank 1"):
        spmd.device_put(np.ones(8), NamedSharding(mesh, P("i", "j")))


def test_device_put_not_a_prefix():
    mesh = _mesh((8,))
    s = NamedSharding(mesh, P())
    with pytest.raises(ShardingError, match=r"not a pytree prefix of x: at x the sharding is a "
                                            r"tuple of length 2 but the value is a dict"):
        spmd.device_put({"a": np.ones(2)}, (s, s))
    with pytest.raises(ShardingError, match=r"at x\[1\] the sharding is a list of length 1 but "
                                            r"the value is a ndarray"):
        spmd.device_put((np.ones(2), np.ones(2)), (s, [s]))


def test_device_put_bad_sharding_objects():
    with pytest.raises(ShardingError, match=r"PartitionSpec\('i'\) without a mesh; pass "
                                            r"NamedSharding\(mesh"):
        spmd.device_put(np.ones(8), P("i"))
    with pytest.raises(ShardingError, match="expected a NamedSharding, a Device or None"):
        spmd.device_put(np.ones(8), "i")


def test_device_put_non_array_leaf():
    with pytest.raises(DTypeError, match=r"device_put: x\['s'\] is a str"):
        spmd.device_put({"s": "hello"})


def test_device_put_traced_value():
    s = NamedSharding(_mesh((8,)), P("i"))
    with pytest.raises(ShardingError, match="with_sharding_constraint"):
        spmd.jit(lambda x: spmd.device_put(x, s))(np.ones(8, np.float32))
    # Without a sharding a traced value passes through.
    out = spmd.jit(lambda x: spmd.device_put(x) * 2)(np.ones(8, np.float32))
    np.testing.assert_array_equal(np.asarray(out), 2 * np.ones(8))


def test_sharded_array_repr_is_plain():
    x = _value((4, 2))
    a = spmd.device_put(x, NamedSharding(_mesh((4, 2)), P("i", "j")))
    b = spmd.device_put(x)
    assert repr(a) == repr(b)
    assert "Sharding" not in repr(a) and "mesh" not in repr(a).lower()
    assert str(a) == str(x)


def test_sharded_arrays_compute():
    mesh = _mesh((4, 2))
    a = spmd.device_put(_value((8, 4)), NamedSharding(mesh, P("i", "j")))
    np.testing.assert_allclose(np.asarray(snp.sum(a * 2.0, axis=0)),
                               2 * _value((8, 4)).sum(axis=0))


def test_single_device_sharding():
    d0, d1 = spmd.devices()[:2]
    s = SingleDeviceSharding(d0)
    assert s == SingleDeviceSharding(d0) and hash(s) == hash(SingleDeviceSharding(d0))
    assert s != SingleDeviceSharding(d1)
    assert s.shard_shape((3, 4)) == (3, 4)
    assert s.devices_indices_map((3, 4)) == {d0: (slice(None), slice(None))}
    assert s.is_fully_addressable
    assert repr(s) == "SingleDeviceSharding(device=CPUDevice(id=0))"
    with pytest.raises(ShardingError, match="expected an spmd Device"):
        SingleDeviceSharding(0)
    with pytest.raises(ShardingError, match="holds no block"):
        s.device_index(d1, (3,))


# ------------------------------------------------- make_array_from_callback

@pytest.mark.parametrize("mesh_shape,spec", CASES)
def test_make_array_from_callback(mesh_shape, spec):
    mesh = _mesh(mesh_shape)
    s = NamedSharding(mesh, spec)
    x = _value()
    calls = []

    def cb(index):
        calls.append(index)
        return x[index]

    a = spmd.make_array_from_callback(x.shape, s, cb)
    np.testing.assert_array_equal(np.asarray(a), x)
    assert a.sharding is s and a.dtype == np.float32 and not a.weak_type
    # Once per distinct block.
    keys = [tuple((sl.start, sl.stop) for sl in idx) for idx in calls]
    assert len(keys) == len(set(keys))
    assert len(calls) == len({tuple((sl.start, sl.stop) for sl in i)
                              for i in s.devices_indices_map(x.shape).values()})
    for sh in a.addressable_shards:
        np.testing.assert_array_equal(np.asarray(sh.data), x[sh.index])


def test_make_array_from_callback_returning_arrays_and_canonical_dtype():
    mesh = _mesh((8,))
    x = np.arange(16, dtype=np.float64)
    a = spmd.make_array_from_callback((16,), NamedSharding(mesh, P("i")),
                                      lambda idx: snp.asarray(x[idx]))
    assert a.dtype == np.float32
    b = spmd.make_array_from_callback((16,), NamedSharding(mesh, P("i")), lambda idx: x[idx])
    assert b.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(b), x)


def test_make_array_from_callback_on_a_device():
    d = spmd.devices()[2]
    a = spmd.make_array_from_callback((2, 2), d, lambda idx: np.eye(2, dtype=np.int32)[idx])
    assert a.sharding == SingleDeviceSharding(d)
    np.testing.assert_array_equal(np.asarray(a), np.eye(2))


def test_make_array_from_callback_wrong_block_shape():
    s = NamedSharding(_mesh((4, 2)), P("i"))
    with pytest.raises(ShapeError, match=r"returned a block of shape \(8, 4\), but this "
                                         r"sharding's blocks have shape \(2, 4\)"):
        spmd.make_array_from_callback((8, 4), s, lambda idx: np.zeros((8, 4)))


def test_make_array_from_callback_mixed_dtypes():
    s = NamedSharding(_mesh((8,)), P("i"))

    def cb(idx):
        return np.zeros(1, np.float32 if idx[0].start < 4 else np.int32)

    with pytest.raises(DTypeError, match="blocks of different dtypes .*float32.*int32"):
        spmd.make_array_from_callback((8,), s, cb)


def test_make_array_from_callback_bad_arguments():
    s = NamedSharding(_mesh((8,)), P("i"))
    with pytest.raises(ShardingError, match=r"make_array_from_callback: sharding: dimension 0 "
                                            r"of size 6 is not divisible by 8"):
        spmd.make_array_from_callback((6,), s, lambda idx: np.zeros(1))
    with pytest.raises(ArgumentError, match="shape must be a tuple of ints"):
        spmd.make_array_from_callback(None, s, lambda idx: np.zeros(1))
    with pytest.raises(ShardingError, match="sharding is None"):
        spmd.make_array_from_callback((8,), None, lambda idx: np.zeros(1))
    with pytest.raises(DTypeError, match="dtype <U1"):
        spmd.make_array_from_callback((8,), s, lambda idx: np.array(["a"]))


# ---------------------------------------------------------------- visualize

def test_visualize_4x2_mesh(capsys):
    mesh = _mesh((4, 2))
    a = spmd.device_put(np.zeros((8, 4)), NamedSharding(mesh, P("i", "j")))
    text = spmd.visualize_array_sharding(a)
    assert text in capsys.readouterr().out  # printed as well as returned
    rows = [ln for ln in text.splitlines() if "CPU" in ln]
    assert len(rows) == 4
    for r, line in enumerate(rows):
        assert _cells(line) == [f"CPU {2 * r}", f"CPU {2 * r + 1}"]


def test_visualize_plain_text_exact(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_rich(name, *args, **kw):  # force the plain-text grid even where rich exists
        if name == "rich" or name.startswith("rich."):
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_rich)
    a = spmd.device_put(np.zeros((8, 4)), NamedSharding(_mesh((4, 2)), P("i", None)))
    assert spmd.visualize_array_sharding(a) == "\n".join([
        "+---------+",
        "| CPU 0,1 |",
        "+---------+",
        "| CPU 2,3 |",
        "+---------+",
        "| CPU 4,5 |",
        "+---------+",
        "| CPU 6,7 |",
        "+---------+",
    ])


def test_visualize_replicated_and_transposed_specs():
    mesh = _mesh((4, 2))
    a = spmd.device_put(np.zeros((8, 4)), NamedSharding(mesh, P()))
    rows = [ln for ln in spmd.visualize_array_sharding(a).splitlines() if "CPU" in ln]
    assert [_cells(r) for r in rows] == [["CPU 0,1,2,3,4,5,6,7"]]
    b = spmd.device_put(np.zeros((4, 8)), NamedSharding(mesh, P("j", "i")))
    rows = [_cells(ln) for ln in spmd.visualize_array_sharding(b).splitlines() if "CPU" in ln]
    assert rows == [["CPU 0", "CPU 2", "CPU 4", "CPU 6"], ["CPU 1", "CPU 3", "CPU 5", "CPU 7"]]


def test_visualize_1d():
    mesh = _mesh((4, 2))
    a = spmd.device_put(np.zeros(8), NamedSharding(mesh, P("i")))
    rows = [_cells(ln) for ln in spmd.visualize_array_sharding(a).splitlines() if "CPU" in ln]
    assert rows == [["CPU 0,1", "CPU 2,3", "CPU 4,5", "CPU 6,7"]]


def test_visualize_unplaced_and_scalar():
    rows = [_cells(ln) for ln in spmd.visualize_array_sharding(snp.ones(3)).splitlines()
            if "CPU" in ln]
    assert rows == [["CPU 0"]]
    assert "CPU 0" in spmd.visualize_array_sharding(np.float32(1.0))


def test_visualize_rank_3_is_an_error():
    with pytest.raises(ShapeError, match=r"only 0-, 1- and 2-d arrays .* shape \(2, 2, 2\)"):
        spmd.visualize_array_sharding(snp.zeros((2, 2, 2)))


def _cells(line: str) -> list[str]:
    """The labels of one printed grid row (plain '|' or rich's box characters)."""
    for bar in "│┃":
        line = line.replace(bar, "|")
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.parametrize("shape,spec", CASES)
def test_addressable_block_is_the_shards_data(shape, spec):
    # addressable_block reads a shard's bytes without building the shards (the fast
    # tier of checkpoints reads every leaf at every step): the same bytes, for arrays
    # holding their whole value (device_put) and their blocks (a jitted result).
    from spmd.shard.arrays.sharded import addressable_block

    mesh = _mesh(shape)
    whole = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    x = spmd.device_put(whole, NamedSharding(mesh, spec))
    y = spmd.jit(lambda a: a * 2, out_shardings=NamedSharding(mesh, spec))(x)
    for arr, want in ((x, whole), (y, whole * 2)):
        shards = arr.addressable_shards
        for k, s in enumerate(shards):
            got = np.asarray(addressable_block(arr, k))
            np.testing.assert_array_equal(got, np.asarray(s.data))
            np.testing.assert_array_equal(got, want[s.index])
