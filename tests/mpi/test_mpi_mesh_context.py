"""The mesh context and shard_map's JAX calling conventions across processes:
``device_put(x, P(...))`` under ``use_mesh``, shard_map without ``mesh=`` and with
``in_specs`` inferred from the placed Array, and ``None`` entries passing static
arguments through (under ``jit(static_argnums)``)."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding, P, lax  # noqa: E402
from spmd.sharding import use_mesh  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_mesh_context_across_processes():
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    x = np.arange(n * 6, dtype=np.float32).reshape(n * 2, 3)
    with use_mesh(mesh):
        xd = spmd.device_put(x, P("i"))
        assert xd.sharding == NamedSharding(mesh, P("i"))
        total = spmd.shard_map(lambda b: lax.psum(snp.sum(b, 0), "i"), out_specs=P())(xd)

        @functools.partial(spmd.jit, static_argnums=(1,))
        def scaled(a, k):
            return spmd.shard_map(lambda b, k: b * k[0] + k[1], in_specs=(P("i"), None),
                                  out_specs=P("i"))(a, k)

        y = scaled(xd, (2, 1))
    np.testing.assert_allclose(np.asarray(total), x.sum(0))
    np.testing.assert_allclose(spmd.process_allgather(y), 2 * x + 1)


def test_partial_manual_shard_map_across_processes():
    n = spmd.device_count()
    mesh = spmd.make_mesh((2, n // 2), ("a", "b"))
    x = np.arange(n * 6, dtype=np.float32).reshape(n * 2, 3)
    f = spmd.shard_map(lambda blk: lax.psum(snp.sum(blk * blk, 0), "a"), mesh=mesh,
                       in_specs=P("a"), out_specs=P(), axis_names={"a"})
    np.testing.assert_allclose(spmd.process_allgather(f(x)), (x * x).sum(0))
    g = spmd.jit(spmd.grad(lambda x: snp.sum(f(x))))(x)
    np.testing.assert_allclose(spmd.process_allgather(g), 2 * x)
