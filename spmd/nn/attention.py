"""``spmd.nn.dot_product_attention``: JAX's function, run as one blocked kernel.

The default implementation is the fused kernel of :mod:`spmd.compiler.ops.attention`:
the score matrix is made tile by tile in cache, the backward recomputes the
probabilities from the rows' log-sum-exp instead of keeping them, and the tiles are
shared among the engine's threads.  ``implementation="xla"`` builds the same maths
from ordinary operations, as JAX's XLA path does (it differentiates to any order;
the kernel has first derivatives only).
"""

from __future__ import annotations

import numpy as np

import spmd.numpy as snp
from spmd.compiler.transforms.ad import stop_gradient
from spmd.compiler.ops import attention as _kernel
from spmd.compiler.ops.attention_tiles import large_negative
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._util import to_array

_IMPLEMENTATIONS = (None, "xla", "fused")


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None,
                          is_causal: bool = False, query_seq_lengths=None,
                          key_value_seq_lengths=None, local_window_size=None,
                          implementation: str | None = None, return_residual: bool = False):
    """Scaled dot-product attention, ``softmax(q k^T * scale + bias) v`` per head, as
    ``jax.nn.dot_product_attention`` (same arguments, layouts and results).

    ``query`` is ``(B, T, N, H)`` (or ``(T, N, H)``), ``key`` and ``value``
    ``(B, S, K, H)`` with ``N`` a multiple of ``K`` (grouped-query attention); ``bias``
    and ``mask`` (boolean, True where a score takes part) are 4-d and broadcast to
    ``(B, N, T, S)``; ``scale`` defaults to ``1 / sqrt(H)``; ``is_causal``,
    ``local_window_size`` (``(left, right)`` or one int) and the ``int32`` sequence
    lengths ``(B,)`` mask more.  ``implementation``: None or ``"fused"`` (the blocked
    kernel), or ``"xla"`` (ordinary operations, as JAX's default).  With
    ``return_residual`` the rows' log-sum-exp ``(B, T, N)`` is returned too.

    >>> import spmd, spmd.numpy as snp
    >>> q = snp.ones((2, 4, 2, 8)); kv = snp.ones((2, 4, 1, 8))
    >>> spmd.nn.dot_product_attention(q, kv, kv, is_causal=True).shape
    (2, 4, 2, 8)
    """
    if implementation not in _IMPLEMENTATIONS:
        raise ArgumentError(
            f"dot_product_attention: implementation={implementation!r} is not supported; "
            "use None or 'fused' (the blocked kernel) or 'xla' (ordinary operations)"
            + (" (cuDNN's kernel needs an NVIDIA GPU and JAX's cuDNN bindings, which spmd "
               "does not use)" if implementation == "cudnn" else ""))
    out_shape = tuple(np.shape(query))
    q, k, v = (_ensure_4d(x) for x in (query, key, value))
    bias = None if bias is None else _ensure_4d(bias)
    mask = None if mask is None else _ensure_4d(mask)
    B, S, K, H = get_aval(k).shape
    _expect(v, "value", (B, S, K, H), get_aval(k).dtype)
    _expect(q, "query", (B, -1, -1, H), get_aval(k).dtype)
    _expect(mask, "mask", (-1,) * 4, np.dtype(bool))
    _expect(bias, "bias", (-1,) * 4, None)
    qlen = _lengths(query_seq_lengths, "query_seq_lengths", B)
    kvlen = _lengths(key_value_seq_lengths, "key_value_seq_lengths", B)
    T = get_aval(q).shape[1]
    _kernel.check_operands(*(None if x is None else get_aval(x)
                             for x in (q, k, v, bias, mask)), fname="dot_product_attention")
    if isinstance(local_window_size, (int, np.integer)):
        local_window_size = (int(local_window_size), int(local_window_size))
    if local_window_size is not None:
        local_window_size = tuple(int(w) for w in local_window_size)
        if len(local_window_size) != 2:
            raise ArgumentError(f"dot_product_attention: local_window_size="
                                f"{local_window_size!r} must be an int or (left, right)")
    scale = 1.0 / np.sqrt(H) if scale is None else float(scale)
    if qlen is not None or kvlen is not None:
        pad = _padding_mask(T, S, qlen, kvlen)
        mask = pad if mask is None else snp.logical_and(mask, pad)
    if implementation == "xla":
        out, lse = _composite(q, k, v, bias, mask, scale, is_causal, local_window_size)
    else:
        out, lse = _kernel.attention(q, k, v, bias, mask, scale=scale, is_causal=is_causal,
                                     window=local_window_size)
    if qlen is not None:
        keep = snp.arange(T)[None, :] < qlen[:, None]
        out = out * keep[:, :, None, None].astype(out.dtype)
    out = snp.reshape(out, out_shape)
    if not return_residual:
        return out
    res = stop_gradient(snp.transpose(lse, (0, 2, 1)).astype(get_aval(k).dtype))
    return out, snp.reshape(res, out_shape[:-1])


