"""``spmd.testing``: checking sharded programs in tests.

- :func:`assert_sharded_allclose` compares an :class:`spmd.Array` with an expected
  value (a numpy array, or another Array whose placement must match), block by
  block, and names the block, device and element that differ;
- :func:`simulated_devices` gives a test more simulated devices than the process
  started with, and puts the old count back after;
- :mod:`spmd.testing.strategies`: hypothesis strategies for meshes, partition specs
  that fit a shape, and arrays placed by them;
- :mod:`_spmd_pytest_plugin`: the pytest plugin (registered through the ``pytest11``
  entry point, nothing to configure) with the ``spmd_mesh`` fixture and the
  ``spmd_meshes`` marker.

``docs/testing.md`` shows each.

>>> from spmd.testing import assert_sharded_allclose
>>> assert_sharded_allclose(f(x), x * 2)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

import spmd
import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.compiler.core.array import Array
from spmd.errors import ArgumentError
from spmd.launch import runtime
from spmd.mesh.devices import reset_for_tests
from spmd.shard.arrays.placing import device_put

__all__ = ["assert_sharded_allclose", "simulated_devices"]


def _index_key(index, shape) -> tuple:
    """A block's index as ``((start, stop), ...)`` whatever slice spelling it used."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _placement(sharding, shape) -> dict:
    """``{device id: ((start, stop), ...)}``: where each device's block lies."""
    return {d.id: _index_key(i, shape) for d, i in sharding.devices_indices_map(shape).items()}


def _where(index, shape) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in _index_key(index, shape)) + "]"


def _coords(sharding, device) -> str:
    mesh = getattr(sharding, "mesh", None)
    if mesh is None:
        return ""
    coords = dict(zip(mesh.axis_names, mesh.coords(device)))
    return f", mesh coordinates {coords}"


def assert_sharded_allclose(actual, expected, *, rtol: float = 1e-6, atol: float = 0.0,
                            check_sharding: bool = True, err_msg: str = "") -> None:
    """Assert that the placed array ``actual`` equals ``expected`` within tolerance, block
    by block.

    ``expected`` is a numpy array (or anything ``np.asarray`` takes) holding the global
    value, or an :class:`spmd.Array`, whose placement must then match ``actual``'s
    (each device holding the same block; ``check_sharding=False`` compares values
    only).  Only this process's blocks are compared (on a multi-process mesh each rank
    checks its own, and nothing of the global shape is made).  A failure names the
    block that differs: its device, its mesh coordinates, where it lies in the global
    array, how many of its elements differ, and the first of them with both values.

    >>> x = spmd.device_put(np.arange(8.0), NamedSharding(mesh, P("i")))
    >>> assert_sharded_allclose(spmd.jit(lambda v: v * 2)(x), np.arange(8.0) * 2)
    """
    if not isinstance(actual, Array):
        raise ArgumentError(f"assert_sharded_allclose: actual must be an spmd.Array (a placed "
                            f"array), got {type(actual).__name__}; compare plain arrays with "
                            "numpy.testing.assert_allclose")
    note = f" ({err_msg})" if err_msg else ""
    shape, dtype = tuple(actual.shape), np.dtype(actual.dtype)
    placed = isinstance(expected, Array)
    exp_shape = tuple(np.shape(expected))
    if exp_shape != shape:
        raise AssertionError(f"assert_sharded_allclose{note}: shapes differ: actual {shape}, "
                             f"expected {exp_shape}")
    exp_dtype = np.dtype(expected.dtype) if placed else np.asarray(expected).dtype
    if placed and exp_dtype != dtype:
        raise AssertionError(f"assert_sharded_allclose{note}: dtypes differ: actual {dtype}, "
                             f"expected {exp_dtype}")
    if placed:
        mine, theirs = _placement(actual.sharding, shape), _placement(expected.sharding, shape)
        if mine != theirs and check_sharding:
            dev = next(d for d in sorted(set(mine) | set(theirs))
                       if mine.get(d) != theirs.get(d))
            raise AssertionError(
                f"assert_sharded_allclose{note}: placements differ: actual "
                f"{actual.sharding}, expected {expected.sharding}; device {dev} holds "
                f"{mine.get(dev, 'nothing')} in actual and {theirs.get(dev, 'nothing')} in "
                "expected (pass check_sharding=False to compare values only)")
        if mine != theirs:
            # Values only: expected's blocks are moved to actual's placement (on a mesh of
            # several processes a collective of every rank, which this assertion is called
            # on), so that each rank compares its own blocks and none reads the whole value.
            expected = device_put(expected, actual.sharding)
    want_blocks = {s.device: s for s in expected.addressable_shards} if placed else None
    whole = None if placed else np.asarray(expected)
    for shard in actual.addressable_shards:
        got = np.asarray(shard.data)
        want = np.asarray(want_blocks[shard.device].data) if placed else whole[shard.index]
        bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        if not bad.any():
            continue
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        starts = [a for a, _ in _index_key(shard.index, shape)]
        at = tuple(s + i for s, i in zip(starts, first))
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) if \
            got.dtype.kind in "fiuc" and want.dtype.kind in "fiuc" else None
        worst = "" if diff is None else f"; max abs diff {float(np.nanmax(diff[bad])):.6g}"
        raise AssertionError(
            f"assert_sharded_allclose{note}: the block of device {shard.device.id}"
            f"{_coords(actual.sharding, shard.device)}, global index "
            f"{_where(shard.index, shape)}, differs in {int(bad.sum())} of {bad.size} "
            f"elements (rtol={rtol}, atol={atol}){worst}; first at global index {at}: "
            f"actual {got[first].item()!r}, expected {want[first].item()!r}")


@contextlib.contextmanager
def simulated_devices(n: int) -> Iterator[None]:
    """At least ``n`` simulated devices in this process inside the block, whatever
    ``SPMD_NUM_DEVICES`` it started with; the old configuration is put back after.

    Meshes and arrays made inside keep their devices; use them only inside.  Under MPI
    each rank's devices are the job's, so this raises there.

    >>> with simulated_devices(16):
    ...     mesh = spmd.make_mesh((4, 4), ("i", "j"))   # doctest: +SKIP
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ArgumentError(f"simulated_devices: n={n!r} must be a positive number of devices")
    if spmd.process_count() > 1:
        raise ArgumentError(
            f"simulated_devices({n}): this process is one of {spmd.process_count()} MPI ranks, "
            "whose devices the job fixes; launch more ranks or give each more devices "
            "(SPMD_LOCAL_DEVICES), or run the test in a single process")
    if spmd.device_count() >= n:
        yield
        return
    saved = runtime.overrides()
    spmd.distributed.initialize(backend="local", local_devices=int(n))
    try:
        yield
    finally:
        runtime.set_overrides(saved)
        reset_for_tests()


# A front end: fill the compiler's extension points (spmd/_install.py; spmd/__init__.py
# is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()
