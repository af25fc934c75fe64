"""Ring attention: attention with the sequence split over a mesh axis (context
parallelism), written on ``shard_map``'s collectives.

Each device holds its block of the queries, keys and values along the sequence.  The
key/value blocks travel around the ring of devices (``ppermute`` to the next one),
one step per device; at each step a device attends its queries to the block it holds
and folds the result into a running softmax (the running row maximum ``m``, the
running denominator ``l`` and the running numerator ``acc``), so no device ever holds
scores for more than one block pair.  The derivative (a ``custom_vjp``) runs the ring
again, each key/value block travelling with its gradients, from what the forward kept:
this device's blocks, its output and one log-sum-exp per query, so memory per device
is proportional to its share of the sequence in both passes.  The result and its
gradients equal full attention's within float32 rounding.

Causal attention over a contiguous split leaves the first devices idle for most steps
(their queries see few keys).  ``layout="zigzag"`` balances it: the sequence is cut
into ``2n`` chunks and device ``r`` holds chunks ``r`` and ``2n - 1 - r`` (an early and
a late one), so every device has the same number of unmasked pairs;
:func:`zigzag_order` and :func:`zigzag_restore` reorder a global sequence into and out
of that layout.
"""

from __future__ import annotations

import numpy as np

import spmd.numpy as snp
from spmd.collectives.api import axis_index, ppermute
from spmd.collectives.primitives import _axes, _size
from spmd.compiler.transforms.custom import custom_vjp
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, ShapeError

__all__ = ["ring_attention", "zigzag_order", "zigzag_restore"]

_LAYOUTS = ("contiguous", "zigzag")


def zigzag_order(seq_len: int, n: int) -> np.ndarray:
    """The permutation that puts a sequence of ``seq_len`` in the zigzag layout for ``n``
    devices: ``x[..., zigzag_order(S, n), :]`` split contiguously over the devices gives
    device ``r`` chunks ``r`` and ``2n - 1 - r`` of ``2n``.

    >>> zigzag_order(8, 2)
    array([0, 1, 6, 7, 2, 3, 4, 5])
    """
    if seq_len % (2 * n):
        raise ShapeError(f"zigzag_order: a sequence of {seq_len} does not split into "
                         f"{2 * n} chunks (2 per device of {n}); pad it to a multiple of "
                         f"{2 * n}")
    c = seq_len // (2 * n)
    chunks = np.arange(seq_len).reshape(2 * n, c)
    return np.concatenate([np.concatenate([chunks[r], chunks[2 * n - 1 - r]])
                           for r in range(n)])


def zigzag_restore(seq_len: int, n: int) -> np.ndarray:
    """The inverse of :func:`zigzag_order`: ``y[..., zigzag_restore(S, n), :]`` puts a
    zigzag-ordered sequence back in order."""
    return np.argsort(zigzag_order(seq_len, n))


def _positions(r, n: int, s: int, layout: str):
    """The global sequence positions of device ``r``'s ``s`` rows (``r`` traced)."""
    local = snp.arange(s, dtype=np.int32)
    if layout == "contiguous":
        return r * s + local
    c = s // 2
    early = r * c + local
    late = (2 * n - 1 - r) * c + (local - c)
    return snp.where(local < c, early, late)


def ring_attention(q, k, v, axis_name, *, causal: bool = True, scale: float | None = None,
                   layout: str = "contiguous"):
    """Attention of this device's queries to the whole sequence, inside a ``shard_map``
    whose ``axis_name`` splits the sequence: ``q``, ``k``, ``v`` are this device's blocks
    of shape ``(..., s, d)`` (``(..., s, d_v)`` for ``v``), ``s`` its share of the
    sequence; returns its block of ``softmax(q k^T * scale + mask) v``.

    ``causal`` masks keys after each query (by global position); ``scale`` defaults to
    ``1 / sqrt(d)``; ``layout`` says which positions a device holds: ``"contiguous"``
    (device ``r`` the ``r``-th block) or ``"zigzag"`` (chunks ``r`` and ``2n - 1 - r``
    of ``2n``: see :func:`zigzag_order`).  Its derivative runs the ring again (the
    key/value blocks travel with their gradients), keeping only this device's blocks,
    its output and one number per query between the passes.

    >>> attn = shard_map(lambda q, k, v: ring_attention(q, k, v, "seq"), mesh=mesh,
    ...                  in_specs=P(None, "seq"), out_specs=P(None, "seq"))  # doctest: +SKIP
    """
    if layout not in _LAYOUTS:
        raise ArgumentError(f"ring_attention: layout={layout!r}; give 'contiguous' or "
                            "'zigzag'")
    axes = _axes(axis_name, "ring_attention")
    qa, ka, va = (get_aval(a) for a in (q, k, v))
    if qa.ndim < 2 or qa.shape[:-2] != ka.shape[:-2] or ka.shape[:-1] != va.shape[:-1] \
            or qa.shape[-2] != ka.shape[-2] or qa.shape[-1] != ka.shape[-1]:
        raise ShapeError(f"ring_attention: q {qa.shape}, k {ka.shape}, v {va.shape} must be "
                         "(..., s, d), (..., s, d) and (..., s, d_v) blocks with the same "
                         "leading dimensions and sequence block s")
    if layout == "zigzag" and qa.shape[-2] % 2:
        raise ShapeError(f"ring_attention: layout='zigzag' needs an even sequence block (2 "
                         f"chunks per device), got {qa.shape[-2]}")
    scale = float(1.0 / np.sqrt(qa.shape[-1])) if scale is None else float(scale)
    ring = _Ring(axes, _size(axes), causal, scale, layout, qa.dtype)

    @custom_vjp
    def attend(q, k, v):
        return ring.forward(q, k, v)[0]

    def fwd(q, k, v):
        out, lse = ring.forward(q, k, v)
        return out, (q, k, v, out, lse)

    attend.defvjp(fwd, lambda res, dout: ring.backward(*res, dout))
    return attend(q, k, v)