def _ensure_4d(x):
    x = to_array(x)
    nd = len(get_aval(x).shape)
    return snp.reshape(x, (1,) * (4 - nd) + get_aval(x).shape) if nd < 4 else x


def _expect(x, name, shape, dtype) -> None:
    """JAX's checks of an operand's rank, sizes (-1: any) and dtype."""
    if x is None:
        return
    a = get_aval(x)
    if len(a.shape) != len(shape):
        raise ShapeError(f"dot_product_attention: {name} must have {len(shape)} dimensions, "
                         f"got shape {a.shape}")
    if dtype is not None and a.dtype != dtype:
        raise ArgumentError(f"dot_product_attention: {name} has dtype {a.dtype}; it must be "
                            f"{dtype} (cast it with .astype)")
    for got, want in zip(a.shape, shape):
        if want != -1 and got != want:
            raise ShapeError(f"dot_product_attention: {name} has shape {a.shape}; it must be "
                             f"{tuple('any' if w == -1 else w for w in shape)}")


def _lengths(x, name, B):
    if x is None:
        return None
    x = to_array(x)
    _expect(x, name, (B,), np.dtype(np.int32))
    return x


def _padding_mask(T, S, qlen, kvlen):
    """True where both the query row and the key column are within their lengths:
    ``(B, 1, T, S)``."""
    m = None
    if qlen is not None:
        m = snp.arange(T)[None, :, None] < qlen[:, None, None]
    if kvlen is not None:
        kv = snp.arange(S)[None, None, :] < kvlen[:, None, None]
        m = kv if m is None else snp.logical_and(m, kv)
    B = (qlen if qlen is not None else kvlen).shape[0]
    return snp.broadcast_to(m, (B, T, S))[:, None]


def _composite(q, k, v, bias, mask, scale, is_causal, window):
    """JAX's XLA formulation: logits in ``promote(dtype, float32)``, masked to a large
    negative number, softmax in float32, probabilities in the value dtype."""
    from spmd import nn

    B, T, N, H = get_aval(q).shape
    S, K = get_aval(k).shape[1:3]
    G = N // K
    ld = np.promote_types(get_aval(q).dtype, np.float32)
    qg = snp.reshape(q, (B, T, K, G, H))
    logits = snp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=ld)
    logits = logits * np.asarray(scale, ld)

    def grouped(x):
        b, n, t, s = get_aval(x).shape
        return snp.reshape(x, (b, 1, 1, t, s) if n == 1 else (b, K, G, t, s))

    if bias is not None:
        logits = (logits + grouped(bias)).astype(ld)
    keep = None if mask is None else grouped(mask)
    qpos, kpos = snp.arange(T)[:, None], snp.arange(S)[None, :]
    if is_causal:
        c = kpos <= qpos
        keep = c if keep is None else snp.logical_and(keep, c)
    if window is not None:
        w = snp.logical_and(qpos <= kpos + window[0], qpos >= kpos - window[1])
        keep = w if keep is None else snp.logical_and(keep, w)
    if keep is not None:
        logits = snp.where(keep, logits, large_negative(ld))
    logits = logits.astype(np.float32)
    probs = nn.softmax(logits, axis=-1).astype(get_aval(k).dtype)
    out = snp.einsum("bkgts,bskh->btkgh", probs, v)
    lse = nn.logsumexp(logits, axis=-1)
    return snp.reshape(out, (B, T, N, H)), snp.reshape(lse, (B, N, T))
