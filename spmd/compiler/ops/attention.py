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

The kernel works tile by tile, the score matrix never written whole
(:mod:`spmd.compiler.ops.attention_tiles`); its forward and jvp are in
:mod:`spmd.compiler.ops.attention_forward`, its backward in
:mod:`spmd.compiler.ops.attention_backward`, their softmax passes as compiled loops
in :mod:`spmd.compiler.ops.attention_jit`.  This module holds the primitives and
their rules.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.engine import loops
from spmd.compiler.transforms.ad_util import Zero, instantiate, is_undefined
from spmd.compiler.transforms.batching import bdim_size, broadcast_batch
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.ops import attention_jit, reduce, structural
from spmd.compiler.ops.attention_backward import backward
from spmd.compiler.ops.attention_forward import forward, tangent
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, ShapeError

attention_p = Primitive("attention", traits=(), multiple_results=True)
attention_tangent_p = Primitive("attention_tangent", traits=(), multiple_results=True)
attention_grad_p = Primitive("attention_grad", traits=(), multiple_results=True)


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


# ------------------------------------------------------------------ rules

def _params(scale, is_causal, window, has_bias, has_mask):
    return dict(scale=scale, is_causal=is_causal, window=window, has_bias=has_bias,
                has_mask=has_mask)


@attention_p.def_impl
def _attention_impl(xp, *args, scale, is_causal, window, has_bias, has_mask, jit=None):
    q, k, v, bias, mask, _ = _unpack(args, has_bias, has_mask)
    return forward(xp, q, k, v, bias, mask, scale=scale, is_causal=is_causal, window=window,
                   jit=jit)


@attention_tangent_p.def_impl
def _tangent_impl(xp, *args, scale, is_causal, window, has_bias, has_mask, tangents):
    q, k, v, bias, mask, rest = _unpack(args, has_bias, has_mask)
    out, lse, *ts = rest
    it = iter(ts)
    tq, tk, tv, tb = (next(it) if present else None for present in tangents)
    return tangent(xp, q, k, v, bias, mask, out, lse, tq, tk, tv, tb, scale=scale,
                   is_causal=is_causal, window=window)


@attention_grad_p.def_impl
def _grad_impl(xp, *args, scale, is_causal, window, has_bias, has_mask, wants, has_ct_lse,
               jit=None):
    q, k, v, bias, mask, rest = _unpack(args, has_bias, has_mask)
    out, lse, ct_out = rest[:3]
    ct_lse = rest[3] if has_ct_lse else None
    return backward(xp, q, k, v, bias, mask, out, lse, ct_out, ct_lse, wants=wants,
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
                x = structural.broadcast_in_dim(x, (V, B) + rest[1:],
                                                    (0,) + tuple(range(1, len(rest) + 1)))
            new.append(structural.reshape(x, (V * B,) + rest[1:]))
        outs = bind(prim, *new, **params)
        res = []
        for o, kind in zip(outs, outs_k):
            shape = tuple(np.shape(o))
            o = structural.reshape(o, (V, B) + shape[1:])
            if kind == "dbias" and bias_lead == 1:
                o = reduce.reduce_sum(o, (1,))
                o = structural.reshape(o, (V, 1) + shape[1:])
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
