"""``spmd.parallel.ring_attention``: attention with the sequence split over a mesh
axis equals full attention (numpy) within float32 rounding, causal or not, in the
contiguous and the load-balanced zigzag layouts, eagerly and under ``jit``; its
gradients equal those of full attention written with ``spmd.numpy`` on one device,
and pass ``check_grads``; no device holds scores for more than its block of the
sequence (the per-device program's shapes)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.errors import ArgumentError, ShapeError
from spmd.parallel import ring_attention, zigzag_order, zigzag_restore
from spmd.test_util import check_grads

B, H, S, D = 2, 3, 32, 8


def _full_np(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones((s.shape[-1],) * 2, bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _full_snp(q, k, v, causal):
    s = snp.einsum("...qd,...kd->...qk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = snp.where(np.tril(np.ones((s.shape[-1],) * 2, bool)), s, -np.inf)
    return spmd.nn.softmax(s, axis=-1) @ v


def _qkv(seed=0, shape=(B, H, S, D)):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(np.float32) for _ in range(3)]


def _ring(n, causal, layout):
    """Full-sequence arrays in, full-sequence arrays out (in order), the ring inside."""
    mesh = spmd.make_mesh((n,), ("seq",))
    f = spmd.shard_map(lambda q, k, v: ring_attention(q, k, v, "seq", causal=causal,
                                                      layout=layout),
                       mesh=mesh, in_specs=P(None, None, "seq"), out_specs=P(None, None, "seq"))
    if layout == "contiguous":
        return f
    order, back = zigzag_order(S, n), zigzag_restore(S, n)
    return lambda q, k, v: f(q[:, :, order], k[:, :, order], v[:, :, order])[:, :, back]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_equals_full_attention(n, causal, layout, jit):
    q, k, v = _qkv()
    f = _ring(n, causal, layout)
    got = np.asarray((spmd.jit(f) if jit else f)(q, k, v))
    np.testing.assert_allclose(got, _full_np(q, k, v, causal), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_gradients_equal_full_attentions(layout):
    q, k, v = _qkv(1)
    w = np.random.default_rng(2).normal(size=(B, H, S, D)).astype(np.float32)
    ring = _ring(4, True, layout)
    g_ring = spmd.jit(spmd.grad(lambda q, k, v: snp.sum(ring(q, k, v) * w),
                                argnums=(0, 1, 2)))(q, k, v)
    g_full = spmd.grad(lambda q, k, v: snp.sum(_full_snp(q, k, v, True) * w),
                       argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ring, g_full):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_check_grads():
    q, k, v = _qkv(3, (1, 1, 8, 4))
    mesh = spmd.make_mesh((4,), ("seq",))
    f = spmd.shard_map(lambda q, k, v: ring_attention(q, k, v, "seq", layout="zigzag"),
                       mesh=mesh, in_specs=P(None, None, "seq"), out_specs=P(None, None, "seq"))
    check_grads(f, [x.astype(np.float64) for x in (q, k, v)], order=1, modes=("rev",))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_no_device_holds_more_than_its_block_of_scores(n):
    s = S // n
    f = spmd.jit(_ring(n, True, "contiguous"))
    text = f.lower(*_qkv()).as_text()
    assert f"f32[{B},{H},{s},{s}]" in text  # one block pair's scores
    # No scores against the whole sequence of keys (the inputs are (B, H, S, D), D < S).
    assert not re.search(rf"\[{B},{H},\d+,{S}\]", text), text


def test_zigzag_orders():
    np.testing.assert_array_equal(zigzag_order(8, 2), [0, 1, 6, 7, 2, 3, 4, 5])
    x = np.arange(24)
    np.testing.assert_array_equal(x[zigzag_order(24, 3)][zigzag_restore(24, 3)], x)


def test_errors_name_the_argument():
    q, k, v = _qkv(0, (1, 1, 12, 4))
    mesh = spmd.make_mesh((4,), ("seq",))

    def call(**kw):
        qq, kk, vv = kw.pop("qkv", (q, k, v))
        return spmd.shard_map(lambda q, k, v: ring_attention(q, k, v, "seq", **kw), mesh=mesh,
                              in_specs=P(None, None, "seq"),
                              out_specs=P(None, None, "seq"))(qq, kk, vv)

    with pytest.raises(ArgumentError, match=r"layout='ring'; give 'contiguous' or 'zigzag'"):
        call(layout="ring")
    with pytest.raises(ShapeError, match=r"layout='zigzag' needs an even sequence block"):
        call(layout="zigzag")  # 12 / 4 = 3 rows per device
    with pytest.raises(ShapeError, match=r"must be \(\.\.\., s, d\)"):
        call(qkv=(q, k[..., :2], v))
    with pytest.raises(ShapeError, match=r"does not split into 8 chunks"):
        zigzag_order(12, 4)
