"""spmd.random across MPI processes: a sharded random array equals the unsharded one
computed in one process, whatever the process count and mesh."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
from spmd import NamedSharding, P  # noqa: E402
from spmd import random as sr  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _global(x):
    return np.asarray(spmd.process_allgather(x, tiled=True)) if not x.is_fully_addressable \
        else np.asarray(x)


def _reference(f, k):
    # Computed on this process alone: the global array, no sharding.
    return np.asarray(f(k))


@pytest.mark.parametrize("spec", [P("data", None), P("data", "model"), P(None, ("data", "model"))])
def test_sharded_normal_equals_unsharded(spec):
    n = spmd.device_count()
    mesh = spmd.make_mesh((n // 2, 2), ("data", "model"))
    k = sr.key(2024)
    f = lambda k: sr.normal(k, (8, 16))  # noqa: E731
    g = spmd.jit(f, out_shardings=NamedSharding(mesh, spec))
    np.testing.assert_array_equal(_global(g(k)), _reference(f, k))


def test_fold_in_process_streams_differ_and_match():
    k = sr.fold_in(sr.key(1), spmd.process_index())
    mine = np.asarray(sr.uniform(k, (4,)))
    allv = np.asarray(spmd.process_allgather(mine))
    assert allv.shape == (spmd.process_count(), 4)
    for r in range(spmd.process_count()):
        np.testing.assert_array_equal(allv[r], np.asarray(sr.uniform(sr.fold_in(sr.key(1), r),
                                                                     (4,))))


def test_stateful_generator_under_jit_agrees_across_ranks():
    rng = sr.stateful_rng(77)
    f = spmd.jit(lambda x: x + rng.normal(size=3))
    for n in range(2):
        mine = np.asarray(f(np.zeros(3, np.float32)))
        allv = np.asarray(spmd.process_allgather(mine))
        want = np.asarray(sr.normal(sr.fold_in(sr.key(77), n), (3,)))
        for r in range(spmd.process_count()):
            np.testing.assert_allclose(allv[r], want, rtol=1e-6)
