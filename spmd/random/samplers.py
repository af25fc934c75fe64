"""Samplers built on random bits, with JAX's recipes (so the same key gives JAX's numbers).

Each sampler takes a single key (typed or legacy), a static ``shape`` and a
dtype; its values depend only on the key and each element's position in the
global array (the partitionable Threefry layout), never on a mesh.
"""

from __future__ import annotations

import math

import numpy as np

import spmd.numpy as snp
from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad import stop_gradient
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import threefry as tf
from spmd.compiler.ops.sort import argsort_along, sort_key_val
from spmd.compiler.ops.special import erf, erf_inv
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.random.keys import _check_key, split


def _shape(shape, name) -> tuple:
    """A static shape: a sequence of non-negative ints (an int is taken as ``(n,)``)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise ShapeError(f"spmd.random.{name}: shape={shape!r} must be a tuple of ints "
                         "(static: not a traced value), e.g. shape=(3, 4)")
    for s in shape:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ShapeError(f"spmd.random.{name}: shape={tuple(shape)!r} must hold "
                             "non-negative ints; got an entry {s!r}".replace("{s!r}", repr(s)))
    return tuple(int(s) for s in shape)


def _check_param_shape(name, shape, *param_shapes):
    """JAX's rule: parameters broadcast to ``shape`` (and not beyond it)."""
    try:
        out = np.broadcast_shapes(shape, *param_shapes)
    except ValueError:
        out = None
    if out != tuple(shape):
        raise ShapeError(f"spmd.random.{name}: shape={shape} must be a broadcast of the "
                         f"parameter shapes {list(param_shapes)}; pass shape=None or "
                         "a shape those broadcast to")


def _float_dtype(dtype, name):
    d = dtypes.default_float() if dtype is None else dtypes.check_dtype(dtype, name)
    if not dtypes.is_float(d):
        raise DTypeError(f"spmd.random.{name}: dtype={d} must be a float dtype "
                         "(float16, bfloat16, float32, float64 with x64)")
    if d in dtypes.FLOAT8 and name != "uniform":
        # Their 2 or 3 mantissa bits make the transforms after the uniform draw (erf_inv,
        # log1p, ...) meaningless, and truncated_normal's NaN: sample wider, then convert.
        raise DTypeError(f"spmd.random.{name}: dtype={d} is not supported (8-bit floats "
                         f"are for uniform only); sample in float32 and convert, e.g. "
                         f"spmd.random.{name}(key, shape).astype(snp.{d})")
    return dtypes.canonicalize(d)


def _bits(key, width, shape):
    base, _ = _check_key("spmd.random", key, single=True)
    return tf.random_bits(base, shape, bit_width=width)


def _to(x, dtype):
    """``x`` (a scalar or array) as an array of ``dtype``."""
    if isinstance(x, (int, float, bool, np.number, np.bool_)):
        return snp.asarray(np.asarray(x, dtype=dtype))
    if not (isinstance(x, Tracer) or hasattr(x, "shape")):
        raise DTypeError(f"expected a number or an array, got {type(x).__name__} ({x!r})")
    return ew.convert(x, dtype) if get_aval(x).dtype != dtype else x


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0):
    """Uniform floats in ``[minval, maxval)``.

    >>> uniform(key(42), (2,))  # doctest: +SKIP
    Array([0.48870957, 0.6797972 ], dtype=float32)
    """
    _check_key("spmd.random.uniform", key, single=True)
    shape = _shape(shape, "uniform")
    dtype = _float_dtype(dtype, "uniform")
    lo, hi = _to(minval, dtype), _to(maxval, dtype)
    _check_param_shape("uniform", shape, np.shape(lo), np.shape(hi))
    f = tf.random_unit_float(_bits(key, tf.unit_float_bits(dtype), shape), dtype)
    return snp.maximum(lo, f * (hi - lo) + lo)


def normal(key, shape=(), dtype=None):
    """Standard normal floats (``sqrt(2) * erf_inv(u)`` for ``u`` uniform in (-1, 1)).

    >>> normal(key(42), (2,))  # doctest: +SKIP
    Array([-0.02830462,  0.46713185], dtype=float32)
    """
    _check_key("spmd.random.normal", key, single=True)
    shape = _shape(shape, "normal")
    dtype = _float_dtype(dtype, "normal")
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype))
    u = uniform(key, shape, dtype, lo, np.array(1.0, dtype))
    return erf_inv(u) * np.array(np.sqrt(2), dtype)


def _erf(x):
    return erf(x)


