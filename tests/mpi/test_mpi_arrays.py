"""Arrays spread over processes: shards, gathering, building from local data, guards.

Runs on 4 ranks with one device each (``make test``) and on 2 ranks with
2 devices each (``test_hybrid_subprocess.py``).  An Array on a
mesh of several processes holds, in this process, only its devices' blocks
(never a buffer of the global shape unless it holds the whole value); reading
the whole value needs ``spmd.process_allgather``; eager operations on it run as
SPMD computations over the processes.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import make_mesh  # noqa: E402

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding, P, lax  # noqa: E402
from spmd.errors import NotFullyAddressableError, ShapeError  # noqa: E402

# Generic in the number of devices (even) and of devices per process: also run on
# 2 ranks x 2 devices by test_hybrid_subprocess.py.
pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _me():
    return spmd.process_index()


def _global(shape=(8, 8), dtype=np.float32):
    return np.arange(np.prod(shape), dtype=dtype).reshape(shape)


_SPECS_2D = [P("a"), P("b"), P("a", "b"), P("b", "a"), P(("a", "b")), P(None, ("b", "a")), P()]
SPECS = {"1d": [P("i"), P(None, "i"), P(), P("i", None)], "2d": _SPECS_2D, "2dT": _SPECS_2D}
CASES = [(k, s) for k in SPECS for s in SPECS[k]]
CASE_IDS = [f"{k}-{s}" for k, s in CASES]


# ------------------------------------------------------------------- device_put

@pytest.mark.parametrize("kind,spec", CASES, ids=CASE_IDS)
def test_device_put_fills_local_blocks_and_gathers_back(kind, spec):
    mesh = make_mesh(kind)
    x = _global()
    s = NamedSharding(mesh, spec)
    a = spmd.device_put(x, s)
    assert a.sharding is s and a.shape == x.shape and a.dtype == np.float32
    assert not a.is_fully_addressable
    assert a.is_fully_replicated == (not spec.mesh_axes)
    # The blocks of this process's devices, in mesh order, read from its buffer.
    shards = a.addressable_shards
    assert [sh.device for sh in shards] == mesh.local_devices
    for sh in shards:
        assert sh.index == s.device_index(sh.device, x.shape)
        np.testing.assert_array_equal(np.asarray(sh.data), x[sh.index])
        assert sh.data.is_fully_addressable
    np.testing.assert_array_equal(np.asarray(a.addressable_data(0)), x[shards[0].index])
    np.testing.assert_array_equal(spmd.process_allgather(a), x)
    np.testing.assert_array_equal(spmd.process_allgather(a, tiled=True), x)


@pytest.mark.parametrize("kind", ["2d", "2dT"])
def test_replica_ids_across_processes(kind):
    mesh = make_mesh(kind)
    a = spmd.device_put(_global(), NamedSharding(mesh, P("a")))
    # Device (a, b) holds replica b of row block a.
    for sh in a.addressable_shards:
        assert sh.replica_id == mesh.coords(sh.device)[1]


def test_device_put_of_a_spread_array_reshards_through_a_gather():
    mesh = make_mesh("2d")
    x = _global()
    a = spmd.device_put(x, NamedSharding(mesh, P("a", "b")))
    # Every process already holds what P("a", "b") asks: no exchange needed...
    same = spmd.device_put(a, NamedSharding(mesh, P("a", "b")))
    np.testing.assert_array_equal(spmd.process_allgather(same), x)
    # ...but P("b") and P() need other processes' blocks: exchanged, never gathered
    # whole where the new placement does not hold the whole value.
    for spec in (P("b"), P(), P(None, "a"), P("b", "a"), P(("a", "b"))):
        b = spmd.device_put(a, NamedSharding(mesh, spec))
        assert b.sharding.spec == spec
        if not spec.mesh_axes:
            assert b.held_nbytes == x.nbytes
        else:
            assert b.held_nbytes == sum(s.data.nbytes for s in b.addressable_shards)
        for s in b.addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), x[s.index])
        np.testing.assert_array_equal(spmd.process_allgather(b), x)
    np.testing.assert_array_equal(np.asarray(spmd.device_put(a, NamedSharding(mesh, P()))), x)


# ------------------------------------------------------- make_array_from_callback

@pytest.mark.parametrize("kind,spec", CASES, ids=CASE_IDS)
def test_make_array_from_callback_asks_only_for_local_blocks(kind, spec):
    mesh = make_mesh(kind)
    x = _global()
    s = NamedSharding(mesh, spec)
    asked = []

    def cb(index):
        asked.append(index)
        return x[index]

    a = spmd.make_array_from_callback(x.shape, s, cb)
    mine = {tuple((sl.start, sl.stop) for sl in s.device_index(d, x.shape))
            for d in mesh.local_devices}
    assert {tuple((sl.start, sl.stop) for sl in idx) for idx in asked} == mine
    assert len(asked) == len(mine)
    np.testing.assert_array_equal(spmd.process_allgather(a), x)


# --------------------------------------------- make_array_from_process_local_data

def test_local_data_of_a_batch_split_over_ranks():
    mesh = make_mesh("1d")
    # Rank r gives the rows of its devices (consecutive in the mesh): b rows each.
    b, local = 3, len(mesh.local_devices)
    x = _global((mesh.size * b, 4))
    rows = slice(_me() * local * b, (_me() + 1) * local * b)
    a = spmd.make_array_from_process_local_data(NamedSharding(mesh, P("i")), x[rows])
    assert a.shape == x.shape and a.dtype == np.float32
    np.testing.assert_array_equal(spmd.process_allgather(a), x)
    # The same with the global shape given.
    a2 = spmd.make_array_from_process_local_data(NamedSharding(mesh, P("i")), x[rows],
                                                 x.shape)
    np.testing.assert_array_equal(spmd.process_allgather(a2), x)


def _held(sharding, dim, size):
    """The indices along ``dim`` of the distinct blocks this process's devices hold."""
    idx = sorted({sharding.device_index(d, size)[dim].indices(size[dim])[:2]
                  for d in sharding.mesh.local_devices})
    return np.concatenate([np.arange(lo, hi) for lo, hi in idx])


