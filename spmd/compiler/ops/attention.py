"""Scaled dot-product attention as one blocked kernel (``spmd.nn.dot_product_attention``).

Three primitives, one kernel family:

- ``attention(q, k, v, [bias], [mask])`` -> ``[out, lse]``: the forward, with JAX's
  semantics (``jax.nn.dot_product_attention``'s XLA path): logits ``q k^T * scale``
  (+ bias) in ``promote(q.dtype, float32)``, masked to ``-0.7 * max`` where the mask
  (user mask, causal, local window) is False, softmax in float32, probabilities cast
  to the value dtype, ``p v``.  ``lse`` (float32, ``(B, N, T)``) is the rows'
  log-sum-exp, kept for the derivatives instead of the probabilities.
- ``attention_tangent(..., out, lse, [tq], [tk], [tv], [tbias])`` -> ``[t_out, t_lse]``:
  the jvp, linear in the tangents; its transpose is
- ``attention_grad(..., out, lse, ct_out, [ct_lse])`` -> the cotangents asked for
  (``wants``: q, k, v, bias), recomputing the probabilities from ``lse``.

Layouts are JAX's: ``q (B, T, N, H)``, ``k, v (B, S, K, H)`` with ``N = K * G``
(grouped-query attention; ``K == N`` is multi-head, ``K == 1`` multi-query), bias and
mask 4-d, broadcastable to ``(B, N, T, S)`` (their head dimension 1 or ``N``).

The kernel works tile by tile: a tile is a range of batch elements and key/value
heads and, for long sequences, a range of query rows, sized so that its float32
score block stays near :data:`TILE_BYTES` (in cache); the score matrix is never
written whole and the backward never reads a saved one.  Each query row keeps its
whole key row (an exact softmax, no running rescale; causal rows skip the keys after
their tile's last row).  The tiling depends on the shapes only, never on the thread
count: tiles are shared among the engine's threads (each with BLAS on one thread)
and give the same bits as one thread.  Rows of one batch element and head that span
several tiles are done in order by one thread, so the key/value gradients sum them
in a fixed order.
"""

from __future__ import annotations

import functools

import numpy as np

from spmd.compiler.engine import loops, threads as _threads
from spmd.compiler.transforms.ad_util import Zero, instantiate, is_undefined
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.ops import attention_jit
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, ShapeError

attention_p = Primitive("attention", traits=(), multiple_results=True)
attention_tangent_p = Primitive("attention_tangent", traits=(), multiple_results=True)
attention_grad_p = Primitive("attention_grad", traits=(), multiple_results=True)

# Bytes of float32 scores per tile: about a core's L2 (measured with a prototype of
# this kernel on one layer of the big example, (16, 8, 128, 32), forward and backward
# on 2 threads: blocks of 1 MiB 10.4 ms, of 512 and 256 KiB 11.5 and 12.8 ms; the
# whole score matrix at once, as numpy calls, 18.8 ms).
TILE_BYTES = 1 << 20
# With the compiled passes, a causal call's rows are cut in two halves from this many
# query positions: the first half's products skip the keys after it (a quarter of
# them).  Measured on one layer (16, 128, 8, 32), forward and backward: 2.92 + 6.24
# against 3.23 + 6.54 ms; at 64 positions the smaller products lost.
CAUSAL_HALVES_FROM = 128
# Work (4 B N T S H flops) below which the tiles stay on the calling thread: handing
# them to threads costs tens of microseconds (as linalg.SPLIT_FLOPS).
MIN_THREADED_FLOPS = 1 << 22


class SecondOrderAttentionError(ArgumentError, NotImplementedError):
    """A derivative of the attention kernel's own derivatives was asked for."""


# ------------------------------------------------------------------ operands

def _unpack(args, has_bias, has_mask):
    """``q, k, v, bias, mask`` and the rest, from a primitive's operands."""
    q, k, v = args[:3]
    i = 3
    bias = args[i] if has_bias else None
    i += has_bias
    mask = args[i] if has_mask else None
    i += has_mask
    return q, k, v, bias, mask, list(args[i:])


def _large_negative(dtype):
    top = min(float(np.finfo(dtype).max), float(np.finfo(np.float32).max))
    return np.dtype(dtype).type(-0.7 * top)  # a scalar: CuPy takes it as numpy does