def truncated_normal(key, lower, upper, shape=None, dtype=None):
    """Standard normal floats conditioned on ``lower < x < upper``."""
    _check_key("spmd.random.truncated_normal", key, single=True)
    dtype = _float_dtype(dtype, "truncated_normal")
    lower, upper = _to(lower, dtype), _to(upper, dtype)
    if shape is None:
        shape = np.broadcast_shapes(np.shape(lower), np.shape(upper))
    shape = _shape(shape, "truncated_normal")
    _check_param_shape("truncated_normal", shape, np.shape(lower), np.shape(upper))
    sqrt2 = np.array(np.sqrt(2), dtype)
    a, b = _erf(lower / sqrt2), _erf(upper / sqrt2)
    out = erf_inv(uniform(key, shape, dtype, a, b)) * sqrt2
    lo, hi = _open_bounds(lower, upper, dtype)
    return snp.clip(out, lo, hi)


def _open_bounds(lower, upper, dtype):
    """The closest floats inside ``(lower, upper)`` (JAX clips there); traced bounds
    are used as they are (no nextafter primitive yet)."""
    if isinstance(lower, Tracer) or isinstance(upper, Tracer):
        return stop_gradient(lower), stop_gradient(upper)
    lo = np.nextafter(np.asarray(lower, dtype), np.array(np.inf, dtype))
    hi = np.nextafter(np.asarray(upper, dtype), np.array(-np.inf, dtype))
    return snp.asarray(lo), snp.asarray(hi)


def bernoulli(key, p=0.5, shape=None):
    """Booleans that are True with probability ``p``."""
    _check_key("spmd.random.bernoulli", key, single=True)
    p = snp.asarray(p) if not isinstance(p, Tracer) else p
    if not dtypes.is_float(get_aval(p).dtype):
        p = ew.convert(p, dtypes.default_float())
    shape = np.shape(p) if shape is None else _shape(shape, "bernoulli")
    _check_param_shape("bernoulli", shape, np.shape(p))
    return uniform(key, shape, get_aval(p).dtype) < p


def rademacher(key, shape=(), dtype=None):
    """-1 or +1 with equal probability."""
    dtype = dtypes.canonicalize(dtypes.default_int() if dtype is None else dtype)
    b = ew.convert(bernoulli(key, 0.5, _shape(shape, "rademacher")), dtype)
    return ew.convert(b * 2 - 1, dtype)


def _clip_int(val, dtype):
    """``val`` (an integer array) converted to ``dtype``, clipped to its range."""
    vd = get_aval(val).dtype
    info_t, info_v = np.iinfo(dtype), np.iinfo(vd)
    lo, hi = max(info_t.min, info_v.min), min(info_t.max, info_v.max)
    return ew.convert(snp.clip(val, np.array(lo, vd), np.array(hi, vd)), dtype)


def _int_param(x, name, what):
    if isinstance(x, (bool, np.bool_)):
        raise DTypeError(f"spmd.random.randint: {what}={x!r} must be an integer")
    if isinstance(x, float):
        x = int(x)
    if isinstance(x, int):
        info = np.iinfo(dtypes.default_int())
        x = min(max(x, info.min), info.max)
        return snp.asarray(np.asarray(x, dtypes.default_int()))
    x = snp.asarray(x) if not isinstance(x, Tracer) else x
    if not dtypes.is_int(get_aval(x).dtype):
        x = ew.convert(x, dtypes.default_int())
    return x


