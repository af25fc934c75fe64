"""``spmd.parallel`` across processes.  ``ring_attention``: the sequence split over
every rank's device, the key/value blocks passed around the ring of ranks.  ``moe``:
the experts split over the ranks, tokens sent to them by ``all_to_all``.  Values and
gradients against numpy on the global arrays (read back with
``spmd.process_allgather``), each rank holding only its block."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding as NS, P  # noqa: E402
from spmd.parallel import moe, ring_attention, zigzag_order, zigzag_restore  # noqa: E402
from tests.parallel.test_moe import D, E, T, _data, _oracle  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _full_np(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((s.shape[-1],) * 2, bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_values_and_gradients_over_the_ranks(layout):
    n = spmd.device_count()
    S = 4 * n
    mesh = spmd.make_mesh((n,), ("seq",))
    rng = np.random.default_rng(0)
    q, k, v, w = (rng.normal(size=(2, S, 4)).astype(np.float32) for _ in range(4))
    zigzag = layout == "zigzag"
    order = zigzag_order(S, n) if zigzag else np.arange(S)
    back = zigzag_restore(S, n) if zigzag else np.arange(S)
    spec = NS(mesh, P(None, "seq"))
    f = spmd.shard_map(lambda q, k, v: ring_attention(q, k, v, "seq", layout=layout),
                       mesh=mesh, in_specs=P(None, "seq"), out_specs=P(None, "seq"))
    args = [spmd.device_put(a[:, order], spec) for a in (q, k, v)]
    out = spmd.jit(f)(*args)
    assert {s.data.shape for s in out.addressable_shards} == {(2, 4, 4)}
    got = np.asarray(spmd.process_allgather(out))[:, back]
    np.testing.assert_allclose(got, _full_np(q, k, v), rtol=2e-5, atol=2e-6)

    wp = spmd.device_put(w[:, order], spec)
    grads = spmd.jit(spmd.grad(lambda q, k, v: snp.sum(f(q, k, v) * wp), argnums=(0, 1, 2)))(
        *args)
    # The oracle: the one-device gradient of full attention written with spmd.numpy.
    def full(q, k, v):
        s = snp.einsum("bqd,bkd->bqk", q, k) / 2.0
        s = snp.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
        return spmd.nn.softmax(s, axis=-1) @ v

    want = spmd.grad(lambda q, k, v: snp.sum(full(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)
    for g, wg in zip(grads, want):
        np.testing.assert_allclose(np.asarray(spmd.process_allgather(g))[:, back],
                                   np.asarray(wg), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cf", [float(E), 0.5], ids=["no drops", "cf 0.5"])
def test_moe_over_the_ranks(cf):
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("expert",))
    x, r, w1, w2 = _data()
    layer = spmd.jit(spmd.shard_map(
        lambda x, r, a, b: moe(x, r, a, b, "expert", capacity_factor=cf), mesh=mesh,
        in_specs=(P("expert"), P(), P("expert"), P("expert")), out_specs=(P("expert"), P())))
    split = NS(mesh, P("expert"))
    y, aux = layer(spmd.device_put(x, split), r, spmd.device_put(w1, split),
                   spmd.device_put(w2, split))
    assert {s.data.shape for s in y.addressable_shards} == {(T // n, D)}
    want, dropped, aux_loss = _oracle(x, r, w1, w2, n, cf)
    np.testing.assert_allclose(np.asarray(spmd.process_allgather(y)), want, rtol=1e-5,
                               atol=1e-5)
    assert int(np.asarray(aux["dropped"])) == dropped
    np.testing.assert_allclose(float(np.asarray(aux["aux_loss"])), aux_loss, rtol=1e-5)


def test_pipeline_over_the_ranks():
    from tests.parallel.test_pipeline import _layer, _params, _sequential

    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("pipe",))
    p = _params(n)
    xs = np.random.default_rng(1).normal(size=(5, 4, 8)).astype(np.float32)
    from spmd.parallel import pipeline

    run = spmd.jit(spmd.shard_map(lambda p, xs: pipeline(_layer, p, xs, "pipe"), mesh=mesh,
                                  in_specs=((P("pipe"), P("pipe")), P()), out_specs=P()))
    split = NS(mesh, P("pipe"))
    placed = tuple(spmd.device_put(a, split) for a in p)
    np.testing.assert_allclose(np.asarray(run(placed, xs)), np.asarray(_sequential(p, xs)),
                               rtol=1e-6, atol=1e-6)
    g = spmd.jit(spmd.grad(lambda p, xs: snp.sum(run(p, xs) ** 2)))(placed, xs)
    want = spmd.grad(lambda p, xs: snp.sum(_sequential(p, xs) ** 2))(p, xs)
    for a, b in zip(g, want):
        assert {s.data.shape[0] for s in a.addressable_shards} == {1}  # its stage only
        np.testing.assert_allclose(np.asarray(spmd.process_allgather(a)), np.asarray(b),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_schedules_over_the_ranks(schedule):
    # One stage per rank: each tick a rank computes only its own operation (the others'
    # branches are not taken there); the loss and every gradient as the unpipelined model's.
    from tests.parallel.test_pipeline_schedules import _data, _model, _step, _unpipelined

    stages = spmd.device_count()
    p, h, emb = _model(stages)
    xs, ys = _data(stages, 5)
    want_loss, want = spmd.value_and_grad(_unpipelined, argnums=(0, 1, 2))(p, h, emb, xs, ys)
    mesh = spmd.make_mesh((stages,), ("pipe",))
    pipe = NS(mesh, P("pipe"))
    f = spmd.jit(spmd.shard_map(_step(schedule), mesh=mesh,
                                in_specs=((P("pipe"), P("pipe")), P(), P(), P(), P()),
                                out_specs=(P(), (P("pipe"), P("pipe")), P(), P())))
    placed = tuple(spmd.device_put(a, pipe) for a in p)
    loss, gs, gh, ge = f(placed, h, emb, xs, ys)
    assert {s.data.shape for s in gs[0].addressable_shards} == {(1, 8, 8)}
    np.testing.assert_allclose(float(np.asarray(loss)), float(want_loss), rtol=1e-6)
    for got, exp in zip([*gs, gh, ge], [*want[0], want[1], want[2]]):
        np.testing.assert_allclose(np.asarray(spmd.process_allgather(got)), np.asarray(exp),
                                   rtol=2e-5, atol=1e-6)


def test_a_cond_whose_branches_hold_a_collective_runs_both_on_every_rank():
    # One device per rank: a cond whose index differs between ranks runs only the taken
    # branch when its branches hold no collective (an idle pipeline stage idles), but
    # with a psum in one branch every rank must run it (or rank 0 would wait forever).
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))

    def body(x):
        i = spmd.lax.axis_index("i")
        return spmd.lax.cond(i == 0, lambda v: spmd.lax.psum(v, "i"), lambda v: v * 3.0, x)

    f = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = np.arange(1.0, n + 1, dtype=np.float32)
    got = np.asarray(spmd.process_allgather(f(spmd.device_put(x, NS(mesh, P("i"))))))
    np.testing.assert_allclose(got, np.concatenate([[x.sum()], 3 * x[1:]]))


def test_dot_product_attention_with_batch_and_heads_split_over_the_ranks():
    """``spmd.nn.dot_product_attention`` (the blocked kernel) under the partitioner with
    the batch split over the ranks' devices and the heads over 2 of them when there are
    4: values and gradients equal the kernel on the whole arrays, each rank holding
    only its blocks."""
    n = spmd.device_count()
    shape = (n // 2, 2) if n % 2 == 0 and n >= 4 else (n, 1)
    mesh = spmd.make_mesh(shape, ("data", "model"))
    rng = np.random.default_rng(1)
    B, T, N, K, H = 2 * shape[0], 8, 4, 2, 8
    q, w = (rng.normal(size=(B, T, N, H)).astype(np.float32) for _ in range(2))
    k, v = (rng.normal(size=(B, T, K, H)).astype(np.float32) for _ in range(2))
    spec = NS(mesh, P("data", None, "model", None))
    placed = [spmd.device_put(a, spec) for a in (q, k, v, w)]

    def loss(q, k, v, w):
        return snp.sum(spmd.nn.dot_product_attention(q, k, v, is_causal=True) * w)

    step = spmd.jit(spmd.value_and_grad(loss, argnums=(0, 1, 2)))
    value, grads = step(*placed)
    want_value, want = spmd.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v, w)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
    for g, x in zip(grads, want):
        assert g.sharding.spec[:3] == ("data", None, "model")
        assert all(s.data.shape[0] == B // shape[0] for s in g.addressable_shards)
        np.testing.assert_allclose(np.asarray(spmd.process_allgather(g)), np.asarray(x),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_weight_gradients_accumulate_over_the_ranks(schedule):
    # Stage weights of 128 x 128 (at least the accumulated sums' minimum size): each
    # backward adds its products into the running sum by BLAS (compiler/passes/accumulate.py),
    # and the loss and gradients are still the unpipelined model's.
    from spmd.compiler.passes.accumulate import MIN_ELEMENTS
    from spmd.compiler.core.jit import _executables
    from spmd.parallel import PipelineGrads, pipeline_value_and_grad

    stages, width, m = spmd.device_count(), 128, 4
    assert width * width >= MIN_ELEMENTS
    rng = np.random.default_rng(3)
    w = (rng.normal(size=(stages, width, width)) / np.sqrt(width)).astype(np.float32)
    xs, ys = (rng.normal(size=(m, 16, width)).astype(np.float32) for _ in range(2))

    def layer(p, x):
        return snp.tanh(x @ p[0])

    def mse(y, t):
        return ((y - t) ** 2).mean()

    def unpipelined(w, xs, ys):
        total = 0.0
        for i in range(m):
            x = xs[i]
            for s in range(stages):
                x = snp.tanh(x @ w[s])
            total = total + mse(x, ys[i])
        return total / m

    want_loss, want = spmd.value_and_grad(unpipelined)(w, xs, ys)
    mesh = spmd.make_mesh((stages,), ("pipe",))
    f = spmd.jit(spmd.shard_map(
        lambda p, xs, ys: pipeline_value_and_grad(layer, mse, p, xs, ys, "pipe",
                                                  schedule=schedule),
        mesh=mesh, in_specs=(P("pipe"), P(), P()),
        out_specs=(P(), PipelineGrads(P("pipe"), P(), P()))))
    loss, g = f(spmd.device_put(w, NS(mesh, P("pipe"))), xs, ys)
    assert any("_gemm_into(" in e.source for per in list(_executables.values())
               for e in per.values())
    np.testing.assert_allclose(float(np.asarray(loss)), float(want_loss), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(spmd.process_allgather(g.stage)), np.asarray(want),
                               rtol=1e-4, atol=1e-6)
