"""``conv_general_dilated``: N-d convolution with strides, padding, dilations and groups.

The primitive works in one layout: ``lhs`` is ``(N, C, *spatial)``, ``rhs`` is
``(O, I, *window)``, the output ``(N / batch_group_count, O, *spatial')``; the
``lax`` wrapper transposes other ``dimension_numbers`` into it.  As in XLA:

- ``feature_group_count = G``: ``C = G * I``; output features ``(g, o)`` read
  input features ``(g, :)`` only (``G = C`` is a depthwise convolution);
- ``batch_group_count = B``: the batch splits as ``(b, n)`` (``b`` major) and
  output features ``(b, o)`` sum over group ``b`` only (weight gradients of
  grouped convolutions are such convolutions); one of ``G``, ``B`` is 1.

The implementation dilates and pads the input, takes the strided windows
(``sliding_window_view``) and contracts them with the kernel in one matmul
per group.  Derivatives: the convolution is bilinear, and the transposes are
again convolutions (the input's: of the output cotangent with the flipped
kernel, the input strides becoming dilations; the kernel's: of the input with
the output cotangent), as in XLA's autodiff.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero, add_tangents, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.compiler import ops
from spmd.compiler.transforms.batching import move_to_front

conv_p = Primitive("conv_general_dilated", traits=())


def _dilate(n: int, d: int) -> int:
    return 0 if n == 0 else 1 + d * (n - 1)


def _out_spatial(in_sp, k_sp, strides, padding, lhs_dil, rhs_dil):
    out = []
    for n, k, s, (lo, hi), dl, dr in zip(in_sp, k_sp, strides, padding, lhs_dil, rhs_dil):
        span = _dilate(n, dl) + lo + hi - _dilate(k, dr)
        out.append(span // s + 1 if span >= 0 else 0)
    return tuple(out)


# -------------------------------------------------------------------- impl

@conv_p.def_impl
def _conv_impl(xp, x, w, *, window_strides, padding, lhs_dilation, rhs_dilation,
               feature_group_count, batch_group_count):
    nsp = x.ndim - 2
    out_sp = _out_spatial(x.shape[2:], w.shape[2:], window_strides, padding, lhs_dilation,
                          rhs_dilation)
    G, B = feature_group_count, batch_group_count
    N, C = x.shape[:2]
    O, I = w.shape[:2]
    nb, og = N // B, O // (G * B)
    if not all(out_sp) or not N or not O or not I:
        return xp.zeros((nb, O) + out_sp, dtype=x.dtype)
    if any(d > 1 for d in lhs_dilation):  # zeros between the input's elements
        big = xp.zeros(x.shape[:2] + tuple(_dilate(n, d) for n, d in
                                           zip(x.shape[2:], lhs_dilation)), dtype=x.dtype)
        big[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in lhs_dilation)] = x
        x = big
    # Negative padding crops; positive padding adds zeros.
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(padding, x.shape[2:]))
    x = x[(slice(None), slice(None)) + crop]
    if any(lo > 0 or hi > 0 for lo, hi in padding):
        x = xp.pad(x, [(0, 0), (0, 0)] + [(max(lo, 0), max(hi, 0)) for lo, hi in padding])
    extent = tuple(_dilate(k, d) for k, d in zip(w.shape[2:], rhs_dilation))
    win = xp.lib.stride_tricks.sliding_window_view(x, extent, axis=tuple(range(2, 2 + nsp)))
    win = win[(slice(None), slice(None)) +
              tuple(slice(None, s * (n - 1) + 1, s) for s, n in zip(window_strides, out_sp)) +
              tuple(slice(None, None, d) for d in rhs_dilation)]
    # win: (N, C, *out_sp, *window) -> (B*G, nb * P, I * K), one matmul per group.
    P, K = int(np.prod(out_sp)), int(np.prod(w.shape[2:]))
    win = win.reshape((B, nb, G, I) + out_sp + w.shape[2:])
    order = (0, 2, 1) + tuple(range(4, 4 + nsp)) + (3,) + tuple(range(4 + nsp, 4 + 2 * nsp))
    cols = xp.transpose(win, order).reshape(B * G, nb * P, I * K)
    ker = w.reshape(B * G, og, I * K)
    if B * G == 1:  # one 2-d GEMM (BLAS reads the transposed kernel in place)
        out = (cols[0] @ ker[0].T)[None]
    else:  # a stack of GEMMs on contiguous operands (numpy's fast batched path)
        out = xp.matmul(cols, xp.ascontiguousarray(xp.swapaxes(ker, 1, 2)))
    out = out.reshape((B * G, nb, P, og))
    out = xp.transpose(out, (1, 0, 3, 2)).reshape((nb, O) + out_sp)
    return xp.ascontiguousarray(out)


@conv_p.def_abstract_eval
def _conv_aval(x, w, *, window_strides, padding, lhs_dilation, rhs_dilation,
               feature_group_count, batch_group_count):
    name = "conv_general_dilated"
    if x.ndim != w.ndim or x.ndim < 2:
        raise ShapeError(f"{name}: lhs and rhs need the same rank (>= 2), got shapes "
                         f"{x.shape} and {w.shape}")
    if x.dtype != w.dtype:
        raise DTypeError(f"{name}: lhs and rhs dtypes differ ({x.dtype} and {w.dtype})")
    if dtypes.is_bool(x.dtype):
        raise DTypeError(f"{name}: bool operands are not supported; convert with .astype")
    nsp = x.ndim - 2
    for what, v in (("window_strides", window_strides), ("padding", padding),
                    ("lhs_dilation", lhs_dilation), ("rhs_dilation", rhs_dilation)):
        if len(v) != nsp:
            raise ArgumentError(f"{name}: {what}={v} needs one entry per spatial dimension "
                                f"({nsp})")
    for what, v in (("window_strides", window_strides), ("lhs_dilation", lhs_dilation),
                    ("rhs_dilation", rhs_dilation)):
        if any(s < 1 for s in v):
            raise ArgumentError(f"{name}: {what}={v} must be positive")
    G, B = feature_group_count, batch_group_count
    if G < 1 or B < 1 or (G > 1 and B > 1):
        raise ArgumentError(f"{name}: feature_group_count={G} and batch_group_count={B} must "
                            "be positive and one of them 1")
    (N, C), (O, I) = x.shape[:2], w.shape[:2]
    if C != I * G:
        raise ShapeError(f"{name}: the lhs has {C} features but the rhs expects {I} input "
                         f"features x feature_group_count {G} = {I * G}")
    if O % (G * B) or N % B:
        raise ShapeError(f"{name}: output features ({O}) must divide by the group count "
                         f"({G * B}) and the batch ({N}) by batch_group_count ({B})")
    out_sp = _out_spatial(x.shape[2:], w.shape[2:], window_strides, padding, lhs_dilation,
                          rhs_dilation)
    return ShapedArray((N // B, O) + out_sp, x.dtype, x.weak_type and w.weak_type)


def conv(x, w, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
         feature_group_count: int = 1, batch_group_count: int = 1):
    """The primitive in its own layout (``lhs`` NC..., ``rhs`` OI..., output NC...)."""
    nsp = len(np.shape(x)) - 2
    return bind(conv_p, x, w, window_strides=tuple(int(s) for s in window_strides),
                padding=tuple((int(lo), int(hi)) for lo, hi in padding),
                lhs_dilation=tuple(int(d) for d in (lhs_dilation or (1,) * nsp)),
                rhs_dilation=tuple(int(d) for d in (rhs_dilation or (1,) * nsp)),
                feature_group_count=int(feature_group_count),
                batch_group_count=int(batch_group_count))


# ------------------------------------------------------------- derivatives

@conv_p.def_jvp
def _conv_jvp(primals, tangents, **params):
    x, w = primals
    tx, tw = tangents
    out = bind(conv_p, x, w, **params)
    t = Zero(tangent_aval(get_aval(out)))
    if not isinstance(tx, Zero):
        t = add_tangents(t, bind(conv_p, tx, w, **params))
    if not isinstance(tw, Zero):
        t = add_tangents(t, bind(conv_p, x, tw, **params))
    return out, t


def _split_merge(x, axis, parts, into):
    """Split dimension ``axis`` of ``x`` as ``(parts, rest)`` and merge ``parts`` into
    dimension ``into`` (as its major part); returns the new array."""
    shape = list(get_aval(x).shape)
    split = shape[:axis] + [parts, shape[axis] // parts] + shape[axis + 1:]
    y = ops.structural.reshape(x, tuple(split))
    # After the split, the ``parts`` axis is at ``axis``; ``into`` shifts if after it.
    src, dst = axis, into + (1 if into > axis else 0)
    order = [i for i in range(len(split)) if i != src]
    order.insert(order.index(dst), src)
    y = ops.structural.transpose(y, tuple(order))
    merged = list(get_aval(y).shape)
    k = order.index(src)
    merged[k:k + 2] = [merged[k] * merged[k + 1]]
    return ops.structural.reshape(y, tuple(merged))


def _lhs_vjp_padding(in_sp, k_sp, strides, out_sp, padding, lhs_dil, rhs_dil):
    pads = []
    for n, k, s, o, (lo, _), dl, dr in zip(in_sp, k_sp, strides, out_sp, padding, lhs_dil,
                                           rhs_dil):
        before = _dilate(k, dr) - lo - 1
        after = _dilate(n, dl) + _dilate(k, dr) - 1 - _dilate(o, s) - before
        pads.append((before, after))
    return pads


def _rhs_vjp_padding(in_sp, k_sp, strides, out_sp, padding, lhs_dil, rhs_dil):
    pads = []
    for n, k, s, o, (lo, _), dl, dr in zip(in_sp, k_sp, strides, out_sp, padding, lhs_dil,
                                           rhs_dil):
        hi = (_dilate(o, s) - _dilate(n, dl)) + (_dilate(k, dr) - lo - 1)
        pads.append((lo, hi))
    return pads


@conv_p.def_transpose
def _conv_transpose(ct, x, w, *, window_strides, padding, lhs_dilation, rhs_dilation,
                    feature_group_count, batch_group_count):
    G, B = feature_group_count, batch_group_count
    x_aval = x.aval if is_undefined(x) else get_aval(x)
    w_aval = w.aval if is_undefined(w) else get_aval(w)
    nsp = x_aval.ndim - 2
    sp = tuple(range(2, 2 + nsp))
    swap = (1, 0) + sp
    if isinstance(ct, Zero):
        return [Zero(x.aval) if is_undefined(x) else None, Zero(w.aval) if is_undefined(w) else None]
    out_sp = get_aval(ct).shape[2:]
    if is_undefined(x):
        # dx = conv(ct, flipped kernel with O and I swapped), strides as input dilation.
        k = w
        if G > 1 or B > 1:
            k = _split_merge(k, 0, max(G, B), 1)   # (O, I) -> (O/g, g*I)
        k = ops.slicing.rev(ops.structural.transpose(k, swap), sp)
        pads = _lhs_vjp_padding(x_aval.shape[2:], w_aval.shape[2:], window_strides, out_sp,
                                padding, lhs_dilation, rhs_dilation)
        dx = conv(ct, k, lhs_dilation, pads, window_strides, rhs_dilation,
                  feature_group_count=max(G, B))
        if B > 1:  # output features (b, c) back to the batch (b, n)
            dx = _split_merge(dx, 1, B, 0)
        return [dx, None]
    # dw = conv(x with N and C swapped, ct with N and O swapped); groups trade places.
    pads = _rhs_vjp_padding(x_aval.shape[2:], w_aval.shape[2:], window_strides, out_sp,
                            padding, lhs_dilation, rhs_dilation)
    t = ops.structural.transpose
    dw = conv(t(x, swap), t(ct, swap), rhs_dilation, pads, lhs_dilation,
              window_strides, feature_group_count=B, batch_group_count=G)
    return [None, ops.structural.transpose(dw, swap)]


# ----------------------------------------------------------------- batching

@conv_p.def_batch
def _conv_batch(args, dims, **params):
    (x, w), (dx, dw) = args, dims
    G, B = params["feature_group_count"], params["batch_group_count"]
    if dx is not None and dw is not None:
        x, w = move_to_front(x, dx), move_to_front(w, dw)
        V = get_aval(x).shape[0]
        if B > 1:  # the vmapped axis becomes more batch groups: (V, b, n) and (V, b, o)
            out = bind(conv_p, _merge01(x), _merge01(w),
                       **{**params, "batch_group_count": V * B})
        else:      # ... or more feature groups: features (V, g, c), outputs (V, g, o)
            x = _merge01(ops.structural.transpose(x, (1, 0) + tuple(range(2, get_aval(x).ndim))),
                         at=1)
            out = bind(conv_p, x, _merge01(w), **{**params, "feature_group_count": V * G})
        n, o = get_aval(out).shape[:2]
        return ops.structural.reshape(out, (n, V, o // V) + get_aval(out).shape[2:]), 1
    if dx is not None:
        x = move_to_front(x, dx)
        V, N = get_aval(x).shape[:2]
        if B > 1:  # keep the batch groups major: (V, b, n) -> (b, V, n)
            x = ops.structural.reshape(x, (V, B, N // B) + get_aval(x).shape[2:])
            x = ops.structural.transpose(x, (1, 0) + tuple(range(2, get_aval(x).ndim)))
        out = bind(conv_p, _merge01(_merge01(x)) if B > 1 else _merge01(x), w, **params)
        nb = get_aval(out).shape[0] // V
        return ops.structural.reshape(out, (V, nb) + get_aval(out).shape[1:]), 0
    w = move_to_front(w, dw)
    V, O = get_aval(w).shape[:2]
    grp = G * B  # output features (grp, o): the vmapped axis goes inside the group
    w = ops.structural.reshape(w, (V, grp, O // grp) + get_aval(w).shape[2:])
    w = _merge01(_merge01(ops.structural.transpose(w, (1, 0) + tuple(range(2, get_aval(w).ndim)))))
    out = bind(conv_p, x, w, **params)
    n = get_aval(out).shape[0]
    out = ops.structural.reshape(out, (n, grp, V, O // grp) + get_aval(out).shape[2:])
    out = ops.structural.transpose(out, (0, 2, 1) + tuple(range(3, get_aval(out).ndim)))
    return ops.structural.reshape(out, (n, V, O) + get_aval(out).shape[4:]), 1


def _merge01(x, at: int = 0):
    """Merge dimensions ``at`` and ``at + 1`` of ``x`` (the first two by default)."""
    s = get_aval(x).shape
    return ops.structural.reshape(x, s[:at] + (s[at] * s[at + 1],) + s[at + 2:])
