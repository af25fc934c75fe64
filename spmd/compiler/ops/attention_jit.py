"""The attention kernel's softmax passes as compiled loops (numba).

The blocked kernel (:mod:`spmd.compiler.ops.attention`) computes a tile's products
with BLAS; between them, as numpy calls, the softmax made seven passes over the
tile's score block (mask, max, subtract, exp, sum, and in the backward the score
gradient's), and a causal block's masked half went through every one of them.
Here each of those is one loop over a row, the row in a core's L1 cache, computing
only the keys the row may see (a causal row ``i`` its first ``i + 1``, rounded up to
64 and the rest selected away) and writing zeros past them.  One layer of the big
example, forward and backward on two threads, with the kernel's other changes for
them (untransposed products, causal halves): 2.8 + 5.7 ms against 5.2 + 8.4 with the
numpy passes (``docs/history/2026-12-05-engine-rounds.md``, "The engine, eighth round").

Used for float32 operands without a bias, a user mask or a local window (causal
or not), from the :data:`~spmd.compiler.engine.loops.SWITCH_AT`-th call of an attention
equation on (:class:`spmd.compiler.engine.loops.Tier`); until then, and otherwise, the
numpy passes.  The numbers differ from those by float rounding: ``exp`` is
:func:`spmd.compiler.engine.kernel_math.expf` (within 1 ulp), and a row's sum is added in
another order.

Every function takes the score block as ``(rows, cols)``, C-contiguous; row ``i``
is query position ``r0 + i % period`` (a tile's rows repeat over its batch elements
and heads), and with ``causal`` it sees keys ``0 .. r0 + i % period``.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.engine import loops

_SOURCE = '''\
# spmd attention loops; kernel_math {digest}
import numba as nb
import numpy as np
from spmd.compiler.engine.kernel_math import expf

F = np.float32
M2 = nb.types.Array(nb.float32, 2, "C")
R2 = nb.types.Array(nb.float32, 2, "C", readonly=True)
V1 = nb.types.Array(nb.float32, 1, "C")
R1 = nb.types.Array(nb.float32, 1, "C", readonly=True)
OPTS = dict(nogil=True, cache=True, error_model="numpy", fastmath={{"reassoc", "contract"}})


@nb.njit(nb.intp(nb.intp, nb.intp, nb.intp, nb.intp, nb.boolean), **OPTS)
def seen(i, cols, period, r0, causal):
    return min(cols, r0 + i % period + 1) if causal else cols


@nb.njit(nb.intp(nb.intp, nb.intp), **OPTS)
def span(lim, cols):
    """The keys a loop computes: lim rounded up to 64 (the rest written as 0 by a
    select), so that its vector loop has no scalar tail (rows of 1 to 128 keys: the
    tails cost more than the vectors)."""
    return min(cols, (lim + 63) // 64 * 64)


# Each loop reads a row through its own 1-d view: indexed s[i, j] the loops were not
# vectorized (the exps of a layer's backward, 1.1 against 0.3 ms).
@nb.njit(nb.void(M2, nb.intp, nb.intp, nb.boolean, V1, V1), **OPTS)
def softmax_rows(s, period, r0, causal, mx, total):
    """s <- exp(s - max) over the keys a row sees, 0 past them; each row's max and
    sum of exps into mx and total."""
    rows, cols = s.shape
    for i in range(rows):
        lim = seen(i, cols, period, r0, causal)
        row = s[i]
        m = row[0]
        for j in range(1, lim):
            v = row[j]
            m = v if v > m else m
        acc = F(0.0)
        top = span(lim, cols)
        for j in range(top):
            e = expf(row[j] - m)
            e = e if j < lim else F(0.0)
            row[j] = e
            acc += e
        for j in range(top, cols):
            row[j] = F(0.0)
        mx[i] = m
        total[i] = acc


@nb.njit(nb.void(M2, nb.intp, nb.intp, nb.boolean, R1), **OPTS)
def probabilities_rows(s, period, r0, causal, lse):
    """s <- exp(s - lse) over the keys a row sees, 0 past them (the forward's
    probabilities, from its log-sum-exp)."""
    rows, cols = s.shape
    for i in range(rows):
        lim = seen(i, cols, period, r0, causal)
        row = s[i]
        m = lse[i]
        top = span(lim, cols)
        for j in range(top):
            e = expf(row[j] - m)
            row[j] = e if j < lim else F(0.0)
        for j in range(top, cols):
            row[j] = F(0.0)


@nb.njit(nb.void(M2, R2, R1, nb.intp, nb.intp, nb.boolean), **OPTS)
def score_grad_rows(dp, p, d, period, r0, causal):
    """dp <- p * (dp - d) over the keys a row sees, 0 past them (the score
    gradient, from the probabilities' gradient dp and the rows' d = sum(do * o))."""
    rows, cols = dp.shape
    for i in range(rows):
        lim = seen(i, cols, period, r0, causal)
        g = dp[i]
        pr = p[i]
        di = d[i]
        top = span(lim, cols)
        for j in range(top):
            v = pr[j] * (g[j] - di)
            g[j] = v if j < lim else F(0.0)
        for j in range(top, cols):
            g[j] = F(0.0)


@nb.njit(nb.void(R2, R2, V1), **OPTS)
def row_dots(a, b, out):
    """out[i] = sum(a[i] * b[i]): the backward's d = sum(do * o) over a row's head."""
    for i in range(a.shape[0]):
        x = a[i]
        y = b[i]
        acc = F(0.0)
        for j in range(a.shape[1]):
            acc += x[j] * y[j]
        out[i] = acc
'''


def source() -> str:
    """The module's source, naming the version of :mod:`kernel_math` it uses."""
    return _SOURCE.format(digest=loops.kernel_math_digest())


