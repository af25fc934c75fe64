"""A stack of Megatron MLP layers written with ``shard_map``, and its numpy oracle.

Shared by the tests of ``shard_map`` inside control flow, checkpoints and custom
derivatives on simulated devices (``tests/shard/test_shard_map_in_control_flow.py``)
and across MPI processes (``tests/mpi/test_mpi_nested_shard_map.py``): the same
layer, data and oracle in both, so the two suites check one program.
"""

from __future__ import annotations

import numpy as np

import spmd
import spmd.numpy as snp
from spmd import NamedSharding as NS, P, lax

B, D, H, L = 8, 4, 8, 3  # batch, model width, hidden width, layers


def data(seed: int):
    """``(X, W1, W2)``: inputs ``[B, D]`` and stacked weights ``[L, D, H]``, ``[L, H, D]``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, D)).astype(np.float32)
    w1 = (rng.standard_normal((L, D, H)) / 2).astype(np.float32)
    w2 = (rng.standard_normal((L, H, D)) / 2).astype(np.float32)
    return x, w1, w2


def layer(mesh, data_axis, model):
    """A Megatron MLP layer: columns of ``w1`` and rows of ``w2`` split over ``model``;
    each device's partial product summed with one ``psum``."""
    def body(x, w1, w2):
        return lax.psum(snp.tanh(x @ w1) @ w2, model)

    return spmd.shard_map(body, mesh=mesh, in_specs=(P(data_axis), P(None, model), P(model)),
                          out_specs=P(data_axis))


def np_layer(x, w1, w2):
    return np.tanh(x @ w1) @ w2


def np_layer_vjp(x, w1, w2, g):
    """(dx, dw1, dw2) of :func:`np_layer` for the cotangent ``g``."""
    a = np.tanh(x @ w1)
    gh = (g @ w2.T) * (1 - a * a)
    return gh @ w1.T, x.T @ gh, a.T @ g


def np_stack(x, w1s, w2s):
    """Forward through the stacked layers and the gradients of ``0.5 * sum(out**2)``."""
    xs = [x]
    for w1, w2 in zip(w1s, w2s):
        xs.append(np_layer(xs[-1], w1, w2))
    g, g1, g2 = xs[-1], np.zeros_like(w1s), np.zeros_like(w2s)
    for k in reversed(range(len(w1s))):
        g, g1[k], g2[k] = np_layer_vjp(xs[k], w1s[k], w2s[k], g)
    return xs[-1], g, g1, g2


def put(mesh, data_axis, model, x, w1, w2):
    """``x``, ``w1``, ``w2`` placed on ``mesh`` (stacked weights: layer dimension whole)."""
    return (spmd.device_put(x, NS(mesh, P(data_axis))),
            spmd.device_put(w1, NS(mesh, P(None, None, model))),
            spmd.device_put(w2, NS(mesh, P(None, model))))


def custom_vjp_layer(mesh, data_axis, model):
    """:func:`layer` as a ``custom_vjp`` whose backward pass is a second shard_map: it
    sums the input gradient over ``model`` and the weight gradients over ``data_axis``."""
    fwd_layer = layer(mesh, data_axis, model)

    def bwd_body(x, w1, w2, g):
        a = snp.tanh(x @ w1)
        gh = (g @ w2.T) * (1 - a * a)
        g1, g2 = x.T @ gh, a.T @ g
        if data_axis is not None:
            g1, g2 = lax.psum(g1, data_axis), lax.psum(g2, data_axis)
        return lax.psum(gh @ w1.T, model), g1, g2

    bwd_layer = spmd.shard_map(bwd_body, mesh=mesh,
                               in_specs=(P(data_axis), P(None, model), P(model), P(data_axis)),
                               out_specs=(P(data_axis), P(None, model), P(model)))

    @spmd.custom_vjp
    def kernel(x, w1, w2):
        return fwd_layer(x, w1, w2)

    kernel.defvjp(lambda x, w1, w2: (fwd_layer(x, w1, w2), (x, w1, w2)),
                  lambda res, g: bwd_layer(*res, g))
    return kernel
