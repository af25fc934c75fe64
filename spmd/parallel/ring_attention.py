"""Ring attention: attention with the sequence split over a mesh axis (context
parallelism), written on ``shard_map``'s collectives.

Each device holds its block of the queries, keys and values along the sequence.  The
key/value blocks travel around the ring of devices (``ppermute`` to the next one),
one step per device; at each step a device attends its queries to the block it holds
and folds the result into a running softmax (the running row maximum ``m``, the
running denominator ``l`` and the running numerator ``acc``), so no device ever holds
scores for more than one block pair: memory per device is proportional to its share
of the sequence.  The result equals full attention within float32 rounding, and is
differentiable (the ring's transpose is the reverse ring).

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
from spmd.compiler.ad import stop_gradient
from spmd.compiler.trace import get_aval
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
    of ``2n``: see :func:`zigzag_order`).

    >>> attn = shard_map(lambda q, k, v: ring_attention(q, k, v, "seq"), mesh=mesh,
    ...                  in_specs=P(None, "seq"), out_specs=P(None, "seq"))  # doctest: +SKIP
    """
    if layout not in _LAYOUTS:
        raise ArgumentError(f"ring_attention: layout={layout!r}; give 'contiguous' or "
                            "'zigzag'")
    axes = _axes(axis_name, "ring_attention")
    n = _size(axes)
    qa, ka, va = (get_aval(a) for a in (q, k, v))
    if qa.ndim < 2 or qa.shape[:-2] != ka.shape[:-2] or ka.shape[:-1] != va.shape[:-1] \
            or qa.shape[-2] != ka.shape[-2] or qa.shape[-1] != ka.shape[-1]:
        raise ShapeError(f"ring_attention: q {qa.shape}, k {ka.shape}, v {va.shape} must be "
                         "(..., s, d), (..., s, d) and (..., s, d_v) blocks with the same "
                         "leading dimensions and sequence block s")
    s, d = qa.shape[-2], qa.shape[-1]
    if layout == "zigzag" and s % 2:
        raise ShapeError(f"ring_attention: layout='zigzag' needs an even sequence block (2 "
                         f"chunks per device), got {s}")
    scale = float(1.0 / np.sqrt(d)) if scale is None else float(scale)
    dtype = qa.dtype
    # A finite floor for masked scores: exp(floor - m) is 0 once any key is seen, and a
    # row that has seen none yet is zeroed by the mask itself, never NaN.
    floor = np.asarray(np.finfo(dtype).min / 2, dtype)
    r = axis_index(axes)
    q_pos = _positions(r, n, s, layout)
    shift = [(j, (j + 1) % n) for j in range(n)]

    m = snp.full(qa.shape[:-1], floor, dtype)
    l = snp.zeros(qa.shape[:-1], dtype)
    acc = snp.zeros(qa.shape[:-1] + va.shape[-1:], dtype)
    for step in range(n):
        owner = (r - step) % n  # whose keys this device holds at this step
        scores = snp.einsum("...qd,...kd->...qk", q, k) * np.asarray(scale, dtype)
        if causal:
            k_pos = _positions(owner, n, s, layout)
            visible = q_pos[:, None] >= k_pos[None, :]
            scores = snp.where(visible, scores, floor)
        m_new = stop_gradient(snp.maximum(m, snp.max(scores, axis=-1)))
        p = snp.exp(scores - m_new[..., None])
        if causal:
            p = snp.where(visible, p, np.asarray(0, dtype))
        alpha = snp.exp(m - m_new)
        l = l * alpha + snp.sum(p, axis=-1)
        acc = acc * alpha[..., None] + snp.einsum("...qk,...kd->...qd", p, v)
        m = m_new
        if step + 1 < n:  # pass the blocks on: next step this device holds its left's
            k, v = ppermute(k, axes, shift), ppermute(v, axes, shift)
    return acc / l[..., None]
