"""Every producer of an Array spread over processes holds only this process's blocks.

On every rank, the bytes an Array holds equal the sum of its addressable blocks
(one block per device of this process; the whole value only where this process
holds all of it), and making it allocates no more than the local-block-sized
buffers it needs (the peak of numpy's allocations, traced by ``tracemalloc``):
on 4 ranks that is less than one buffer of the global shape.  Runs on 4 ranks
with one device each and on 2 ranks with 2 devices each.
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import make_mesh  # noqa: E402

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding, P, lax  # noqa: E402
from spmd.compiler.engine import loops  # noqa: E402
from spmd.shard.arrays.sharded import holds_full_value  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

ROWS = 64 * 1024  # 64K x 4 float32 = 1 MiB global: large next to every small temporary


def _x():
    return np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)


def _local_rows(mesh, x):
    n, me = len(mesh.local_devices), spmd.process_index()
    b = x.shape[0] // mesh.size
    return x[me * n * b:(me + 1) * n * b]


def assert_holds_only_its_blocks(a, want=None):
    """``a`` holds exactly its addressable blocks (whole only where it holds all), and
    they are ``want``'s blocks."""
    shards = a.addressable_shards
    assert [s.device for s in shards] == [d for d in a.sharding.mesh.devices.flat
                                          if d.process_index == spmd.process_index()]
    if holds_full_value(a.sharding):
        assert a.held_nbytes == a.nbytes
    else:
        assert a._value is None
        assert a.held_nbytes == sum(s.data.nbytes for s in shards) < a.nbytes
    if want is not None:
        for s in shards:
            np.testing.assert_allclose(np.asarray(s.data), want[s.index], rtol=1e-6)


SLACK = 64 * 1024  # small temporaries (programs, index arrays)


def _budget(x, mesh, k):
    """``k`` buffers of this process's part of ``x``, and some slack."""
    return k * x.nbytes * len(mesh.local_devices) // mesh.size + SLACK


def _all_ranks(items: list) -> list:
    """``(rank, *item)`` for every rank's ``items`` (the same list on every rank)."""
    from mpi4py import MPI

    return [(r, *it) for r, its in enumerate(MPI.COMM_WORLD.allgather(items)) for it in its]


class _Peak:
    """The peak of traced allocations (numpy's included) inside the block, in bytes."""

    def __enter__(self):
        # Garbage left by earlier steps (cycles holding buffers) is freed at a time
        # that differs between processes; collected first, every rank measures alike.
        gc.collect()
        tracemalloc.start()
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc):
        self.bytes = tracemalloc.get_traced_memory()[1] - self.base
        tracemalloc.stop()


def test_producers_hold_only_their_blocks():
    mesh = make_mesh("1d")
    x = _x()
    s = NamedSharding(mesh, P("i"))
    local = _local_rows(mesh, x)
    budget = _budget(x, mesh, 1)  # the blocks themselves, no copy of them
    # Once before measuring: the first call's lazy imports and caches are not blocks
    # (run alone, this file's first measurement counted them: 571 against 328 KB).
    spmd.make_array_from_process_local_data(s, local)
    spmd.make_array_from_callback(x.shape, s, lambda idx: x[idx])
    with _Peak() as p:
        a = spmd.make_array_from_process_local_data(s, local)
    assert p.bytes < budget
    assert_holds_only_its_blocks(a, x)
    with _Peak() as p:
        b = spmd.make_array_from_callback(x.shape, s, lambda idx: x[idx])
    assert p.bytes < budget
    assert_holds_only_its_blocks(b, x)
    c = spmd.device_put(x, s)  # (the global numpy input is the caller's)
    assert_holds_only_its_blocks(c, x)
    d = spmd.device_put(a, NamedSharding(mesh, P("i")))
    assert_holds_only_its_blocks(d, x)


def test_computed_arrays_hold_only_their_blocks():
    mesh = make_mesh("1d")
    x = _x()
    s = NamedSharding(mesh, P("i"))
    a = spmd.make_array_from_process_local_data(s, _local_rows(mesh, x))
    double = spmd.shard_map(lambda b: b * 2.0, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    gathered = spmd.shard_map(lambda b: lax.all_gather(b[:2], "i", tiled=True), mesh=mesh,
                              in_specs=P("i"), out_specs=P("i"))
    jitted = spmd.jit(double)
    f = spmd.jit(lambda v: v * v - 1.0)
    pj = spmd.jit(lambda v: v + 1.0, in_shardings=s, out_shardings=s)
    # (maker, expected value, local-sized buffers it may allocate)
    cases = {
        "shard_map": (lambda: double(a), 2 * x, 1),
        "jit(shard_map)": (lambda: jitted(a), 2 * x, 1),
        "jit(shard_map) of numpy": (lambda: jitted(x), 2 * x, 2),  # slice, then double
        "eager elementwise": (lambda: snp.tanh(a) + a, np.tanh(x) + x, 2),
        "jit(f)": (lambda: f(a), x * x - 1, 2),
        "partitioned jit": (lambda: pj(a), x + 1, 1),
        "collective": (lambda: gathered(a), None, 1),
    }
    over = []
    for name, (make, want, k) in cases.items():
        # Traced and compiled, past the switch to compiled loops (whose compilation,
        # in a background thread, would be counted): then measured.
        for _ in range(loops.SWITCH_AT):
            make()
        loops.wait_compiled()
        with _Peak() as p:
            out = make()
        assert out.sharding == s, name
        if p.bytes > _budget(x, mesh, k):
            over.append((name, p.bytes))
        assert_holds_only_its_blocks(out, want)
        del out  # (its buffers free before the next case's measurement)
    # Every rank runs every case (a rank that stopped at its first failure would
    # leave the others in collectives it never joins), then all fail together.
    over_anywhere = _all_ranks(over)
    assert not over_anywhere, f"over the budget (rank, case, bytes): {over_anywhere}"
    g = spmd.grad(lambda v: snp.sum(jitted(v) ** 2))(a)
    assert g.sharding == s
    assert_holds_only_its_blocks(g, 8 * x)


def test_replicated_results_are_whole():
    mesh = make_mesh("1d")
    x = _x()
    a = spmd.device_put(x, NamedSharding(mesh, P("i")))
    total = snp.sum(a)
    assert holds_full_value(total.sharding) and total.held_nbytes == total.nbytes
    np.testing.assert_allclose(float(total), x.sum(dtype=np.float64), rtol=1e-5)
    # process_allgather is the one path that materialises the global value.
    np.testing.assert_array_equal(spmd.process_allgather(a), x)
