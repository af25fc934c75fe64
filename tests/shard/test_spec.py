"""PartitionSpec semantics, check_spec errors, and the block layout of NamedSharding."""

import itertools
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, strategies as st

import spmd
from spmd import NamedSharding, P, PartitionSpec
from spmd.shard.arrays.spec import ShardingError, block_shape, check_spec, global_shape
from spmd.testing import strategies as sst


@pytest.fixture(scope="module")
def mesh42():
    return spmd.make_mesh((4, 2), ("i", "j"))


# ------------------------------------------------------------ PartitionSpec

def test_p_is_partition_spec():
    assert P is PartitionSpec
    assert spmd.P is P and spmd.PartitionSpec is P


def test_spec_is_a_tuple_of_entries():
    s = P("i", None, ("j", "k"))
    assert isinstance(s, tuple) and len(s) == 3
    assert s[0] == "i" and s[1] is None and s[2] == ("j", "k")
    assert P() == () and len(P()) == 0


def test_axes_of_and_mesh_axes():
    s = P("i", None, ("j", "k"))
    assert s.axes_of(0) == ("i",)
    assert s.axes_of(1) == ()
    assert s.axes_of(2) == ("j", "k")
    assert s.axes_of(7) == ()  # omitted trailing dims are not split
    assert s.mesh_axes == ("i", "j", "k")
    assert P().mesh_axes == ()


def test_spec_repr():
    assert repr(P("i", None)) == "PartitionSpec('i', None)"
    assert repr(P(("i", "j"))) == "PartitionSpec(('i', 'j'),)"
    assert repr(P()) == "PartitionSpec()"


def test_spec_pickles():
    s = P("i", None, ("j", "k"))
    t = pickle.loads(pickle.dumps(s))
    assert t == s and isinstance(t, PartitionSpec)


@pytest.mark.parametrize("bad", [3, ["i"], ("i", 2), 1.5])
def test_spec_bad_entries(bad):
    with pytest.raises(ShardingError, match="must be None, a mesh axis name"):
        P(bad)


def test_trailing_none_does_not_change_sharding(mesh42):
    a, b = NamedSharding(mesh42, P("i")), NamedSharding(mesh42, P("i", None))
    assert a == b and hash(a) == hash(b)
    assert a != NamedSharding(mesh42, P(None, "i"))
    assert a != NamedSharding(spmd.make_mesh((4, 2), ("i", "k")), P("i"))


# --------------------------------------------------------------- check_spec

def test_check_spec_accepts(mesh42):
    check_spec(P("i", "j"), mesh42, (8, 4), "f")
    check_spec(P(("i", "j")), mesh42, (16, 3), "f")
    check_spec(P(), mesh42, (), "f")
    check_spec(P(None, "i"), mesh42, (3, 4), "f")


def test_check_spec_axis_not_in_mesh(mesh42):
    with pytest.raises(ShardingError, match=r"f: spec .* names axis 'k', which is not in the "
                                            r"mesh \(axes \('i', 'j'\)\)"):
        check_spec(P("k"), mesh42, (8,), "f")


def test_check_spec_longer_than_rank(mesh42):
    with pytest.raises(ShardingError, match=r"has 3 entries but the array has rank 2 "
                                            r"\(shape \(8, 4\)\)"):
        check_spec(P("i", None, None), mesh42, (8, 4), "f")


@pytest.mark.parametrize("spec", [P("i", "i"), P(("i", "j"), "i"), P(("j", "j"))])
def test_check_spec_axis_used_twice(mesh42, spec):
    with pytest.raises(ShardingError, match="uses mesh axis '[ij]' twice"):
        check_spec(spec, mesh42, (8, 8), "f")


def test_check_spec_not_divisible(mesh42):
    with pytest.raises(ShardingError, match=r"dimension 1 of size 6 is not divisible by 8, the "
                                            r"size of mesh axes \('i', 'j'\)"):
        check_spec(P(None, ("i", "j")), mesh42, (4, 6), "f")
    with pytest.raises(ShardingError, match=r"dimension 0 of size 7 is not divisible by 4"):
        check_spec(P("i"), mesh42, (7,), "f")


def test_check_spec_not_a_spec(mesh42):
    with pytest.raises(ShardingError, match="expected a PartitionSpec"):
        check_spec(("i",), mesh42, (8,), "f")


def test_named_sharding_errors(mesh42):
    with pytest.raises(ShardingError, match="expected a Mesh"):
        NamedSharding("mesh", P())
    with pytest.raises(ShardingError, match="names axis 'z', not in the mesh"):
        NamedSharding(mesh42, P("z"))
    # shard_shape checks the spec against the shape.
    with pytest.raises(ShardingError, match="not divisible"):
        NamedSharding(mesh42, P("i")).shard_shape((6,))


