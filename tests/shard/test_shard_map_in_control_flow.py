"""A ``shard_map`` inside ``lax.scan``/``fori_loop``/``while_loop``/``cond``,
``checkpoint`` and ``custom_vjp``, and ``jit`` closing over a sharded Array, on the
simulated devices of one process (the multi-process versions are in
``tests/mpi/test_mpi_nested_shard_map.py``).  Values and gradients against numpy on
the global arrays; the printed programs."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding as NS, P, lax
from tests.shard.megatron_stack import (B, D, H, L, data as megatron_data,
                                         layer as _layer, np_layer as _np_layer,
                                         np_layer_vjp as _np_layer_vjp,
                                         np_stack as _np_stack, put,
                                         custom_vjp_layer)

X, W1, W2 = megatron_data(5)
KINDS = ["1d", "2d"]


def _mesh(kind):
    """``(mesh, data axis, model axis)`` (see the multi-process module)."""
    if kind == "1d":
        return spmd.make_mesh((4,), ("i",)), None, "i"
    return spmd.make_mesh((2, 2), ("a", "b")), "a", "b"


def _put(mesh, data, model):
    """X, W1, W2 placed on ``mesh`` (stacked weights: layer dimension whole)."""
    return put(mesh, data, model, X, W1, W2)


def _close(got, want, tol=2e-5):
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


def _wrap(jit):
    return spmd.jit if jit else (lambda f: f)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("placed", [True, False], ids=["sharded", "numpy"])
def test_scan_over_layers_with_a_shard_map_body(kind, jit, placed):
    mesh, data, model = _mesh(kind)
    layer = _layer(mesh, data, model)

    def forward(x, w1s, w2s):
        return lax.scan(lambda c, w: (layer(c, *w), None), x, (w1s, w2s))[0]

    args = _put(mesh, data, model) if placed else (X, W1, W2)
    out, gx, g1, g2 = _np_stack(X, W1, W2)
    y = _wrap(jit)(forward)(*args)
    _close(y, out)
    if placed and jit:  # placed by the partitioner (eager control flow and numpy
        # values in one process come back unplaced: see docs/jax_differences.md)
        assert y.sharding == NS(mesh, P(data))
    grads = _wrap(jit)(spmd.grad(lambda *a: 0.5 * snp.sum(forward(*a) ** 2),
                                 argnums=(0, 1, 2)))(*args)
    for got, want in zip(grads, (gx, g1, g2)):
        _close(got, want)


def test_the_scan_body_runs_on_blocks_in_the_printed_program():
    mesh, data, model = _mesh("2d")
    layer = _layer(mesh, data, model)
    f = spmd.jit(lambda x, w1s, w2s: lax.scan(lambda c, w: (layer(c, *w), None), x,
                                              (w1s, w2s))[0])
    text = f.lower(X, W1, W2).as_text()
    assert "scan[" in text and "shard_map[" in text, text
    # the shard_map body inside the scan body: one device's blocks
    assert f"f32[{B // 2},{H // 2}]{{a,b}} = dot_general" in text, text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_checkpointed_layer_and_its_gradient(kind, jit):
    mesh, data, model = _mesh(kind)
    layer = spmd.checkpoint(_layer(mesh, data, model))

    def loss(x, w1s, w2s):
        for k in range(L):
            x = layer(x, w1s[k], w2s[k])
        return 0.5 * snp.sum(x ** 2)

    x, w1s, w2s = _put(mesh, data, model)
    out, gx, g1, g2 = _np_stack(X, W1, W2)
    _close(_wrap(jit)(layer)(X, W1[0], W2[0]), _np_layer(X, W1[0], W2[0]))
    value, grads = _wrap(jit)(spmd.value_and_grad(loss, argnums=(0, 1, 2)))(x, w1s, w2s)
    _close(value, 0.5 * np.sum(out ** 2), 1e-5)
    for got, want in zip(grads, (gx, g1, g2)):
        _close(got, want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_cond_fori_and_while_holding_a_shard_map(kind, jit):
    mesh, data, model = _mesh(kind)
    layer = _layer(mesh, data, model)
    w1, w2 = W1[1], W2[1]

    def branchy(p, x, w1):
        return lax.cond(p > 0, lambda v: layer(v, w1, w2), lambda v: v * 2.0, x)

    def looped(x, w1):
        return lax.fori_loop(0, L, lambda i, c: layer(c, w1, w2), x)

    def until(x):
        return lax.while_loop(lambda c: c[0] < L, lambda c: (c[0] + 1, layer(c[1], w1, w2)),
                              (0, x))[1]

    want = X
    for _ in range(L):
        want = _np_layer(want, w1, w2)
    _close(_wrap(jit)(branchy)(1.0, X, w1), _np_layer(X, w1, w2))
    _close(_wrap(jit)(branchy)(-1.0, X, w1), X * 2)
    _close(_wrap(jit)(looped)(X, w1), want)
    _close(_wrap(jit)(until)(X), want)
    g1 = _np_stack(X, np.stack([w1] * L), np.stack([w2] * L))[2]
    _close(_wrap(jit)(spmd.grad(lambda w: 0.5 * snp.sum(looped(X, w) ** 2)))(w1), g1.sum(0))
    gc = _wrap(jit)(spmd.grad(lambda w: snp.sum(branchy(1.0, X, w))))(w1)
    _close(gc, _np_layer_vjp(X, w1, w2, np.ones((B, D), np.float32))[1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_custom_vjp_around_a_shard_map(kind, jit):
    mesh, data, model = _mesh(kind)
    kernel = custom_vjp_layer(mesh, data, model)
    _close(_wrap(jit)(kernel)(X, W1[0], W2[0]), _np_layer(X, W1[0], W2[0]))
    grads = _wrap(jit)(spmd.grad(lambda *a: snp.sum(kernel(*a)), argnums=(0, 1, 2)))(
        X, W1[0], W2[0])
    for got, want in zip(grads, _np_layer_vjp(X, W1[0], W2[0], np.ones((B, D), np.float32))):
        _close(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_jit_closing_over_a_sharded_array_and_its_gradient(kind):
    mesh, data, model = _mesh(kind)
    x, w1s, w2s = _put(mesh, data, model)
    layer = _layer(mesh, data, model)

    def loss(w2):  # closes over x and w1s
        return 0.5 * snp.sum(layer(x, w1s[0], w2) ** 2)

    y = _np_layer(X, W1[0], W2[0])
    _close(spmd.jit(loss)(W2[0]), 0.5 * np.sum(y ** 2), 1e-5)
    _close(spmd.jit(spmd.grad(loss))(W2[0]), _np_layer_vjp(X, W1[0], W2[0], y)[2])
    g = spmd.jit(lambda w2: layer(x, w1s[0], w2), in_shardings=NS(mesh, P(model)),
                 out_shardings=NS(mesh, P(data)))
    out = g(W2[0])
    assert out.sharding == NS(mesh, P(data))
    _close(out, y)
