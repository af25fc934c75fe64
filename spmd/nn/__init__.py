"""``spmd.nn``: activations and helpers for neural networks (like ``jax.nn``).

Every function is a composition of ``spmd.numpy`` / ``spmd.lax`` operations, so
it traces, differentiates and batches like any other code.

>>> import spmd, spmd.numpy as snp
>>> spmd.nn.softmax(snp.array([1000.0, 0.0]))
Array([1., 0.], dtype=float32)
"""

from __future__ import annotations

import math

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
import spmd.numpy as snp
from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad import stop_gradient
from spmd.compiler.transforms.custom import custom_jvp
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.structural import iota
from spmd.compiler.core.trace import get_aval
from spmd.numpy._util import canonicalize_axes, promote_to_float, to_array

__all__ = ["initializers", "relu", "relu6", "sigmoid", "log_sigmoid", "softplus", "silu",
           "swish", "gelu", "elu", "leaky_relu", "softmax", "log_softmax", "logsumexp", "one_hot",
           "standardize", "dot_product_attention"]


def _float(x, fname):
    (x,) = promote_to_float(x, fname=f"spmd.nn.{fname}")
    return x


def _stop_gradient(x):
    # The max subtracted for stability carries no derivative (it cancels exactly).
    return stop_gradient(x)


def relu(x):
    """``max(x, 0)``, with derivative 0 at 0 (as jax.nn.relu).

    >>> relu(snp.array([-1.0, 2.0]))
    Array([0., 2.], dtype=float32)
    """
    x = to_array(x)
    return snp.where(snp.greater(x, 0), x, snp.zeros_like(x))


def relu6(x):
    """``min(max(x, 0), 6)``."""
    x = to_array(x)
    return snp.where(snp.greater(x, 6), snp.full_like(x, 6), relu(x))


def sigmoid(x):
    """The logistic function ``1 / (1 + exp(-x))``, stable for large ``|x|``."""
    return ew.logistic(_float(x, "sigmoid"))


def softplus(x):
    """``log(1 + exp(x))`` without overflow.

    Each branch gets an input that is safe for it, so the unused branch produces
    no inf/nan (whose zero cotangent would otherwise still poison the gradient).
    """
    x = _float(x, "softplus")
    pos = snp.greater(x, 0)
    zero = snp.zeros_like(x)
    xp_, xn = snp.where(pos, x, zero), snp.where(pos, zero, x)
    return snp.where(pos, xp_ + snp.log1p(snp.exp(-xp_)), snp.log1p(snp.exp(xn)))


def log_sigmoid(x):
    """``log(sigmoid(x)) = -softplus(-x)``."""
    return -softplus(-_float(x, "log_sigmoid"))


def silu(x):
    """``x * sigmoid(x)`` (also called swish)."""
    x = _float(x, "silu")
    return x * sigmoid(x)


swish = silu


def gelu(x, approximate: bool = True):
    """Gaussian error linear unit: the tanh approximation by default, as jax.nn.gelu.

    ``approximate=False`` gives ``x * Phi(x)`` with an erf accurate to ~1.5e-7.
    """
    x = _float(x, "gelu")
    if approximate:
        return _gelu_tanh(x)
    return 0.5 * x * (1 + _erf(x * (1 / math.sqrt(2))))


_GELU_C = math.sqrt(2 / math.pi)
_GELU_A = 0.044715


def _gelu_th(x, x2):
    """The tanh of gelu's approximation, given ``x2 = x * x``."""
    return snp.tanh(_GELU_C * (x + _GELU_A * (x2 * x)))


@custom_jvp
def _gelu_tanh(x):
    return 0.5 * x * (1 + _gelu_th(x, x * x))


@_gelu_tanh.defjvp
def _gelu_tanh_jvp(primals, tangents):
    # The derivative in closed form, from the forward's tanh: the backward is one
    # product with it, where differentiating the composition made some twenty passes
    # over the activation (the cube's product rule alone seven).  The value is the
    # forward's, computed by the same operations.
    (x,), (t,) = primals, tangents
    x2 = x * x
    th = _gelu_th(x, x2)
    half_x, one_th = 0.5 * x, 1 + th
    dy = 0.5 * one_th + half_x * (1 - th * th) * (_GELU_C + 3 * _GELU_A * _GELU_C * x2)
    return half_x * one_th, dy * t


# Abramowitz & Stegun 7.1.26: erf(x) ~ 1 - poly(t) exp(-x^2), t = 1/(1 + p|x|),
# |error| <= 1.5e-7 (numpy has no erf; this needs only existing primitives).
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x):
    ax = snp.abs(x)
    t = 1 / (1 + _AS_P * ax)
    poly = 0.0
    for a in reversed(_AS_A):
        poly = (poly + a) * t
    y = 1 - poly * snp.exp(-(ax * ax))
    return snp.where(snp.less(x, 0), -y, y)


