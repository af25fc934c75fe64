"""``spmd.parallel.moe``: with a capacity that drops nothing, the expert-parallel layer
(experts split over the mesh axis, tokens sent by ``all_to_all``) equals the same
layer computed densely (numpy; and its gradients equal the dense layer's written with
``spmd.numpy``); with a small capacity the dropped (token, choice) pairs and the output
follow the capacity rule (numpy oracle), and the auxiliary loss is Switch's."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax, nn
from spmd.errors import ArgumentError, ShapeError
from spmd.parallel import moe, moe_capacity

E, T, D, H, K = 8, 32, 16, 24, 2


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(T, D)).astype(np.float32), rng.normal(size=(D, E)).astype(np.float32),
            (rng.normal(size=(E, D, H)) / 4).astype(np.float32),
            (rng.normal(size=(E, H, D)) / 4).astype(np.float32))


def _gelu(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


def _oracle(x, r, w1, w2, n, cf, k=K):
    """numpy: routing, the capacity rule per device (rank, then token order), the output,
    the dropped count and Switch's auxiliary loss."""
    t = T // n
    cap = moe_capacity(t, E, k, cf)
    y = np.zeros_like(x)
    dropped, routed, importance = 0, np.zeros(E), np.zeros(E)
    for dev in range(n):
        xs = x[dev * t:(dev + 1) * t]
        logits = xs @ r
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
        g = np.take_along_axis(p, idx, -1)
        g /= g.sum(-1, keepdims=True)
        count = np.zeros(E, int)
        for j in range(k):
            for i in range(t):
                e = idx[i, j]
                if count[e] < cap:
                    y[dev * t + i] += g[i, j] * (_gelu(xs[i] @ w1[e]) @ w2[e])
                else:
                    dropped += 1
                count[e] += 1
        routed += np.bincount(idx.ravel(), minlength=E) / t / n
        importance += p.mean(0) / n
    return y, dropped, E * np.sum(routed / k * importance)


def _layer(n, cf, k=K):
    mesh = spmd.make_mesh((n,), ("expert",))
    return spmd.shard_map(
        lambda x, r, a, b: moe(x, r, a, b, "expert", top_k=k, capacity_factor=cf), mesh=mesh,
        in_specs=(P("expert"), P(), P("expert"), P("expert")), out_specs=(P("expert"), P()))


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("cf", [float(E), 1.0, 0.5], ids=["no drops", "cf 1", "cf 0.5"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_equals_the_dense_layer_with_the_capacity_rule(n, cf, jit):
    x, r, w1, w2 = _data()
    f = _layer(n, cf)
    y, aux = (spmd.jit(f) if jit else f)(x, r, w1, w2)
    want, dropped, aux_loss = _oracle(x, r, w1, w2, n, cf)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
    assert int(aux["dropped"]) == dropped
    assert (dropped == 0) == (cf == float(E))
    np.testing.assert_allclose(float(aux["aux_loss"]), aux_loss, rtol=1e-5)


def _dense_snp(x, r, w1, w2, k=K):
    p = nn.softmax(x @ r, axis=-1)
    top_p, top_e = lax.top_k(p, k)
    gates = snp.sum(nn.one_hot(top_e, E) * (top_p / snp.sum(top_p, -1, keepdims=True))[..., None],
                    axis=1)                                        # (T, E)
    outs = snp.einsum("eth,ehd->etd", nn.gelu(snp.einsum("td,edh->eth", x, w1)), w2)
    return snp.einsum("te,etd->td", gates, outs)


def test_gradients_equal_the_dense_layers():
    x, r, w1, w2 = _data(1)
    wy = np.random.default_rng(5).normal(size=(T, D)).astype(np.float32)
    f = _layer(4, float(E))
    g_moe = spmd.jit(spmd.grad(lambda *a: snp.sum(f(*a)[0] * wy), argnums=(0, 1, 2, 3)))(
        x, r, w1, w2)
    g_dense = spmd.grad(lambda *a: snp.sum(_dense_snp(*a) * wy), argnums=(0, 1, 2, 3))(
        x, r, w1, w2)
    for a, b in zip(g_moe, g_dense):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_errors_name_the_argument():
    x, r, w1, w2 = _data()
    mesh = spmd.make_mesh((4,), ("expert",))

    def call(*args, **kw):
        return spmd.shard_map(lambda x, r, a, b: moe(x, r, a, b, "expert", **kw), mesh=mesh,
                              in_specs=(P("expert"), P(), P("expert"), P("expert")),
                              out_specs=(P("expert"), P()))(*args)

    with pytest.raises(ArgumentError, match=r"moe: top_k=9 must be an int in \[1, 8\]"):
        call(x, r, w1, w2, top_k=9)
    with pytest.raises(ArgumentError, match=r"moe: capacity_factor=0 must be > 0"):
        call(x, r, w1, w2, capacity_factor=0)
    with pytest.raises(ShapeError, match=r"do not agree: with 8 experts over 4 devices"):
        call(x, r, w1[:4], w2[:4])
    with pytest.raises(ShapeError, match=r"must be \(t, d\), \(d, E\)"):
        call(x.reshape(T, 2, D // 2), r, w1, w2)


def test_token_axes_make_the_loss_that_of_all_tokens():
    # Tokens split over ("data", "expert"): with token_axes naming both, the routing
    # statistics (so the auxiliary loss and the dropped count) are over all tokens.
    x, r, w1, w2 = _data()
    mesh = spmd.make_mesh((2, 4), ("data", "expert"))
    f = spmd.shard_map(
        lambda x, r, a, b: moe(x, r, a, b, "expert", capacity_factor=1.0,
                               token_axes=("data", "expert")),
        mesh=mesh, in_specs=(P(("data", "expert")), P(), P("expert"), P("expert")),
        out_specs=(P(("data", "expert")), P()))
    y, aux = f(x, r, w1, w2)
    want, dropped, aux_loss = _oracle(x, r, w1, w2, 8, 1.0)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
    assert int(aux["dropped"]) == dropped
    np.testing.assert_allclose(float(aux["aux_loss"]), aux_loss, rtol=1e-5)
