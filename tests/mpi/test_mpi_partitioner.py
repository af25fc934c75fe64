"""The partitioner across processes: ``jit`` with shardings on a mesh of MPI ranks.

The per-device program the partitioner writes is a ``shard_map`` body, so it
runs on the mpi backend unchanged; results are compared with numpy on the
global arrays (read back with ``spmd.process_allgather``).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding, P  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _mesh():
    n = spmd.device_count()
    return spmd.make_mesh((n // 2, 2), ("data", "model"))


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _global(x):
    return np.asarray(spmd.process_allgather(x, tiled=True)) if not x.is_fully_addressable \
        else np.asarray(x)


@pytest.mark.parametrize("out_spec", [P("data", None), P("data", "model")])
def test_megatron_mlp(out_spec):
    mesh = _mesh()
    S = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    x, w1, w2 = _rand((8, 6), 0), _rand((6, 4), 1), _rand((4, 6), 2)
    f = spmd.jit(lambda x, w1, w2: snp.maximum(x @ w1, 0) @ w2,
                 in_shardings=(S("data", None), S(None, "model"), S("model", None)),
                 out_shardings=NamedSharding(mesh, out_spec))
    got = _global(f(x, w1, w2))
    np.testing.assert_allclose(got, np.maximum(x @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
    names = [c for c, _, _ in f.lower(x, w1, w2).collectives()]
    assert names == (["psum"] if out_spec == P("data", None) else ["psum_scatter"])


def test_data_parallel_gradient_step():
    mesh = _mesh()
    S = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    w, x = _rand((6, 3), 3), _rand((8, 6), 4)

    def loss(w, x):
        return snp.mean(snp.tanh(x @ w) ** 2)

    step = spmd.jit(lambda w, x: w - 0.1 * spmd.grad(loss)(w, x),
                    in_shardings=(S(), S("data", None)), out_shardings=S())
    got = _global(step(w, x))
    t = np.tanh(x @ w)
    want = w - 0.1 * (x.T @ (2 * t * (1 - t * t))) / t.size
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert [c for c, _, _ in step.lower(w, x).collectives()] == ["psum"]