def elu(x, alpha: float = 1.0):
    """``x`` for ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    x = _float(x, "elu")
    pos = snp.greater(x, 0)
    safe = snp.where(pos, snp.zeros_like(x), x)
    return snp.where(pos, x, alpha * snp.expm1(safe))


def leaky_relu(x, negative_slope: float = 1e-2):
    """``x`` for ``x >= 0``, else ``negative_slope * x``."""
    x = _float(x, "leaky_relu")
    return snp.where(snp.greater_equal(x, 0), x, negative_slope * x)


def _max_no_grad(x, axes):
    """The max over ``axes`` (kept as size-1 dims), finite, without derivative."""
    m = snp.max(x, axis=axes, keepdims=True)
    # An all -inf slice has max -inf; shifting by it would give nan.
    m = snp.where(snp.isfinite(m), m, snp.zeros_like(m))
    return _stop_gradient(m)


def softmax(x, axis=-1):
    """``exp(x) / sum(exp(x), axis)``, computed after subtracting the max (no overflow).

    >>> softmax(snp.array([1000.0, 0.0]))
    Array([1., 0.], dtype=float32)
    """
    x = _float(x, "softmax")
    axes = canonicalize_axes(axis, get_aval(x).ndim, "spmd.nn.softmax")
    e = snp.exp(x - _max_no_grad(x, axes))
    return e / snp.sum(e, axis=axes, keepdims=True)


def log_softmax(x, axis=-1):
    """``x - logsumexp(x, axis, keepdims=True)``, stable for large inputs."""
    x = _float(x, "log_softmax")
    axes = canonicalize_axes(axis, get_aval(x).ndim, "spmd.nn.log_softmax")
    shifted = x - _max_no_grad(x, axes)
    return shifted - snp.log(snp.sum(snp.exp(shifted), axis=axes, keepdims=True))


def logsumexp(a, axis=None, b=None, keepdims: bool = False, return_sign: bool = False):
    """``log(sum(b * exp(a), axis))`` computed stably (``b`` defaults to 1).

    >>> logsumexp(snp.array([1000.0, 1000.0]))
    Array(1000.6932, dtype=float32)
    """
    if return_sign:
        raise NotImplementedError("spmd.nn.logsumexp: return_sign=True is not supported")
    x = _float(a, "logsumexp")
    axes = canonicalize_axes(axis, get_aval(x).ndim, "spmd.nn.logsumexp")
    m = _max_no_grad(x, axes)
    e = snp.exp(x - m)
    if b is not None:
        e = e * b
    out = snp.log(snp.sum(e, axis=axes, keepdims=True)) + m
    return out if keepdims else snp.squeeze(out, axis=axes)


def one_hot(x, num_classes: int, *, dtype=np.float32, axis=-1):
    """One-hot encode integer labels: ``out[..., c] = (x[...] == c)``.

    Labels outside ``[0, num_classes)`` give all-zero rows.

    >>> one_hot(snp.array([0, 2]), 3)
    Array([[1., 0., 0.],
           [0., 0., 1.]], dtype=float32)
    """
    x = to_array(x)
    num_classes = int(num_classes)
    nd = get_aval(x).ndim + 1
    ax = canonicalize_axes(axis, nd, "spmd.nn.one_hot")[0]
    labels = snp.expand_dims(x, ax)
    shape = [1] * nd
    shape[ax] = num_classes
    classes = snp.reshape(iota(get_aval(x).dtype if dtypes.is_int(get_aval(x).dtype)
                               else dtypes.default_int(), num_classes), shape)
    return snp.equal(labels, classes).astype(dtype)


def standardize(x, axis=-1, mean=None, variance=None, epsilon: float = 1e-5):
    """``(x - mean) / sqrt(variance + epsilon)`` over ``axis``.

    ``mean`` and ``variance`` are computed from ``x`` when not given.
    """
    x = _float(x, "standardize")
    if mean is None:
        mean = snp.mean(x, axis=axis, keepdims=True)
    if variance is None:
        # E[x^2] - E[x]^2, as jax.nn.standardize (one pass over x).
        variance = snp.mean(x * x, axis=axis, keepdims=True) - mean * mean
    return (x - mean) / snp.sqrt(variance + epsilon)


# The initialisers draw from spmd.random (imported last: it builds on the above).
from spmd.nn import initializers  # noqa: E402,F401
from spmd.nn.attention import dot_product_attention  # noqa: E402,F401

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()
