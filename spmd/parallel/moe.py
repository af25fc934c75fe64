"""Expert parallelism: a top-k routed mixture-of-experts MLP whose experts are split
over a mesh axis, tokens dispatched to them and combined back with ``all_to_all``.

Inside a ``shard_map`` over the expert axis (``n`` devices), each device holds its
tokens ``x`` ``(t, d)`` and ``E / n`` experts' weights.  Per device:

1. the router scores every token against all ``E`` experts, keeps each token's top
   ``k`` and renormalises their probabilities into gates;
2. each expert takes at most ``C = ceil(capacity_factor * t * k / E)`` of this device's
   (token, choice) pairs, in order of choice rank, then token: a pair past the capacity
   is dropped (counted; its gate contributes nothing);
3. the kept pairs are scattered by index into an ``(E, C, d)`` buffer (a row per
   expert and slot; no one-hot dispatch tensor, whose ``t * k * E * C`` entries grow
   with the square of the tokens), which ``all_to_all`` sends so
   that each device receives ``(n, E / n, C, d)``: every source's tokens for its own
   experts; they run the expert MLP and ``all_to_all`` sends the results back;
4. each token's output is the gate-weighted sum of its kept experts' results, read
   back from the returned buffer by the same indices.

With a capacity that drops nothing the layer equals the same layer computed densely
on one device.  The auxiliary load-balancing loss is Switch Transformer's: ``E`` times
the sum over experts of the fraction of (token, choice) pairs routed to the expert and
the mean router probability of the expert, both over all devices' tokens.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

import spmd.numpy as snp
from spmd import nn
from spmd.collectives.api import all_gather, all_to_all, axis_index, pmean, psum
from spmd.collectives.primitives import _axes, _size
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.lax import dynamic_slice_in_dim, top_k as lax_top_k

__all__ = ["moe", "moe_capacity"]


def moe_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert for one device's ``tokens``: ``ceil(capacity_factor * tokens *
    top_k / experts)`` (at least 1)."""
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def moe(x, router, w_in, w_out, axis_name, *, top_k: int = 2, capacity_factor: float = 1.25,
        activation: Callable = nn.gelu, token_axes=None, replicated_axes=None):
    """The mixture-of-experts MLP on this device's tokens, inside a ``shard_map`` over
    ``axis_name`` (the expert axis).

    ``x``: ``(t, d)`` tokens; ``router``: ``(d, E)`` (the same on every device);
    ``w_in``: ``(E / n, d, h)`` and ``w_out``: ``(E / n, h, d)``, this device's experts.
    Returns ``(y, aux)``: ``y`` ``(t, d)``, and a dict of the load-balancing loss
    ``"aux_loss"`` and ``"dropped"``, the number of (token, choice) pairs dropped over
    all devices (both the same on every device).  ``token_axes`` (default:
    ``axis_name``) are all the mesh axes the tokens are split over (the expert axis and,
    say, a data axis): the loss's routing statistics are averaged over them, so it is
    the loss of all the tokens, whatever the split.

    ``replicated_axes``: mesh axes along which ``x`` is the same on every device (a
    tensor-parallel group's, say): the experts are split over them too (``w_in`` and
    ``w_out`` hold ``E / (n r)`` experts, ``r`` devices along them), each device takes
    its ``1 / r`` share of the tokens to the experts (not every device all of them,
    which would compute each token ``r`` times), and the shares' outputs are gathered
    back: ``y`` is again the same along them.

    >>> layer = shard_map(lambda x, r, a, b: moe(x, r, a, b, "expert"), mesh=mesh,
    ...                   in_specs=(P("expert"), P(), P("expert"), P("expert")),
    ...                   out_specs=(P("expert"), P()))  # doctest: +SKIP
    """
    axes = _axes(axis_name, "moe")
    stat_axes = axes if token_axes is None else _axes(token_axes, "moe")
    if replicated_axes is not None:
        return _moe_of_shares(x, router, w_in, w_out, axes, stat_axes,
                              _axes(replicated_axes, "moe"), top_k=top_k,
                              capacity_factor=capacity_factor, activation=activation)
    n = _size(axes)
    t, d, experts, local = _sizes(x, router, w_in, w_out, n, top_k, capacity_factor)
    cap = moe_capacity(t, experts, top_k, capacity_factor)
    dtype = get_aval(x).dtype

    probs = nn.softmax(x @ router, axis=-1)                      # (t, E)
    top_p, top_e = lax_top_k(probs, top_k)                       # (t, k)
    gates = top_p / snp.sum(top_p, axis=-1, keepdims=True)
    # Slot of each (token, choice) in its expert's buffer: choices of rank 0 first (all
    # tokens in order), then rank 1, ...: a running count per expert.
    chosen = nn.one_hot(snp.transpose(top_e), experts, dtype=np.int32)  # (k, t, E)
    flat = snp.reshape(chosen, (top_k * t, experts))
    slot = snp.reshape(snp.cumsum(flat, axis=0) - flat, (top_k, t, experts))
    slot = snp.transpose(snp.sum(slot * chosen, axis=-1))        # (t, k)
    kept = slot < cap
    # Each kept (token, choice) pair has its own row, expert * C + slot, of the experts'
    # buffers; a dropped pair goes to a spare row past them.  Tokens are scattered to
    # their rows and read back from them by index: O(t k d) work and memory, where a
    # one-hot dispatch tensor (t, k, E, C) grows with the square of the tokens.
    row = snp.reshape(snp.where(kept, top_e * cap + slot, experts * cap), (t * top_k,))
    pairs = snp.reshape(snp.broadcast_to(x[:, None, :], (t, top_k, d)), (t * top_k, d))
    buffers = snp.zeros((experts * cap + 1, d), dtype).at[row].add(pairs)
    buffers = snp.reshape(buffers[:experts * cap], (experts, cap, d))     # (E, C, d)
    # To the experts' devices: (n, E/n, C, d) split by destination, received by source.
    sent = all_to_all(snp.reshape(buffers, (n, local, cap, d)), axes, 0, 0, tiled=True)
    h = activation(snp.einsum("secd,edh->sech", sent, w_in))
    done = snp.einsum("sech,ehd->secd", h, w_out)
    back = snp.reshape(all_to_all(done, axes, 0, 0, tiled=True), (experts * cap, d))
    back = snp.concatenate([back, snp.zeros((1, d), dtype)])   # the spare row: nothing
    y = snp.sum(snp.reshape(back[row], (t, top_k, d)) * gates[..., None], axis=1)

    routed = snp.mean(snp.sum(nn.one_hot(top_e, experts, dtype=dtype), axis=1), axis=0)
    fraction = pmean(routed, stat_axes) / top_k                  # share of pairs per expert
    importance = pmean(snp.mean(probs, axis=0), stat_axes)
    aux = {"aux_loss": experts * snp.sum(fraction * importance),
           "dropped": psum(snp.sum(1 - snp.asarray(kept, np.int32)), stat_axes)}
    return y, aux


