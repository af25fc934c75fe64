"""The attention kernel's forward (``attention``: ``out`` and the rows' log-sum-exp)
and its jvp (``attention_tangent``), tile by tile
(:mod:`spmd.compiler.ops.attention_tiles`); the primitives and their rules are in
:mod:`spmd.compiler.ops.attention`."""

from __future__ import annotations

import numpy as np

from spmd.compiler.ops import attention_jit
from spmd.compiler.ops.attention_tiles import Problem, probabilities


def forward(xp, q, k, v, bias, mask, *, scale, is_causal, window, jit=None):
    """``[out, lse]``: the attention and its rows' log-sum-exp (float32, ``(B, N, T)``);
    with ``jit`` (the compiled module of :mod:`~spmd.compiler.ops.attention_jit`) its
    softmax passes are compiled loops."""
    pb = Problem(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window,
                 compiled=jit is not None)
    out = xp.empty(q.shape, q.dtype)
    lse = xp.empty((pb.B, pb.N, pb.T), np.float32)
    og, lg = pb.grouped_q(out), pb.grouped_lse(lse)

    def job(tiles):
        for t in tiles:
            s, _ = pb.logits(t)
            mx = s.max(-1, keepdims=True)
            s -= mx
            xp.exp(s, out=s)
            total = s.sum(-1, keepdims=True)
            # Normalised after the product: T H divisions instead of T S.
            o = xp.matmul(s.astype(pb.vdt, copy=False), pb.tile(pb.vg, t, "kv"))
            if o.dtype == total.dtype:
                o /= total
            else:  # (a half-precision sum of S exps could overflow)
                o = o / total
            pb.tile(og, t)[...] = o
            pb.tile(lg, t)[...] = (mx + xp.log(total))[..., 0]

    pb.run(job if jit is None else attention_jit.forward_job(jit, pb, og, lg))
    return [out, lse]


def tangent(xp, q, k, v, bias, mask, out, lse, tq, tk, tv, tbias, *, scale, is_causal,
            window):
    """``[t_out, t_lse]``: the jvp at the forward's ``out`` and ``lse``, linear in the
    tangents ``tq, tk, tv, tbias`` (None: zero)."""
    pb = Problem(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window)
    lg = pb.grouped_lse(lse)
    t_out = xp.empty(q.shape, q.dtype)
    t_lse = xp.empty((pb.B, pb.N, pb.T), np.float32)
    tog, tlg = pb.grouped_q(t_out), pb.grouped_lse(t_lse)
    tqg = None if tq is None else pb.grouped_q(tq)
    tkg = None if tk is None else pb.grouped_kv(tk)
    tvg = None if tv is None else pb.grouped_kv(tv)
    tbg = None if tbias is None else pb.grouped_bm(tbias)

    def job(tiles):
        for t in tiles:
            p, m = probabilities(pb, t, lg)
            ts = xp.zeros(p.shape, pb.ld)
            if tqg is not None:
                ts += xp.matmul(pb.tile(tqg, t) * pb.scale,
                                xp.swapaxes(pb.tile(pb.kg, t, "kv"), -1, -2))
            if tkg is not None:
                ts += xp.matmul(pb.tile(pb.qg, t) * pb.scale,
                                xp.swapaxes(pb.tile(tkg, t, "kv"), -1, -2))
            if tbg is not None:
                ts += pb.tile(tbg, t, "bm")
            if m is not None:
                ts = xp.where(m, ts, pb.ld.type(0))
            tl = (p * ts).sum(-1, keepdims=True)
            ts -= tl
            ts *= p
            o = xp.matmul(ts, pb.tile(pb.vg, t, "kv"))
            if tvg is not None:
                o += xp.matmul(p, pb.tile(tvg, t, "kv"))
            pb.tile(tog, t)[...] = o
            pb.tile(tlg, t)[...] = tl[..., 0]

    pb.run(job)
    return [t_out, t_lse]
