"""Arrays spread over processes, without MPI: meshes that include devices of a
pretend second process (``Device(..., process_index=1)``), so that the parts that
need no communication run in the single-process suite: each producer allocates
only this process's blocks, the read guards, shape inference of
``make_array_from_process_local_data``, and process_allgather of local data.
(Computing on such arrays communicates: the MPI suite tests it.)
"""

from __future__ import annotations

import numpy as np
import pytest

import spmd
from spmd import Device, Mesh, NamedSharding, P
from spmd.errors import NotFullyAddressableError, ShapeError
from spmd.shard.arrays.multiprocess import first_uncovered_process, holds_full_value


def _mesh(shape=(4,), names=("i",)):
    """Devices 0, 1 of this process, then two of process 1 (never run on here)."""
    mine = spmd.local_devices()[:2]
    theirs = [Device(1000 + k, 1, k) for k in range(2)]
    return Mesh(np.array(mine + theirs, dtype=object).reshape(shape), names)


def _x(shape=(8, 4)):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)


def test_device_put_keeps_only_this_process_blocks():
    mesh = _mesh()
    x = _x()
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    assert not a.is_fully_addressable and not a.sharding.is_fully_addressable
    # Only this process's two blocks exist here: nothing of the global shape.
    assert a._value is None and a.held_nbytes == x[:4].nbytes
    np.testing.assert_array_equal(a.local_blocks(), x[:4].reshape(2, 2, 4))
    assert [s.index for s in a.addressable_shards] == [(slice(0, 2), slice(None)),
                                                       (slice(2, 4), slice(None))]
    np.testing.assert_array_equal(np.asarray(a.addressable_shards[1].data), x[2:4])


def test_reading_or_computing_on_a_partial_buffer_raises():
    a = spmd.device_put(_x(), NamedSharding(_mesh(), P("i")))
    with pytest.raises(NotFullyAddressableError, match="process_allgather"):
        np.asarray(a)
    for read in (lambda v: v.value, str, lambda v: v.item(), lambda v: v.tolist()):
        with pytest.raises(NotFullyAddressableError, match="process_allgather"):
            read(a)
    assert repr(a).startswith("Array(shape=(8, 4), dtype=float32, sharding=NamedSharding(")


def test_replicated_values_are_whole_here():
    x = _x()
    a = spmd.device_put(x, NamedSharding(_mesh(), P()))
    assert not a.is_fully_addressable and a.is_fully_replicated
    assert holds_full_value(a.sharding)
    np.testing.assert_array_equal(np.asarray(a), x)
    # Split only over an axis this process spans entirely: whole here too.
    b = spmd.device_put(x, NamedSharding(_mesh((2, 2), ("p", "d")), P("d")))
    assert holds_full_value(b.sharding)
    np.testing.assert_array_equal(np.asarray(b), x)


def test_make_array_from_callback_asks_only_for_local_blocks():
    asked = []
    x = _x()
    a = spmd.make_array_from_callback(x.shape, NamedSharding(_mesh(), P("i")),
                                      lambda idx: asked.append(idx) or x[idx])
    assert [i[0] for i in asked] == [slice(0, 2), slice(2, 4)]
    assert a._value is None and a.held_nbytes == x[:4].nbytes
    np.testing.assert_array_equal(a.local_blocks(), x[:4].reshape(2, 2, 4))


@pytest.mark.parametrize("spec,local_shape,global_shape", [
    (P("i"), (4, 4), (8, 4)),          # 2 of 4 row blocks here
    (P(None, "i"), (8, 2), (8, 4)),
    (P(), (8, 4), (8, 4)),
    (P("p"), (4, 4), (8, 4)),          # mesh (2, 2): one of 2 row blocks
    (P("d"), (8, 4), (8, 4)),          # this process spans 'd': every block
    (P(("d", "p")), (4, 4), (8, 4)),   # blocks 0 and 2 of 4: not adjacent
])
def test_local_data_infers_the_global_shape(spec, local_shape, global_shape):
    mesh = _mesh((4,), ("i",)) if "i" in spec.mesh_axes else _mesh((2, 2), ("p", "d"))
    s = NamedSharding(mesh, spec)
    x = _x(global_shape)
    held = [s.device_index(d, x.shape) for d in mesh.local_devices]
    rows = sorted({idx[0].indices(x.shape[0])[:2] for idx in held})
    cols = sorted({idx[1].indices(x.shape[1])[:2] for idx in held})
    local = x[np.ix_(np.concatenate([np.arange(*r) for r in rows]),
                     np.concatenate([np.arange(*c) for c in cols]))]
    assert local.shape == local_shape
    a = spmd.make_array_from_process_local_data(s, local)
    assert a.shape == global_shape
    for sh in a.addressable_shards:
        np.testing.assert_array_equal(np.asarray(sh.data), x[sh.index])
    # Each device's block, once per device: never the global shape (unless held whole).
    assert a.held_nbytes == sum(sh.data.nbytes for sh in a.addressable_shards) or \
        (holds_full_value(s) and a.held_nbytes == x.nbytes)


def test_local_data_shape_errors():
    s = NamedSharding(_mesh(), P("i"))
    with pytest.raises(ShapeError, match=r"must have shape \(4, 4\)"):
        spmd.make_array_from_process_local_data(s, np.zeros((3, 4)), (8, 4))
    with pytest.raises(ShapeError, match="not a multiple of 2"):
        spmd.make_array_from_process_local_data(s, np.zeros((3, 4)))


def test_coverage_decides_whether_a_reshard_needs_other_processes():
    mesh = _mesh((2, 2), ("p", "d"))
    have = NamedSharding(mesh, P("p", "d"))
    assert first_uncovered_process(have, NamedSharding(mesh, P("p")), (8, 4)) is None
    assert first_uncovered_process(have, NamedSharding(mesh, P()), (8, 4)) == 0
    assert first_uncovered_process(NamedSharding(mesh, P("p")), have, (8, 4)) is None


def test_process_allgather_in_one_process():
    x = _x()
    np.testing.assert_array_equal(spmd.process_allgather(x), x[None])
    np.testing.assert_array_equal(spmd.process_allgather(x, tiled=True), x)
    np.testing.assert_array_equal(spmd.process_allgather(np.float32(3)), [3.0])
    whole = spmd.device_put(x, NamedSharding(spmd.make_mesh((4,), ("i",)), P("i")))
    out = spmd.process_allgather({"a": whole}, tiled=True)
    assert isinstance(out["a"], np.ndarray)
    np.testing.assert_array_equal(out["a"], x)


@pytest.mark.parametrize("src,dst", [(P("p", "d"), P("p")), (P("p"), P("p", "d")),
                                     (P("p", "d"), P(("p", "d"))), (P(None, "d"), P("p", "d"))])
def test_resharding_within_what_this_process_holds_needs_no_global_buffer(src, dst):
    """This process (devices (0, 0) and (0, 1) of a (p, d) mesh) already holds every
    block ``dst`` places on its devices: they are cut from its own blocks."""
    mesh = _mesh((2, 2), ("p", "d"))
    x = _x((8, 4))
    a = spmd.device_put(x, NamedSharding(mesh, src))
    b = spmd.device_put(a, NamedSharding(mesh, dst))
    assert b.sharding == NamedSharding(mesh, dst) and b._value is None
    for sh in b.addressable_shards:
        np.testing.assert_array_equal(np.asarray(sh.data), x[sh.index])