@pytest.mark.parametrize("kind", ["2d", "2dT"])
@pytest.mark.parametrize("spec", [P("a"), P("b"), P(("a", "b")), P(("b", "a")), P("a", "b"),
                                  P(None, "a"), P()], ids=str)
def test_local_data_on_a_2d_mesh_infers_the_global_shape(kind, spec):
    """Each process gives its devices' distinct blocks along each dimension, in order
    (on a hybrid job with the mesh "2dT", P(("a", "b")) gives a process blocks 0 and 2)."""
    mesh = make_mesh(kind)
    x = _global((8, 12))
    s = NamedSharding(mesh, spec)
    local = x[np.ix_(_held(s, 0, x.shape), _held(s, 1, x.shape))]
    a = spmd.make_array_from_process_local_data(s, local)
    assert a.shape == x.shape
    np.testing.assert_array_equal(spmd.process_allgather(a), x)


def test_local_data_of_the_global_shape_is_read_as_the_global_value():
    mesh = make_mesh("1d")
    x = _global()
    a = spmd.make_array_from_process_local_data(NamedSharding(mesh, P("i")), x, x.shape)
    np.testing.assert_array_equal(spmd.process_allgather(a), x)


def test_local_data_of_the_wrong_shape_is_a_clear_error():
    mesh = make_mesh("1d")
    s = NamedSharding(mesh, P("i"))
    want = 8 // mesh.size * len(mesh.local_devices)
    with pytest.raises(ShapeError, match=rf"must have shape \({want}, 8\)"):
        spmd.make_array_from_process_local_data(s, np.zeros((3, 8), np.float32), (8, 8))
    with pytest.raises(ShapeError, match="global_shape"):
        spmd.make_array_from_process_local_data(s, np.zeros((2, 8), np.float32), (8,))
    with pytest.raises(ShapeError, match="not divisible"):
        spmd.make_array_from_process_local_data(s, np.zeros((2, 8), np.float32), (9, 8))


# -------------------------------------------------------------- process_allgather

def test_process_allgather_of_process_local_values_stacks_or_concatenates():
    n = spmd.process_count()
    me = _me()
    local = np.full((2, 3), me, np.int32)
    stacked = spmd.process_allgather(local)
    assert stacked.shape == (n, 2, 3)
    np.testing.assert_array_equal(stacked[:, 0, 0], np.arange(n))
    tiled = spmd.process_allgather(local, tiled=True)
    assert tiled.shape == (2 * n, 3)
    np.testing.assert_array_equal(tiled[:, 0], np.repeat(np.arange(n), 2))
    # Scalars are stacked either way; Arrays of this process are process-local too.
    np.testing.assert_array_equal(spmd.process_allgather(np.float32(me), tiled=True),
                                  np.arange(n, dtype=np.float32))
    np.testing.assert_array_equal(spmd.process_allgather(snp.ones(2) * me)[:, 0], np.arange(n))


