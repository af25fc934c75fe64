"""The attention kernel's backward (``attention_grad``): the cotangents of q, k, v
and the bias, tile by tile (:mod:`spmd.compiler.ops.attention_tiles`), the
probabilities recomputed from the forward's log-sum-exp; the primitives and their
rules are in :mod:`spmd.compiler.ops.attention`."""

from __future__ import annotations

import numpy as np

from spmd.compiler.ops import attention_jit
from spmd.compiler.ops.attention_tiles import Problem, probabilities


def backward(xp, q, k, v, bias, mask, out, lse, ct_out, ct_lse, *, wants, scale,
             is_causal, window, jit=None):
    """The cotangents ``wants`` asks for (of q, k, v, bias: four flags), in that order,
    of the forward's ``out`` and ``lse`` given theirs (``ct_lse`` None: zero); with
    ``jit`` (the compiled module of :mod:`~spmd.compiler.ops.attention_jit`) the
    softmax passes are compiled loops."""
    pb = Problem(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window,
                 compiled=jit is not None)
    grads = _Backward(pb, q, k, v, out, lse, ct_out, ct_lse, wants, jit)
    pb.run(grads.job)
    outs = [x for x in (grads.dq, grads.dk, grads.dv) if x is not None]
    if grads.want_b:
        outs.append(_bias_cotangent(xp, grads.ds_all, bias, pb))
    return outs


class _Backward:
    """One call's cotangents and the job that makes them for a group of tiles (the
    tiles of one batch and head range, in order: :meth:`job`); each tile's in steps:
    its probabilities and the values' gradient, the score gradient
    (:meth:`_score_grad`), the queries' and keys' gradients (:meth:`_tile`)."""

    def __init__(self, pb, q, k, v, out, lse, ct_out, ct_lse, wants, jit):
        xp = pb.xp
        self.pb, self.jit = pb, jit
        self.want_q, self.want_k, self.want_v, self.want_b = wants
        self.lg, self.og, self.cg = pb.grouped_lse(lse), pb.grouped_q(out), pb.grouped_q(ct_out)
        self.clg = None if ct_lse is None else pb.grouped_lse(ct_lse)
        self.dq = xp.empty(q.shape, q.dtype) if self.want_q else None
        self.dk = xp.empty(k.shape, k.dtype) if self.want_k else None
        self.dv = xp.empty(v.shape, v.dtype) if self.want_v else None
        # The bias's cotangent is the masked score gradient summed over the bias's
        # broadcast dimensions: kept whole here (as the unfused program has it), summed
        # at the end in one fixed order.
        self.ds_all = (xp.zeros if pb.skips_keys else xp.empty)(
            (pb.B, pb.K, pb.G, pb.T, pb.S), pb.ld) if self.want_b else None
        self.dqg = None if self.dq is None else pb.grouped_q(self.dq)
        self.dkg = None if self.dk is None else pb.grouped_kv(self.dk)
        self.dvg = None if self.dv is None else pb.grouped_kv(self.dv)
        self.dg = None
        if jit is not None:  # each row's d = sum(do * o), for all rows at once
            self.dg = attention_jit.row_dots(jit, pb, ct_out, out)
            pb.transposed("kg"), pb.transposed("vg")  # (made once, before the threads)

    def job(self, tiles):
        """A job's tiles, in order: their key/value gradients summed over the row tiles
        (or written directly where one tile reads every key)."""
        pb, xp = self.pb, self.pb.xp
        b0, b1, h0, h1 = tiles[0][:4]
        shape = (b1 - b0, h1 - h0, 1, pb.S, pb.H)
        whole = len(tiles) == 1 and tiles[0][6] == pb.S
        acc_k = xp.zeros(shape, pb.ld) if self.want_k and not whole else None
        acc_v = xp.zeros(shape, pb.ld) if self.want_v and not whole else None
        for t in tiles:
            self._tile(t, whole, acc_k, acc_v)
        if self.want_k and not whole:
            self.dkg[b0:b1, h0:h1] = acc_k
        if self.want_v and not whole:
            self.dvg[b0:b1, h0:h1] = acc_v

    def _tile(self, t, whole, acc_k, acc_v):
        """Tile ``t``'s parts of the cotangents (``acc_k``, ``acc_v``: its job's key and
        value gradients, unless ``whole``)."""
        pb, xp = self.pb, self.pb.xp
        p, m = probabilities(pb, t, self.lg) if self.jit is None else \
            (attention_jit.probabilities(self.jit, pb, t, self.lg), None)
        do = pb.tile(self.cg, t).astype(pb.ld, copy=False)
        if self.want_v:
            _key_value_part(self.dvg, acc_v, _heads(xp.matmul(xp.swapaxes(p, -1, -2), do)),
                            t, whole)
        dp = self._score_grad(t, p, m, do)
        if self.want_b:
            pb.tile(self.ds_all, t, "bm")[...] = dp
        # The scale multiplies the (T H) cotangents, not the (T S) score gradient.
        if self.want_q:
            g = xp.matmul(dp, pb.tile(pb.kg, t, "kv"))
            g *= pb.scale
            pb.tile(self.dqg, t)[...] = g
        if self.want_k:
            g = _heads(xp.matmul(xp.swapaxes(dp, -1, -2), pb.tile(pb.qg, t) * pb.scale))
            _key_value_part(self.dkg, acc_k, g, t, whole)

    def _score_grad(self, t, p, m, do):
        """The tile's score gradient ``p * (do v^T - d)``, ``d`` the rows'
        ``sum(do * o)`` less the log-sum-exp's cotangent; 0 where masked."""
        pb, xp = self.pb, self.pb.xp
        if self.jit is None:
            vt = pb.tile(pb.vg, t, "kv")
            dp = xp.matmul(do, xp.swapaxes(vt, -1, -2).astype(pb.ld, copy=False))
            d = (do * pb.tile(self.og, t)).sum(-1, keepdims=True)
        else:
            dp = np.matmul(do, pb.tile(pb.transposed("vg"), t, "kv_t"))
            d = pb.tile(self.dg, t)[..., None]
        if self.clg is not None:
            d = d - pb.tile(self.clg, t)[..., None]
        if self.jit is None:
            dp -= d
            dp *= p
            if m is not None:
                dp = xp.where(m, dp, pb.ld.type(0))
        else:
            attention_jit.score_grad(self.jit, pb, t, dp, p, d)
        return dp


def _key_value_part(dst, acc, g, t, whole):
    """Tile ``t``'s part ``g`` of a key or value gradient: written into its batch and
    head ranges of ``dst`` when the tile is its job's only one and reads every key,
    else added to the job's sum ``acc`` over the keys the tile reads."""
    if whole:
        dst[t[0]:t[1], t[2]:t[3]] = g
    else:
        acc[..., :t[6], :] += g


def _heads(x):
    """A key/value head's part, summed over the query heads of its group."""
    return x if x.shape[2] == 1 else x.sum(2, keepdims=True)


def _bias_cotangent(xp, ds_all, bias, pb):
    full = ds_all.reshape(pb.B, pb.N, pb.T, pb.S)
    axes = tuple(d for d in range(4) if bias.shape[d] == 1 and full.shape[d] != 1)
    if axes:
        full = full.sum(axis=axes, keepdims=True)
    return full.astype(bias.dtype, copy=False)

