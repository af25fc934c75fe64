"""bench_engine's count of matrix-product work: dot_generals, shard_map bodies once per
device, and the attention kernel's products as ordinary operations would make them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import spmd
import spmd.numpy as snp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_engine  # noqa: E402


def test_attention_counts_the_products_of_ordinary_operations():
    B, T, N, H = 2, 8, 4, 16
    q, k, v, w = np.random.default_rng(0).standard_normal((4, B, T, N, H)).astype(np.float32)
    one = 2 * B * N * T * T * H  # one (T, H) x (H, S) product per batch element and head

    def loss(q, k, v, impl):
        return (spmd.nn.dot_product_attention(q, k, v, implementation=impl) * w).sum()

    for impl in (None, "xla"):
        fwd = bench_engine.matmul_flops(spmd.make_jaxpr(
            lambda q: loss(q, k, v, impl))(q))
        assert fwd == 2 * one
        both = bench_engine.matmul_flops(spmd.make_jaxpr(
            spmd.value_and_grad(lambda q, k, v: loss(q, k, v, impl), argnums=(0, 1, 2)))(q, k, v))
        assert both == 6 * one, impl  # forward 2, backward 4 (dv, dp, dq, dk)


def test_a_shard_map_body_counts_once_per_device():
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    x = np.ones((8, 6), np.float32)
    w = np.ones((6, 5), np.float32)
    f = spmd.shard_map(lambda x, w: snp.matmul(x, w), mesh=mesh,
                       in_specs=(spmd.P("a"), spmd.P()), out_specs=spmd.P("a"))
    assert bench_engine.matmul_flops(spmd.make_jaxpr(f)(x, w)) == 8 * 2 * 2 * 6 * 5