def randint(key, shape, minval, maxval, dtype=None):
    """Integers uniform in ``[minval, maxval)``; where ``maxval <= minval`` every sample is
    ``minval`` (JAX's rule), and bounds outside ``dtype``'s range are clipped to it."""
    _check_key("spmd.random.randint", key, single=True)
    shape = _shape(shape, "randint")
    dtype = dtypes.canonicalize(dtypes.default_int() if dtype is None else dtype)
    if not dtypes.is_int(dtype):
        raise DTypeError(f"spmd.random.randint: dtype={dtype} must be an integer dtype")
    minval = _int_param(minval, "randint", "minval")
    maxval = _int_param(maxval, "randint", "maxval")
    _check_param_shape("randint", shape, np.shape(minval), np.shape(maxval))
    top = _clip_int(snp.asarray(np.array(np.iinfo(dtype).max, dtype)), get_aval(maxval).dtype)
    out_of_range = maxval > top
    minval, maxval = _clip_int(minval, dtype), _clip_int(maxval, dtype)
    nbits = np.dtype(dtype).itemsize * 8
    udt = tf.UINT_DTYPES[nbits]
    k1, k2 = split(key)
    higher, lower = _bits(k1, nbits, shape), _bits(k2, nbits, shape)
    span = ew.convert(maxval - minval, udt)
    one = np.array(1, udt)
    span = snp.where(maxval <= minval, one, span)
    span = snp.where(out_of_range & (maxval > minval), span + one, span)
    # (a * 2**k + b) % c == ((a % c) * (2**k % c) + b) % c, in unsigned arithmetic.
    # A span of 2**nbits wraps to 0; x % 0 is x there (XLA's rule), as in JAX.
    zero = span == np.array(0, udt)
    safe = snp.where(zero, one, span)

    def rem(x):
        return snp.where(zero, x, x % safe)

    mult = rem(snp.broadcast_to(np.array(2 ** (nbits // 2), udt), np.shape(span)))
    mult = rem(mult * mult)
    offset = rem(rem(higher) * mult + rem(lower))
    return snp.broadcast_to(minval + ew.convert(offset, dtype), shape)


def exponential(key, shape=(), dtype=None):
    """Exponential(1) floats: ``-log1p(-u)``."""
    u = uniform(key, _shape(shape, "exponential"), _float_dtype(dtype, "exponential"))
    return -snp.log1p(-u)


def laplace(key, shape=(), dtype=None):
    """Laplace(0, 1) floats."""
    dtype = _float_dtype(dtype, "laplace")
    epsneg = float(dtypes.finfo(dtype).epsneg)
    u = uniform(key, _shape(shape, "laplace"), dtype, -1.0 + epsneg, 1.0)
    return snp.sign(u) * snp.log1p(-snp.abs(u))


def logistic(key, shape=(), dtype=None):
    """Logistic(0, 1) floats: ``log(u) - log1p(-u)``."""
    dtype = _float_dtype(dtype, "logistic")
    u = uniform(key, _shape(shape, "logistic"), dtype, _tiny(dtype), 1.0)
    return snp.log(u) - snp.log1p(-u)


def _tiny(dtype):
    return float(dtypes.finfo(dtype).tiny)


def gumbel(key, shape=(), dtype=None, mode=None):
    """Gumbel(0, 1) floats: ``-log(-log(u))`` (JAX's default 'low' mode)."""
    if mode not in (None, "low"):
        raise ArgumentError(f"spmd.random.gumbel: mode={mode!r}; only 'low' (the default) "
                            "is implemented")
    dtype = _float_dtype(dtype, "gumbel")
    u = uniform(key, _shape(shape, "gumbel"), dtype, _tiny(dtype), 1.0)
    return -snp.log(-snp.log(u))


def categorical(key, logits, axis: int = -1, shape=None, replace: bool = True, mode=None):
    """Indices drawn with probabilities ``softmax(logits)`` along ``axis`` (Gumbel-max)."""
    _check_key("spmd.random.categorical", key, single=True)
    logits = snp.asarray(logits) if not isinstance(logits, Tracer) else logits
    lshape = tuple(np.shape(logits))
    if not lshape:
        raise ShapeError("spmd.random.categorical: logits must have at least one dimension")
    if not -len(lshape) <= axis < len(lshape):
        raise ArgumentError(f"spmd.random.categorical: axis={axis} is out of range for "
                            f"logits of shape {lshape}")
    ax = axis % len(lshape)
    batch = lshape[:ax] + lshape[ax + 1:]
    shape = batch if shape is None else _shape(shape, "categorical")
    if shape[len(shape) - len(batch):] != batch:
        raise ShapeError(f"spmd.random.categorical: shape={shape} must end with the logits' "
                         f"batch shape {batch}")
    prefix = shape[:len(shape) - len(batch)]
    dtype = get_aval(logits).dtype
    if not dtypes.is_float(dtype):
        logits = ew.convert(logits, dtypes.default_float())
        dtype = dtypes.default_float()
    if replace:
        neg = ax - len(lshape)
        gshape = list(batch)
        gshape.insert(ax, lshape[ax])
        g = gumbel(key, prefix + tuple(gshape), dtype, mode)
        lg = snp.reshape(logits, (1,) * len(prefix) + lshape)
        return snp.argmax(g + lg, axis=neg)
    k = math.prod(prefix)
    if k > lshape[ax]:
        raise ArgumentError(f"spmd.random.categorical: {k} samples without replacement "
                            f"exceed the {lshape[ax]} categories")
    scores = snp.moveaxis(logits + gumbel(key, lshape, dtype, mode), ax, -1)
    idx = _top_k_indices(scores, k)  # batch + (k,)
    idx = snp.moveaxis(idx, -1, 0)
    return snp.reshape(idx, shape)


def _top_k_indices(x, k):
    """Indices of the ``k`` largest along the last axis, largest first (stable on ties,
    as ``lax.top_k``)."""
    order = argsort_along(-x, len(np.shape(x)) - 1)
    return order[..., :k]


def _shuffle(key, x, axis):
    """JAX's shuffle: rounds of sorting by fresh 32-bit keys (enough rounds that ties
    are negligible)."""
    size = int(np.prod(np.shape(x), dtype=np.int64))
    rounds = int(np.ceil(3 * np.log(max(1, size)) / np.log(np.iinfo(np.uint32).max)))
    for _ in range(rounds):
        key, sub = split(key)
        _, x = sort_key_val(_bits(sub, 32, tuple(np.shape(x))), x, axis)
    return x


def permutation(key, x, axis: int = 0, independent: bool = False):
    """A random permutation of ``arange(x)`` (int ``x``) or of ``x`` along ``axis``."""
    _check_key("spmd.random.permutation", key, single=True)
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        if x < 0:
            raise ArgumentError(f"spmd.random.permutation: x={x} must be non-negative")
        return _shuffle(key, snp.arange(int(x)), 0)
    x = snp.asarray(x) if not isinstance(x, Tracer) else x
    nd = len(np.shape(x))
    if nd == 0:
        raise ShapeError("spmd.random.permutation: x must be an int or an array of rank >= 1")
    if not -nd <= axis < nd:
        raise ArgumentError(f"spmd.random.permutation: axis={axis} is out of range for "
                            f"x of shape {np.shape(x)}")
    axis %= nd
    if independent or nd == 1:
        return _shuffle(key, x, axis)
    ind = _shuffle(key, snp.arange(np.shape(x)[axis]), 0)
    return snp.take(x, ind, axis=axis)


def shuffle(key, x, axis: int = 0):
    """Shuffle ``x`` along ``axis`` independently per slice (JAX's deprecated ``shuffle``;
    prefer ``permutation(..., independent=True)``)."""
    return permutation(key, x, axis, independent=True)


def choice(key, a, shape=(), replace: bool = True, p=None, axis: int = 0):
    """Samples of ``a`` (or ``arange(a)`` for an int) along ``axis``, optionally weighted by ``p``."""
    _check_key("spmd.random.choice", key, single=True)
    shape = _shape(shape, "choice")
    if isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)):
        arr, n = None, int(a)
    else:
        arr = snp.asarray(a) if not isinstance(a, Tracer) else a
        if not np.shape(arr):
            raise ShapeError("spmd.random.choice: a must be an int or an array of rank >= 1")
        if not -len(np.shape(arr)) <= axis < len(np.shape(arr)):
            raise ArgumentError(f"spmd.random.choice: axis={axis} is out of range for a of "
                                f"shape {np.shape(arr)}")
        axis %= len(np.shape(arr))
        n = np.shape(arr)[axis]
    draws = math.prod(shape)
    if draws == 0:
        return snp.zeros(shape, dtypes.default_int() if arr is None else get_aval(arr).dtype)
    if n <= 0:
        raise ArgumentError(f"spmd.random.choice: a={a!r} is empty; it needs at least one "
                            "item unless no samples are taken")
    if not replace and draws > n:
        raise ArgumentError(f"spmd.random.choice: cannot take {draws} samples from {n} items "
                            "with replace=False; pass replace=True or a smaller shape")
    if p is None:
        if replace:
            ind = randint(key, shape, 0, n)
            res = ind if arr is None else snp.take(arr, ind, axis=axis)
        else:
            perm = permutation(key, n if arr is None else arr, axis)
            idx = (slice(None),) * (0 if arr is None else axis) + (slice(draws),)
            res = perm[idx]
    else:
        pa = snp.asarray(p) if not isinstance(p, Tracer) else p
        if not dtypes.is_float(get_aval(pa).dtype):
            pa = ew.convert(pa, dtypes.default_float())
        if tuple(np.shape(pa)) != (n,):
            raise ShapeError(f"spmd.random.choice: p has shape {np.shape(pa)}; it must be "
                             f"({n},), one probability per item of a along axis {axis}")
        if replace:
            cum = snp.cumsum(pa)
            r = cum[-1] * (1 - uniform(key, shape, get_aval(cum).dtype))
            ind = _searchsorted_left(cum, r)
        else:
            g = gumbel(key, (n,), get_aval(pa).dtype) + snp.log(pa)
            ind = _top_k_indices(g, draws)
        res = ind if arr is None else snp.take(arr, ind, axis=axis)
    if arr is None:
        return snp.reshape(res, shape)
    ashape = tuple(np.shape(arr))
    return snp.reshape(res, ashape[:axis] + shape + ashape[axis + 1:])


def _searchsorted_left(sorted_1d, v):
    """``searchsorted(sorted_1d, v, side='left')``: how many entries are ``< v``."""
    cmp = snp.expand_dims(v, -1) > sorted_1d
    return snp.sum(cmp.astype(dtypes.default_int()), axis=-1)