def _moe_of_shares(x, router, w_in, w_out, axes, stat_axes, replicated, **kw):
    """:func:`moe` of tokens the same along ``replicated``: each device's share of them,
    over the experts split along ``axes`` and ``replicated``; the shares' outputs
    gathered back (the same along ``replicated`` again)."""
    r = _size(replicated)
    xa = get_aval(x)
    if xa.ndim != 2 or xa.shape[0] % r:
        raise ShapeError(f"moe: x {xa.shape} must be (t, d) with t a multiple of the {r} "
                         f"devices along replicated_axes={replicated}, which share the "
                         "tokens out; give a multiple of them")
    t = xa.shape[0] // r
    mine = dynamic_slice_in_dim(x, axis_index(replicated) * t, t, axis=0)
    y, aux = moe(mine, router, w_in, w_out, axes + replicated,
                 token_axes=stat_axes + replicated, **kw)
    # The transpose of an invariant gather keeps each device's block: its share's.
    return all_gather(y, replicated, axis=0, tiled=True, to="invarying"), aux


def _sizes(x, router, w_in, w_out, n: int, top_k, capacity_factor) -> tuple:
    """:func:`moe`'s arguments checked: ``(tokens, width, experts, experts per device)``."""
    xa, ra, ia, oa = (get_aval(a) for a in (x, router, w_in, w_out))
    if xa.ndim != 2 or ra.ndim != 2 or ia.ndim != 3 or oa.ndim != 3:
        raise ShapeError(f"moe: x {xa.shape}, router {ra.shape}, w_in {ia.shape}, w_out "
                         f"{oa.shape} must be (t, d), (d, E), (E/n, d, h) and (E/n, h, d)")
    t, d = xa.shape
    experts = ra.shape[1]
    local = ia.shape[0]
    if ra.shape[0] != d or ia.shape[1] != d or oa.shape[2] != d or oa.shape[:2] != \
            (local, ia.shape[2]) or local * n != experts:
        raise ShapeError(f"moe: x {xa.shape}, router {ra.shape}, w_in {ia.shape}, w_out "
                         f"{oa.shape} do not agree: with {experts} experts over {n} devices "
                         f"each holds {experts // n if experts % n == 0 else '?'} experts of "
                         f"width {d}")
    if not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ArgumentError(f"moe: top_k={top_k!r} must be an int in [1, {experts}]")
    if not capacity_factor > 0:
        raise ArgumentError(f"moe: capacity_factor={capacity_factor!r} must be > 0")
    return t, d, experts, local