@pytest.mark.parametrize("spec, fix", [(("i",), "write P('i')"),
                                       (("i", None), "write P('i', None)"),
                                       (["i", "j"], "write P('i', 'j')"),
                                       ("i", "write P('i')"),
                                       (3, "pass spmd.P")])
def test_named_sharding_refuses_what_is_not_a_partition_spec(mesh42, spec, fix):
    # A tuple reads like a spec but is not one; accepting it silently hid mistakes.
    with pytest.raises(ShardingError, match="spec must be a PartitionSpec") as info:
        NamedSharding(mesh42, spec)
    assert fix in str(info.value) and repr(spec) in str(info.value)


def test_sharding_errors_are_value_errors():
    assert issubclass(ShardingError, ValueError)
    assert issubclass(ShardingError, spmd.errors.SpmdError)


# ------------------------------------------------------- layout of blocks

def test_block_and_global_shape(mesh42):
    assert block_shape(P("i", "j"), mesh42, (8, 4)) == (2, 2)
    assert block_shape(P(None, ("i", "j")), mesh42, (3, 16)) == (3, 2)
    assert block_shape(P(), mesh42, (5,)) == (5,)
    assert global_shape(P("i", "j"), mesh42, (2, 2)) == (8, 4)
    assert global_shape(P(("j", "i")), mesh42, (1, 3)) == (8, 3)


def test_device_index_major_to_minor(mesh42):
    # P(("i", "j")): block k goes to the device at i = k // 2, j = k % 2.
    s = NamedSharding(mesh42, P(("i", "j")))
    assert [s.device_index(d, (16,))[0].start for d in spmd.devices()] == list(range(0, 16, 2))
    # P(("j", "i")): j is major, so device (i, j) holds block j * 4 + i.
    s = NamedSharding(mesh42, P(("j", "i")))
    starts = [s.device_index(d, (8,))[0].start for d in spmd.devices()]
    assert starts == [0, 4, 1, 5, 2, 6, 3, 7]


def test_replicated_dims_are_full_slices(mesh42):
    s = NamedSharding(mesh42, P(None, "j"))
    idx = s.device_index(spmd.devices()[3], (5, 4))
    assert idx == (slice(None), slice(2, 4))


def test_sharding_properties(mesh42):
    s = NamedSharding(mesh42, P("i"))
    assert s.device_set == set(spmd.devices())
    assert not s.is_fully_replicated()
    assert NamedSharding(mesh42, P()).is_fully_replicated()
    assert NamedSharding(mesh42, P(None, None)).is_fully_replicated()
    assert "PartitionSpec('i')" in repr(s)


# ---------------------------------------------- property: blocks tile the array

@st.composite
def meshes_and_specs(draw):
    """A mesh of up to 8 devices over 1-3 axes, a spec over its axes and a shape it fits
    (spmd.testing.strategies)."""
    mesh = draw(sst.meshes(max_devices=8, max_axes=3))
    shape, spec = draw(sst.shapes_and_specs(mesh, max_rank=3))
    return mesh, spec, shape


@given(meshes_and_specs())
def test_blocks_cover_each_replica_group_exactly_once(case):
    mesh, spec, shape = case
    sharding = NamedSharding(mesh, spec)
    check_spec(spec, mesh, shape, "test")
    want = sharding.shard_shape(shape)
    imap = sharding.devices_indices_map(shape)
    assert set(imap) == set(mesh.devices.flat)
    used = set(spec.mesh_axes)
    free = [k for k, a in enumerate(mesh.axis_names) if a not in used]
    groups: dict = {}
    for d, index in imap.items():
        # Devices that share their coordinates along the unused axes form one copy.
        key = tuple(mesh.coords(d)[k] for k in free)
        groups.setdefault(key, []).append(index)
        assert np.zeros(shape)[index].shape == want
    assert len(groups) == math.prod(mesh.axis_sizes[k] for k in free)
    for indices in groups.values():
        count = np.zeros(shape, dtype=int)
        for index in indices:
            count[index] += 1
        assert (count == 1).all()


@given(meshes_and_specs())
def test_block_shape_round_trips(case):
    mesh, spec, shape = case
    b = block_shape(spec, mesh, shape)
    assert b == NamedSharding(mesh, spec).shard_shape(shape)
    assert global_shape(spec, mesh, b) == shape


def test_every_small_spec_of_a_2x2x2_mesh_tiles():
    mesh = spmd.make_mesh((2, 2, 2), ("x", "y", "z"))
    entries = [None, "x", "y", "z", ("x", "y"), ("z", "x")]
    for a, b in itertools.product(entries, repeat=2):
        spec = P(a, b)
        if len(spec.mesh_axes) != len(set(spec.mesh_axes)):
            continue
        s = NamedSharding(mesh, spec)
        count = np.zeros((4, 8), dtype=int)
        for index in s.devices_indices_map((4, 8)).values():
            count[index] += 1
        copies = 8 // (mesh.axis_size(spec.mesh_axes) if spec.mesh_axes else 1)
        assert (count == copies).all(), spec