class _Problem:
    """The grouped views of one call's operands and its tiles."""

    def __init__(self, xp, q, k, v, bias, mask, *, scale, is_causal, window,
                 compiled=False):
        self.xp = xp
        self.compiled = compiled  # the compiled softmax passes run its tiles
        B, T, N, H = q.shape
        S, K = k.shape[1], k.shape[2]
        G = N // K
        self.B, self.T, self.N, self.H, self.S, self.K, self.G = B, T, N, H, S, K, G
        self.ld = np.promote_types(q.dtype, np.float32)  # the logits' dtype
        self.vdt = v.dtype
        self.scale = self.ld.type(scale)
        self.neg = _large_negative(self.ld)
        self.is_causal, self.window = is_causal, window
        self.qg = self.grouped_q(q)
        self.kg, self.vg = self.grouped_kv(k), self.grouped_kv(v)
        self.bias, self.mask = self.grouped_bm(bias), self.grouped_bm(mask)
        # Causal attention without other masks: a key after a tile's last row is masked
        # for all its rows, and (no row being masked whole) contributes exactly 0, so
        # the tile does not read it.
        self.skips_keys = is_causal and mask is None and window is None
        self.jobs = self._jobs()

    # Views: q-like (B, T, N, H) -> (B, K, G, T, H); k-like (B, S, K, H) -> (B, K, 1, S, H);
    # bias-like (b, n, t, s) -> (b, K or 1, G or 1, t, s); lse-like (B, N, T) -> (B, K, G, T).
    def grouped_q(self, x):
        return x.reshape(self.B, self.T, self.K, self.G, self.H).transpose(0, 2, 3, 1, 4)

    def grouped_kv(self, x):
        return x.transpose(0, 2, 1, 3)[:, :, None]

    def grouped_bm(self, x):
        if x is None:
            return None
        b, n, t, s = x.shape
        return x.reshape(b, 1, 1, t, s) if n == 1 else x.reshape(b, self.K, self.G, t, s)

    def grouped_lse(self, x):
        return x.reshape(self.B, self.K, self.G, self.T)

    def _jobs(self):
        """Tiles ``(b0, b1, h0, h1, r0, r1, c1)``: batch, key/value head and query row
        ranges, and the keys ``[0, c1)`` they read; grouped into jobs, whose tiles share
        batch and head ranges and differ in their rows (one thread does a job's tiles
        in order)."""
        row = self.S * 4  # float32 scores of one query row
        per_b = self.N * self.T * row
        per_k = self.G * self.T * row
        rows = self.T
        if self.compiled and self.skips_keys and self.T >= CAUSAL_HALVES_FROM:
            rows = -(-self.T // 2)
        if per_b <= TILE_BYTES:
            nb = max(1, min(self.B, TILE_BYTES // per_b))
            units = [(b, min(b + nb, self.B), 0, self.K) for b in range(0, self.B, nb)]
        elif per_k <= TILE_BYTES:
            nk = max(1, TILE_BYTES // per_k)
            units = [(b, b + 1, h, min(h + nk, self.K))
                     for b in range(self.B) for h in range(0, self.K, nk)]
        else:
            rows = max(1, TILE_BYTES // (self.G * row))
            units = [(b, b + 1, h, h + 1) for b in range(self.B) for h in range(self.K)]
        # Causal rows r0..r1-1 read keys [0, r1) only: R row tiles make about
        # (1 + 1/R) / 2 of the products and passes.  (Splitting rows further for that
        # alone lost: (16, 128, 8, 32) in 4 row blocks took 6.2 + 11.2 ms forward and
        # backward against 4.5 + 7.3 whole, the smaller products and calls costing more
        # than the keys saved.)
        return [[u + (r, min(r + rows, self.T), self.keys_of(min(r + rows, self.T)))
                 for r in range(0, self.T, rows)] for u in units]

    def keys_of(self, r1) -> int:
        return min(self.S, r1) if self.skips_keys else self.S

    def tile(self, x, t, kind="rows"):
        """The part of grouped ``x`` in tile ``t``: its rows (q-like ``(B, K, G, T, H)``
        and lse-like ``(B, K, G, T)``), its keys (``kv``) or both (``bm``, bias-like
        ``(b, k, g, t, s)``, a size-1 (broadcast) dimension taken whole); ``kv_t``: the
        keys of :meth:`transposed` ones."""
        b0, b1, h0, h1, r0, r1, c1 = t
        if kind == "bm":
            sl = lambda d, lo, hi: slice(None) if x.shape[d] == 1 else slice(lo, hi)
            return x[sl(0, b0, b1), sl(1, h0, h1), :, sl(3, r0, r1), sl(4, 0, c1)]
        if kind == "kv":
            return x[b0:b1, h0:h1, :, :c1]
        if kind == "kv_t":  # keys or values transposed: (..., H, S)
            return x[b0:b1, h0:h1, :, :, :c1]
        return x[b0:b1, h0:h1, :, r0:r1]

    def logits(self, t):
        """The tile's masked logits in float32 and its mask (None: nothing masked)."""
        xp = self.xp
        q, k = self.tile(self.qg, t), self.tile(self.kg, t, "kv")
        # The scale multiplies q (T H products) rather than the scores (T S).
        s = xp.matmul(q.astype(self.ld, copy=False) * self.scale,
                      xp.swapaxes(k.astype(self.ld, copy=False), -1, -2))
        if self.bias is not None:
            s += self.tile(self.bias, t, "bm")
        m = self.mask_of(t)
        if m is not None:
            xp.copyto(s, self.neg, where=~m)
        return s.astype(np.float32, copy=False), m

    def scores(self, t):
        """The tile's logits as a ``(rows, keys)`` float32 block, unmasked (the
        compiled passes mask them), and the row count of one batch element and head."""
        q = self.tile(self.qg, t)
        s = self.xp.matmul(q * self.scale, self.tile(self.transposed("kg"), t, "kv_t"))
        return s.reshape(-1, s.shape[-1]), t[5] - t[4]

    def transposed(self, name):
        """Grouped keys or values (``name``: ``"kg"``, ``"vg"``) as ``(B, K, 1, H, S)``,
        contiguous: made once a call, so that the tiles' products read both operands
        untransposed (BLAS's ``q k^T`` on a transposed view: 2.2 against 1.6 ms a
        layer of the big example)."""
        key = "_t" + name
        got = self.__dict__.get(key)
        if got is None:
            got = self.__dict__[key] = np.ascontiguousarray(np.swapaxes(getattr(self, name),
                                                                        -1, -2))
        return got

    def mask_of(self, t):
        xp = self.xp
        m = None if self.mask is None else self.tile(self.mask, t, "bm")
        if self.is_causal or self.window is not None:
            qpos = xp.arange(t[4], t[5])[:, None]
            kpos = xp.arange(t[6])[None, :]
            pos = None
            if self.is_causal:
                pos = kpos <= qpos
            if self.window is not None:
                left, right = self.window
                w = (qpos <= kpos + left) & (qpos >= kpos - right)
                pos = w if pos is None else pos & w
            m = pos if m is None else m & pos
        return m

    def run(self, job_fn) -> None:
        """``job_fn(job)`` for every job, shared among the engine's threads when the
        work is worth it (each job's results do not depend on which thread does it)."""
        jobs = self.jobs
        work = 4 * self.B * self.N * self.T * self.S * self.H
        if self.xp is not np or len(jobs) < 2 or work < MIN_THREADED_FLOPS or \
                not _threads.threads_help() or _threads.POOL.size() < 2:
            for j in jobs:
                job_fn(j)
            return
        parts = min(_threads.POOL.size(), len(jobs))
        cuts = [jobs[i * len(jobs) // parts:(i + 1) * len(jobs) // parts] for i in range(parts)]
        with _threads.BLAS.one():
            _threads.POOL.run([functools.partial(_each, job_fn, c) for c in cuts])


def _each(fn, jobs):
    for j in jobs:
        fn(j)


def _probabilities(pb, t, lse):
    """The tile's softmax recomputed from the saved log-sum-exp (float32), and the mask
    the derivatives must apply: None where every masked probability is exactly 0
    (exp of a large negative number), so that products with it are 0 already."""
    s, m = pb.logits(t)
    row = pb.tile(lse, t)[..., None]
    s -= row
    pb.xp.exp(s, out=s)
    if m is None:
        return s, None
    # A row masked whole has the uniform softmax 1/S (every logit is the same large
    # negative number), but its log-sum-exp, -0.7 * max + log(S), rounds to -0.7 * max:
    # exp(s - lse) would be 1.  Such rows are the only ones whose log-sum-exp is that
    # low, and the only ones whose masked probabilities are not 0.
    whole = row <= pb.neg * 0.5
    if not whole.any():
        return s, None
    pb.xp.copyto(s, np.float32(1.0 / pb.S), where=whole)
    return s, m


# ------------------------------------------------------------------ kernels

def _forward(xp, q, k, v, bias, mask, *, scale, is_causal, window, jit=None):
    pb = _Problem(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window,
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


def _tangent(xp, q, k, v, bias, mask, out, lse, tq, tk, tv, tbias, *, scale, is_causal,
             window):
    pb = _Problem(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window)
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
            p, m = _probabilities(pb, t, lg)
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


def _backward(xp, q, k, v, bias, mask, out, lse, ct_out, ct_lse, *, wants, scale,
              is_causal, window, jit=None):
    pb = _Problem(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window,
                  compiled=jit is not None)
    want_q, want_k, want_v, want_b = wants
    lg, og, cg = pb.grouped_lse(lse), pb.grouped_q(out), pb.grouped_q(ct_out)
    clg = None if ct_lse is None else pb.grouped_lse(ct_lse)
    dq = xp.empty(q.shape, q.dtype) if want_q else None
    dk = xp.empty(k.shape, k.dtype) if want_k else None
    dv = xp.empty(v.shape, v.dtype) if want_v else None
    # The bias's cotangent is the masked score gradient summed over the bias's
    # broadcast dimensions: kept whole here (as the unfused program has it), summed
    # at the end in one fixed order.
    ds_all = (xp.zeros if pb.skips_keys else xp.empty)(
        (pb.B, pb.K, pb.G, pb.T, pb.S), pb.ld) if want_b else None
    dqg = None if dq is None else pb.grouped_q(dq)
    dkg = None if dk is None else pb.grouped_kv(dk)
    dvg = None if dv is None else pb.grouped_kv(dv)

    if jit is not None:  # each row's d = sum(do * o), for all rows at once
        dg = attention_jit.row_dots(jit, pb, ct_out, out)
        pb.transposed("kg"), pb.transposed("vg")  # (made once, before the threads)

    def job(tiles):
        b0, b1, h0, h1 = tiles[0][:4]
        shape = (b1 - b0, h1 - h0, 1, pb.S, pb.H)
        # One tile reading every key: its key/value gradients are written directly.
        whole = len(tiles) == 1 and tiles[0][6] == pb.S
        acc_k = xp.zeros(shape, pb.ld) if want_k and not whole else None
        acc_v = xp.zeros(shape, pb.ld) if want_v and not whole else None
        for t in tiles:
            c1 = t[6]
            p, m = _probabilities(pb, t, lg) if jit is None else \
                (attention_jit.probabilities(jit, pb, t, lg), None)
            do = pb.tile(cg, t).astype(pb.ld, copy=False)
            vt = pb.tile(pb.vg, t, "kv")
            if want_v:
                g = _heads(xp.matmul(xp.swapaxes(p, -1, -2), do))
                if whole:
                    dvg[b0:b1, h0:h1] = g
                else:
                    acc_v[..., :c1, :] += g
            if jit is None:
                dp = xp.matmul(do, xp.swapaxes(vt, -1, -2).astype(pb.ld, copy=False))
            else:
                dp = np.matmul(do, pb.tile(pb.transposed("vg"), t, "kv_t"))
            if jit is None:
                d = (do * pb.tile(og, t)).sum(-1, keepdims=True)
            else:
                d = pb.tile(dg, t)[..., None]
            if clg is not None:
                d = d - pb.tile(clg, t)[..., None]
            if jit is None:
                dp -= d
                dp *= p
                if m is not None:
                    dp = xp.where(m, dp, pb.ld.type(0))
            else:
                attention_jit.score_grad(jit, pb, t, dp, p, d)
            if want_b:
                pb.tile(ds_all, t, "bm")[...] = dp
            # The scale multiplies the (T H) cotangents, not the (T S) score gradient.
            if want_q:
                g = xp.matmul(dp, pb.tile(pb.kg, t, "kv"))
                g *= pb.scale
                pb.tile(dqg, t)[...] = g
            if want_k:
                g = _heads(xp.matmul(xp.swapaxes(dp, -1, -2), pb.tile(pb.qg, t) * pb.scale))
                if whole:
                    dkg[b0:b1, h0:h1] = g
                else:
                    acc_k[..., :c1, :] += g
        if want_k and not whole:
            dkg[b0:b1, h0:h1] = acc_k
        if want_v and not whole:
            dvg[b0:b1, h0:h1] = acc_v

    pb.run(job)
    outs = [x for x in (dq, dk, dv) if x is not None]
    if want_b:
        outs.append(_bias_cotangent(xp, ds_all, bias, pb))
    return outs


def _heads(x):
    """A key/value head's part, summed over the query heads of its group."""
    return x if x.shape[2] == 1 else x.sum(2, keepdims=True)


def _bias_cotangent(xp, ds_all, bias, pb):
    full = ds_all.reshape(pb.B, pb.N, pb.T, pb.S)
    axes = tuple(d for d in range(4) if bias.shape[d] == 1 and full.shape[d] != 1)
    if axes:
        full = full.sum(axis=axes, keepdims=True)
    return full.astype(bias.dtype, copy=False)


# ------------------------------------------------------------------ rules

def _params(scale, is_causal, window, has_bias, has_mask):
    return dict(scale=scale, is_causal=is_causal, window=window, has_bias=has_bias,
                has_mask=has_mask)


@attention_p.def_impl
def _attention_impl(xp, *args, scale, is_causal, window, has_bias, has_mask, jit=None):
    q, k, v, bias, mask, _ = _unpack(args, has_bias, has_mask)
    return _forward(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window,
                    jit=jit)


@attention_tangent_p.def_impl
def _tangent_impl(xp, *args, scale, is_causal, window, has_bias, has_mask, tangents):
    q, k, v, bias, mask, rest = _unpack(args, has_bias, has_mask)
    out, lse, *ts = rest
    it = iter(ts)
    tq, tk, tv, tb = (next(it) if present else None for present in tangents)
    return _tangent(xp, q, k, v, bias, mask, out, lse, tq, tk, tv, tb, scale=scale,
                    is_causal=is_causal, window=window)


@attention_grad_p.def_impl
def _grad_impl(xp, *args, scale, is_causal, window, has_bias, has_mask, wants, has_ct_lse,
               jit=None):
    q, k, v, bias, mask, rest = _unpack(args, has_bias, has_mask)
    out, lse, ct_out = rest[:3]
    ct_lse = rest[3] if has_ct_lse else None
    return _backward(xp, q, k, v, bias, mask, out, lse, ct_out, ct_lse, wants=wants,
                     scale=scale, is_causal=is_causal, window=window, jit=jit)


# On numpy, each equation's calls switch to the compiled softmax passes once they
# are compiled (spmd/compiler/ops/attention_jit.py).
attention_p.rules.bind_impl = loops.bind_site(_attention_impl, attention_jit.Runner)
attention_grad_p.rules.bind_impl = loops.bind_site(_grad_impl, attention_jit.Runner)


def check_operands(q, k, v, bias, mask, fname: str = "attention") -> None:
    """The operands' shapes (avals or arrays) agree: q ``(B, T, N, H)``, k and v one
    ``(B, S, K, H)`` shape with ``N`` a multiple of ``K``, bias and mask broadcasting to
    ``(B, N, T, S)`` with a head dimension of 1 or ``N``; else ShapeError."""
    if len(q.shape) != 4 or len(k.shape) != 4 or v.shape != k.shape:
        raise ShapeError(f"{fname}: q must be (B, T, N, H) and k, v one (B, S, K, H) "
                         f"shape; got q {q.shape}, k {k.shape}, v {v.shape}")
    B, T, N, H = q.shape
    K = k.shape[2]
    if k.shape[0] != B or k.shape[3] != H:
        raise ShapeError(f"{fname}: q {q.shape} and k {k.shape} disagree (the batch and "
                         "head sizes must match)")
    if N % K:
        raise ShapeError(f"{fname}: query has {N} heads, which is not a multiple of "
                         f"key/value's {K}")
    full = (B, N, T, k.shape[1])
    for name, x in (("bias", bias), ("mask", mask)):
        if x is not None and (len(x.shape) != 4 or x.shape[1] not in (1, N) or any(
                a not in (1, b) for a, b in zip(x.shape, full))):
            raise ShapeError(f"{fname}: {name} has shape {x.shape}, which does not "
                             f"broadcast to (B, N, T, S) = {full} with a head dimension "
                             f"of 1 or {N}")


def _lse_aval(q):
    B, T, N, _ = q.shape
    return ShapedArray((B, N, T), np.dtype(np.float32))


@attention_p.def_abstract_eval
def _attention_aval(*avals, scale, is_causal, window, has_bias, has_mask):
    q, k, v, bias, mask, _ = _unpack(avals, has_bias, has_mask)
    check_operands(q, k, v, bias, mask)
    return [ShapedArray(q.shape, q.dtype), _lse_aval(q)]


@attention_tangent_p.def_abstract_eval
def _tangent_aval(*avals, scale, is_causal, window, has_bias, has_mask, tangents):
    q, k, v, bias, mask, _ = _unpack(avals, has_bias, has_mask)
    check_operands(q, k, v, bias, mask)
    return [ShapedArray(q.shape, q.dtype), _lse_aval(q)]


@attention_grad_p.def_abstract_eval
def _grad_aval(*avals, scale, is_causal, window, has_bias, has_mask, wants, has_ct_lse):
    q, k, v, bias, mask, _ = _unpack(avals, has_bias, has_mask)
    check_operands(q, k, v, bias, mask)
    outs = [ShapedArray(x.shape, x.dtype) for x, w in zip((q, k, v), wants[:3]) if w]
    if wants[3]:
        outs.append(ShapedArray(bias.shape, bias.dtype))
    return outs


@attention_p.def_jvp
def _attention_jvp(primals, tangents, *, scale, is_causal, window, has_bias, has_mask):
    params = _params(scale, is_causal, window, has_bias, has_mask)
    out, lse = bind(attention_p, *primals, **params)
    ts = list(tangents[:3]) + [tangents[3] if has_bias else Zero(None)]
    present = tuple(not isinstance(t, Zero) for t in ts)
    if not any(present):
        return [out, lse], [Zero(get_aval(out)), Zero(get_aval(lse))]
    t_out, t_lse = bind(attention_tangent_p, *primals, out, lse,
                        *[t for t, p in zip(ts, present) if p], tangents=present, **params)
    return [out, lse], [t_out, t_lse]


@attention_tangent_p.def_transpose
def _tangent_transpose(cts, *args, scale, is_causal, window, has_bias, has_mask, tangents):
    ct_out, ct_lse = cts
    n_known = 5 + has_bias + has_mask
    known, linear = args[:n_known], args[n_known:]
    if any(is_undefined(a) for a in known):
        raise ArgumentError("attention_tangent: only its tangent operands are linear")
    if isinstance(ct_out, Zero) and isinstance(ct_lse, Zero):
        return [None] * n_known + [Zero(a.aval) for a in linear]
    q = known[0]
    ct_out = instantiate(Zero(get_aval(q)) if isinstance(ct_out, Zero) else ct_out)
    has_ct_lse = not isinstance(ct_lse, Zero)
    grads = bind(attention_grad_p, *known, ct_out, *([ct_lse] if has_ct_lse else []),
                 wants=tuple(tangents), has_ct_lse=has_ct_lse,
                 **_params(scale, is_causal, window, has_bias, has_mask))
    return [None] * n_known + list(grads)


def _no_second_order(name):
    def rule(primals, tangents, **params):
        if all(isinstance(t, Zero) for t in tangents):
            outs = bind(PRIMS[name], *primals, **params)
            return outs, [Zero(get_aval(o)) for o in outs]
        raise SecondOrderAttentionError(
            "spmd.nn.dot_product_attention: a derivative of the fused attention kernel's "
            f"own derivative ({name}) was asked for (a second-order derivative through "
            "attention); the kernel has first derivatives only. Fix: pass "
            "implementation='xla' to dot_product_attention, which builds attention from "
            "ordinary operations that differentiate to any order")
    return rule


PRIMS = {p.name: p for p in (attention_p, attention_tangent_p, attention_grad_p)}
attention_tangent_p.def_jvp(_no_second_order("attention_tangent"))
attention_grad_p.def_jvp(_no_second_order("attention_grad"))


# ------------------------------------------------------------------ vmap

def layouts(prim, params) -> tuple[list, list]:
    """Each operand's and each result's layout, for the rules that map over or split
    the operands (vmap here, the partition rule in the sharding layer): ``q`` (like
    ``(B, T, N, H)``), ``kv`` (``(B, S, K, H)``), ``lse`` (``(B, N, T)``), ``bm`` (bias
    or mask, ``(b, n, t, s)`` with ``b`` and ``n`` possibly 1) and ``dbias`` (the bias's
    cotangent, shaped as the bias)."""
    base = ["q", "kv", "kv"] + ["bm"] * (params["has_bias"] + params["has_mask"])
    if prim is attention_p:
        return base, ["q", "lse"]
    if prim is attention_tangent_p:
        tq, tk, tv, tb = params["tangents"]
        return base + ["q", "lse"] + ["q"] * tq + ["kv"] * (tk + tv) + ["bm"] * tb, \
            ["q", "lse"]
    wq, wk, wv, wb = params["wants"]
    return base + ["q", "lse", "q"] + ["lse"] * params["has_ct_lse"], \
        ["q"] * wq + ["kv"] * (wk + wv) + ["dbias"] * wb


def _batch_rule(prim):
    """Batching for the three primitives: the mapped axis joins the batch axis, which
    every operand has first (bias and mask may have 1 there and stay unbatched)."""
    def rule(args, dims, **params):
        from spmd.compiler import ops
        from spmd.compiler.transforms.batching import bdim_size, broadcast_batch

        V = bdim_size(args, dims)
        ins, outs_k = layouts(prim, params)
        qs, dq = tuple(np.shape(args[0])), dims[0]  # q is operand 0: its batch is B
        B = qs[0] if dq is None else tuple(s for i, s in enumerate(qs) if i != dq)[0]
        need_grad_bias = prim is attention_grad_p and params["wants"][3]
        # The bias's own batch size (1: broadcast), for its cotangent's shape.
        bias_lead = None
        if params["has_bias"]:
            bs, db = tuple(np.shape(args[3])), dims[3]
            bias_lead = bs[0] if db is None else tuple(x for i, x in enumerate(bs)
                                                       if i != db)[0]
        new = []
        for a, d, kind in zip(args, dims, ins):
            shape = tuple(np.shape(a))
            if kind == "bm" and d is None and shape[0] == 1 and not need_grad_bias:
                new.append(a)
                continue
            x = broadcast_batch(a, d, V)
            rest = tuple(np.shape(x)[1:])
            if rest[0] != B:
                x = ops.structural.broadcast_in_dim(x, (V, B) + rest[1:],
                                                    (0,) + tuple(range(1, len(rest) + 1)))
            new.append(ops.structural.reshape(x, (V * B,) + rest[1:]))
        outs = bind(prim, *new, **params)
        res = []
        for o, kind in zip(outs, outs_k):
            shape = tuple(np.shape(o))
            o = ops.structural.reshape(o, (V, B) + shape[1:])
            if kind == "dbias" and bias_lead == 1:
                o = ops.reduce.reduce_sum(o, (1,))
                o = ops.structural.reshape(o, (V, 1) + shape[1:])
            res.append(o)
        return res, [0] * len(res)
    return rule


for _p in (attention_p, attention_tangent_p, attention_grad_p):
    _p.def_batch(_batch_rule(_p))


def attention(q, k, v, bias=None, mask=None, *, scale: float, is_causal: bool = False,
              window: tuple | None = None):
    """``[out, lse]`` of scaled dot-product attention (see the module docstring); the
    checked front end is :func:`spmd.nn.dot_product_attention`."""
    extra = [x for x in (bias, mask) if x is not None]
    return bind(attention_p, q, k, v, *extra,
                **_params(float(scale), bool(is_causal),
                          None if window is None else tuple(map(int, window)),
                          bias is not None, mask is not None))
