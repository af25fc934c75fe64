"""Device.memory_stats(): each simulated device counts its own blocks of live Arrays;
creation, deletion (delete, donation, garbage) move bytes_in_use by exactly those
blocks, and the peak holds the maximum."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.errors import DeviceError
from spmd.mesh.devices import Device
from spmd.shard.arrays import memory
from spmd.sharding import NamedSharding


@pytest.fixture(autouse=True)
def _counting_afresh():
    memory.stop()
    yield
    memory.stop()


def _in_use():
    gc.collect()  # (garbage of earlier work, in cycles, is not live)
    return [d.memory_stats()["bytes_in_use"] for d in spmd.devices()]


def _moved(before):
    return [a - b for a, b in zip(_in_use(), before)]


def test_keys_are_jax_s():
    stats = spmd.devices()[0].memory_stats()
    assert set(stats) == {"bytes_in_use", "peak_bytes_in_use"}
    assert all(type(v) is int for v in stats.values())


def test_sharded_over_4_devices_each_counts_a_quarter():
    mesh = spmd.make_mesh((4,), ("d",))  # devices 0..3 of the 8
    before = _in_use()
    x = spmd.device_put(np.zeros(64, np.float32), NamedSharding(mesh, P("d")))
    assert _moved(before) == [64] * 4 + [0] * 4
    x.delete()
    assert _moved(before) == [0] * 8


def test_replicated_counts_whole_on_each_device():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    before = _in_use()
    x = spmd.device_put(np.zeros((8, 4), np.float32), NamedSharding(mesh, P()))
    y = spmd.device_put(np.zeros((8, 4), np.float32), NamedSharding(mesh, P(None, "j")))
    assert _moved(before) == [128 + 64] * 8
    del x, y
    gc.collect()
    assert _moved(before) == [0] * 8


def test_an_unplaced_array_counts_on_the_default_device():
    before = _in_use()
    a = snp.ones((10, 10), dtype=np.float32)
    assert _moved(before) == [400] + [0] * 7
    del a
    gc.collect()
    assert _moved(before) == [0] * 8


def test_donation_subtracts_the_donated_input():
    mesh = spmd.make_mesh((8,), ("d",))
    s = NamedSharding(mesh, P("d"))
    step = spmd.jit(lambda v: v + 1, donate_argnums=0)
    x = spmd.device_put(np.zeros(32, np.float32), s)
    step(spmd.device_put(np.zeros(32, np.float32), s))  # (compiled before counting)
    before = _in_use()
    y = step(x)
    assert x.is_deleted()
    # The input's 16 bytes a device gone, the result's 16 came.
    assert _moved(before) == [0] * 8
    del y
    gc.collect()
    assert _moved(before) == [-16] * 8


def test_the_peak_holds_the_maximum():
    mesh = spmd.make_mesh((8,), ("d",))
    s = NamedSharding(mesh, P("d"))
    first = [d.memory_stats() for d in spmd.devices()]
    xs = [spmd.device_put(np.zeros(80, np.float32), s) for _ in range(3)]  # 40 bytes each
    del xs
    gc.collect()
    later = [d.memory_stats() for d in spmd.devices()]
    for k, (a, b) in enumerate(zip(first, later)):
        assert b["bytes_in_use"] == a["bytes_in_use"]
        peak = max(a["peak_bytes_in_use"], a["bytes_in_use"] + 120)
        if k:
            assert b["peak_bytes_in_use"] == peak
        else:  # (device_put made the whole value on device 0 a moment: a higher peak)
            assert b["peak_bytes_in_use"] >= peak


def test_counting_begins_with_the_arrays_alive_then():
    mesh = spmd.make_mesh((2,), ("d",))
    x = spmd.device_put(np.zeros(10, np.int32), NamedSharding(mesh, P("d")))  # before counting
    before = _in_use()
    x.delete()
    assert _moved(before) == [-20, -20] + [0] * 6


def test_a_device_of_another_process_raises():
    other = Device(99, process_index=1, local_id=0)
    with pytest.raises(DeviceError, match="belongs to process 1.*own devices"):
        other.memory_stats()