def compile_async():
    """The Future of the compiled module (None if it could not be compiled)."""
    return loops.compile_async(source(), "attention")


# ------------------------------------------------------- the kernel's tiles on them

def forward_job(jit, pb, og, lg):
    """The forward's job over tiles (see ``attention_forward.forward``) with the compiled
    softmax: scores (BLAS), one loop, ``p v`` (BLAS), normalised after the product."""
    pb.transposed("kg")  # (made once, before the threads)

    def job(tiles):
        for t in tiles:
            s, period = pb.scores(t)
            mx, total = np.empty(len(s), np.float32), np.empty(len(s), np.float32)
            jit.softmax_rows(s, period, t[4], pb.is_causal, mx, total)
            o = np.matmul(s.reshape(pb.tile(og, t).shape[:-1] + (-1,)),
                          pb.tile(pb.vg, t, "kv"))
            o /= total.reshape(o.shape[:-1] + (1,))
            pb.tile(og, t)[...] = o
            pb.tile(lg, t)[...] = (mx + np.log(total)).reshape(o.shape[:-1])

    return job


def probabilities(jit, pb, t, lg):
    """Tile ``t``'s probabilities from the log-sum-exp (no mask but the causal one, so
    no row is masked whole), shaped as the tile's rows."""
    p, period = pb.scores(t)
    jit.probabilities_rows(p, period, t[4], pb.is_causal,
                           np.ascontiguousarray(pb.tile(lg, t)).reshape(-1))
    return p.reshape(pb.tile(lg, t).shape + (-1,))


def row_dots(jit, pb, ct_out, out):
    """Every row's ``d = sum(do * o)`` in one loop, grouped as the log-sum-exp."""
    d = np.empty(ct_out.shape[:3], np.float32)
    jit.row_dots(np.ascontiguousarray(ct_out, np.float32).reshape(-1, pb.H),
                 np.ascontiguousarray(out, np.float32).reshape(-1, pb.H), d.reshape(-1))
    return d.reshape(pb.B, pb.T, pb.K, pb.G).transpose(0, 2, 3, 1)


def score_grad(jit, pb, t, dp, p, d):
    """dp <- p * (dp - d) in place, 0 past the keys each row sees."""
    jit.score_grad_rows(dp.reshape(-1, dp.shape[-1]), p.reshape(-1, p.shape[-1]),
                        np.ascontiguousarray(d, np.float32).reshape(-1), t[5] - t[4], t[4],
                        pb.is_causal)


class Runner(loops.Site):
    """One attention equation's implementation: the compiled passes from its
    :data:`~spmd.compiler.engine.loops.SWITCH_AT`-th call on operands they serve (float32,
    no bias, user mask or window), the numpy passes otherwise."""

    __slots__ = ()
    compile = staticmethod(compile_async)

    def __call__(self, *args):
        p = self.params
        jit = None
        if not (p["has_bias"] or p["has_mask"]) and p["window"] is None and \
                all(a.dtype == np.float32 for a in args[:3]):
            jit = self.tier.ready()
        return self.impl(np, *args, jit=jit, **p)