class _Ring:
    """The two passes of the ring for one configuration."""

    def __init__(self, axes, n, causal, scale, layout, dtype):
        self.axes, self.n, self.causal, self.layout = axes, n, causal, layout
        self.scale = np.asarray(scale, dtype)
        # A finite floor for masked scores: exp(floor - m) is 0 once any key is seen, and
        # a row that has seen none yet is zeroed by the mask itself, never NaN.
        self.floor = np.asarray(np.finfo(dtype).min / 2, dtype)
        self.shift = [(j, (j + 1) % n) for j in range(n)]

    def _owner(self, step):
        """This device's index and the owner of the key/value block it holds at ``step``
        (the blocks move one device on per step)."""
        r = axis_index(self.axes)
        return r, (r - step) % self.n

    def _mask(self, r, owner, s):
        """The visible (query, key) pairs of the two blocks (None: all visible)."""
        if not self.causal:
            return None
        q_pos = _positions(r, self.n, s, self.layout)
        k_pos = _positions(owner, self.n, s, self.layout)
        return q_pos[:, None] >= k_pos[None, :]

    def forward(self, q, k, v):
        """``(out, lse)``: the attention and each query's log-sum-exp of scores."""
        s = get_aval(q).shape[-2]
        dtype = get_aval(q).dtype
        m = snp.full(get_aval(q).shape[:-1], self.floor, dtype)
        l = snp.zeros(get_aval(q).shape[:-1], dtype)
        acc = snp.zeros(get_aval(q).shape[:-1] + get_aval(v).shape[-1:], dtype)
        for step in range(self.n):
            r, owner = self._owner(step)
            visible = self._mask(r, owner, s)
            scores = snp.einsum("...qd,...kd->...qk", q, k) * self.scale
            if visible is not None:
                scores = snp.where(visible, scores, self.floor)
            m_new = snp.maximum(m, snp.max(scores, axis=-1))
            p = snp.exp(scores - m_new[..., None])
            if visible is not None:
                p = snp.where(visible, p, np.asarray(0, dtype))
            alpha = snp.exp(m - m_new)
            l = l * alpha + snp.sum(p, axis=-1)
            acc = acc * alpha[..., None] + snp.einsum("...qk,...kd->...qd", p, v)
            m = m_new
            if step + 1 < self.n:  # pass the blocks on: next this device holds its left's
                k, v = ppermute(k, self.axes, self.shift), ppermute(v, self.axes, self.shift)
        return acc / l[..., None], m + snp.log(l)

    def backward(self, q, k, v, out, lse, dout):
        """``(dq, dk, dv)``: the ring again, each key/value block travelling with its
        gradients; after ``n`` shifts the gradients are back on the block's device."""
        s = get_aval(q).shape[-2]
        dtype = get_aval(q).dtype
        delta = snp.sum(dout * out, axis=-1)  # softmax's correction, one per query
        dq = snp.zeros_like(q)
        dk, dv = snp.zeros_like(k), snp.zeros_like(v)
        for step in range(self.n):
            r, owner = self._owner(step)
            visible = self._mask(r, owner, s)
            scores = snp.einsum("...qd,...kd->...qk", q, k) * self.scale
            p = snp.exp(scores - lse[..., None])
            if visible is not None:
                p = snp.where(visible, p, np.asarray(0, dtype))
            dv = dv + snp.einsum("...qk,...qd->...kd", p, dout)
            ds = p * (snp.einsum("...qd,...kd->...qk", dout, v) - delta[..., None])
            dq = dq + snp.einsum("...qk,...kd->...qd", ds, k) * self.scale
            dk = dk + snp.einsum("...qk,...qd->...kd", ds, q) * self.scale
            # The gradients travel with their block; the last shift takes them home.
            dk, dv = ppermute(dk, self.axes, self.shift), ppermute(dv, self.axes, self.shift)
            if step + 1 < self.n:
                k, v = ppermute(k, self.axes, self.shift), ppermute(v, self.axes, self.shift)
        return dq, dk, dv
