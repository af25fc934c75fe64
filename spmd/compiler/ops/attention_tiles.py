"""The attention kernel's tiles (:mod:`spmd.compiler.ops.attention`): the grouped
views of one call's operands, the tiles its work is cut into, and how the tiles are
shared among the engine's threads.

A tile is a range of batch elements and key/value heads and, for long sequences, a
range of query rows, sized so that its float32 score block stays near
:data:`TILE_BYTES` (in cache); the score matrix is never written whole and the
backward never reads a saved one.  Each query row keeps its whole key row (an exact
softmax, no running rescale; causal rows skip the keys after their tile's last row).
The tiling depends on the shapes only, never on the thread count: tiles are shared
among the engine's threads (each with BLAS on one thread) and give the same bits as
one thread.  Rows of one batch element and head that span several tiles are done in
order by one thread, so the key/value gradients sum them in a fixed order.

The kernels that run on the tiles: :mod:`spmd.compiler.ops.attention_forward` (the
forward and its jvp), :mod:`spmd.compiler.ops.attention_backward` (the cotangents),
:mod:`spmd.compiler.ops.attention_jit` (their softmax passes as compiled loops).
"""

from __future__ import annotations

import functools

import numpy as np

from spmd.compiler.engine import threads as _threads

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


def large_negative(dtype):
    """The logit a masked position takes: ``-0.7 *`` the largest value of ``dtype``
    (of float32 at most), as JAX's ``dot_product_attention``."""
    top = min(float(np.finfo(dtype).max), float(np.finfo(np.float32).max))
    return np.dtype(dtype).type(-0.7 * top)  # a scalar: CuPy takes it as numpy does


class Problem:
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
        self.neg = large_negative(self.ld)
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


def probabilities(pb, t, lse):
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