def test_process_allgather_of_a_pytree():
    mesh = make_mesh("2d")
    x = _global()
    tree = {"w": spmd.device_put(x, NamedSharding(mesh, P("a", "b"))),
            "rep": spmd.device_put(x[0], NamedSharding(mesh, P())),
            "local": (np.int32(_me()),)}
    out = spmd.process_allgather(tree)
    assert set(out) == {"w", "rep", "local"}
    np.testing.assert_array_equal(out["w"], x)
    np.testing.assert_array_equal(out["rep"], x[0])
    np.testing.assert_array_equal(out["local"][0], np.arange(spmd.process_count()))
    assert all(isinstance(v, np.ndarray) for v in spmd.tree_util.tree_leaves(out))


def test_process_allgather_of_mismatched_local_shapes_is_an_error_on_every_rank():
    local = np.zeros(2 + (_me() == 1), np.float32)
    with pytest.raises(ShapeError, match=r"ranks \[1\]: local \(3,\)"):
        spmd.process_allgather(local)


# ------------------------------------------------------------------------ guards

def test_reading_a_spread_array_names_process_allgather():
    mesh = make_mesh("1d")
    a = spmd.device_put(_global(), NamedSharding(mesh, P("i")))
    for read in (np.asarray, lambda v: v.tolist(), lambda v: v.item(), str):
        with pytest.raises(NotFullyAddressableError, match="process_allgather"):
            read(a)
    text = repr(a)
    assert "shape=(8, 8)" in text and "float32" in text and "NamedSharding" in text
    assert re.search(r"spec=PartitionSpec\('i'\)", text)


def test_eager_operations_run_across_processes():
    mesh = make_mesh("1d")
    x = _global()
    w = np.arange(16, dtype=np.float32).reshape(8, 2) / 8
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    cases = [(lambda v: snp.sum(v), x.sum()), (lambda v: v.T, x.T),
             (lambda v: v @ w, x @ w), (lambda v: v[0], x[0]),
             (lambda v: snp.max(v ** 2, axis=1), (x ** 2).max(1))]
    for op, want in cases:
        got = op(a)
        np.testing.assert_allclose(_whole(got), want, rtol=1e-6)
    assert float(a[0, 1]) == x[0, 1]
    # Replicated across processes: every process holds the whole value.
    rep = spmd.device_put(x, NamedSharding(mesh, P()))
    assert not rep.is_fully_addressable
    np.testing.assert_array_equal(np.asarray(rep), x)
    np.testing.assert_array_equal(np.asarray(snp.sum(rep)), x.sum())


def _whole(v):
    return spmd.process_allgather(v) if not v.is_fully_addressable and v._value is None \
        else np.asarray(v)


def test_elementwise_operations_keep_the_sharding():
    mesh = make_mesh("2d")
    x = _global()
    s = NamedSharding(mesh, P("a", "b"))
    a = spmd.device_put(x, s)
    y = snp.tanh(a * 2.0 + a) - np.float32(1)
    assert y.sharding == s
    np.testing.assert_allclose(spmd.process_allgather(y), np.tanh(x * 3.0) - 1, rtol=1e-6)
    # Mixed shardings are resharded by the partitioner.
    other = spmd.device_put(x, NamedSharding(mesh, P("b", "a")))
    np.testing.assert_array_equal(_whole(a + other), 2 * x)


def test_shard_map_reshards_inputs_whose_blocks_are_elsewhere():
    mesh = make_mesh("1d")
    x = _global()
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    wants_all = spmd.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P(), out_specs=P())
    np.testing.assert_array_equal(np.asarray(wants_all(a)), 2 * x)
    same = spmd.shard_map(lambda b: lax.psum(snp.sum(b), "i"), mesh=mesh, in_specs=P("i"),
                          out_specs=P())
    assert float(same(a)) == x.sum()
    np.testing.assert_array_equal(np.asarray(wants_all(spmd.process_allgather(a))), 2 * x)


def test_jit_takes_spread_arrays():
    mesh = make_mesh("1d")
    x = _global()
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    total = spmd.jit(spmd.shard_map(lambda b: lax.psum(snp.sum(b ** 2), "i"), mesh=mesh,
                                    in_specs=P("i"), out_specs=P()))
    np.testing.assert_allclose(float(total(a)), (x ** 2).sum(), rtol=1e-6)


def test_visualize_a_spread_array():
    mesh = make_mesh("2d")
    a = spmd.device_put(_global(), NamedSharding(mesh, P("a", "b")))
    text = spmd.visualize_array_sharding(a)
    for d in mesh.devices.flat:
        assert f"CPU {d.id}" in text
