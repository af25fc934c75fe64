"""Samplers built on other samplers: gamma (and beta, dirichlet), poisson,
multivariate normal, orthogonal matrices; JAX's algorithms, so the same key gives
JAX's numbers (to float rounding).

``gamma`` is Marsaglia and Tsang's rejection method per element, each element
with its own key (``split(key, a.size)``), its loops ``while_loop``s batched with
``vmap``; ``poisson`` is Knuth's method for ``lam < 10`` and Hormann's
transformed rejection (PTRS) above, both as ``while_loop``s over the whole array.
"""

from __future__ import annotations

import numpy as np

import spmd.numpy as snp
from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad import stop_gradient
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.special import lgamma
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.numpy import linalg
from spmd.random.keys import _check_key, split
from spmd.random.samplers import (_check_param_shape, _float_dtype, _shape, exponential,
                                  normal, uniform)
from spmd.vectorize import vmap


def _param(x, dtype):
    x = snp.asarray(x) if not isinstance(x, Tracer) else x
    return ew.convert(x, dtype) if get_aval(x).dtype != dtype else x


def _gamma_one(key, alpha, log_space):
    """One gamma(alpha) sample from one key (JAX's ``_gamma_one``)."""
    # spmd.lax here, not above: it loads the partitioner, which import spmd.random does
    # not need (the same in the Poisson samplers below).
    from spmd.lax import while_loop

    dtype = get_aval(alpha).dtype
    c_ = lambda v: np.array(v, dtype)  # noqa: E731
    zero, one = c_(0), c_(1)
    boost_mask = alpha >= one
    alpha_orig = alpha
    alpha = snp.where(boost_mask, alpha, alpha + one)
    d = alpha - c_(1.0 / 3.0)
    c = c_(1.0 / 3.0) / snp.sqrt(d)

    def cond_fn(s):
        _, X, V, U = s
        return (U >= one - c_(0.0331) * (X * X)) & \
            (snp.log(U) >= X * c_(0.5) + d * (one - V + snp.log(V)))

    def body_fn(s):
        def next_kxv(kxv):
            k, sub = split(kxv[0])
            x = normal(sub, (), dtype)
            return k, x, one + x * c

        k, x_key, u_key = split(s[0], 3)
        _, x, v = while_loop(lambda kxv: kxv[2] <= zero, next_kxv,
                             (x_key, snp.zeros_like(alpha), snp.full_like(alpha, -1.0)))
        return k, x * x, v * v * v, uniform(u_key, (), dtype)

    key, sub = split(key)
    _, _, V, _ = while_loop(cond_fn, body_fn, (key, snp.zeros_like(alpha),
                                               snp.ones_like(alpha),
                                               snp.full_like(alpha, 2.0)))
    if log_space:
        log_samples = -exponential(sub, (), dtype)
        log_boost = snp.where(boost_mask | (log_samples == zero), zero,
                              log_samples * (one / alpha_orig))
        return snp.log(d) + snp.log(V) + log_boost
    samples = one - uniform(sub, (), dtype)
    boost = snp.where(boost_mask, one, snp.power(samples, one / alpha_orig))
    return d * V * boost


def _gamma(key, a, shape, dtype, log_space, name):
    _check_key(f"spmd.random.{name}", key, single=True)
    dtype = _float_dtype(dtype, name)
    a = _param(a, dtype)
    shape = tuple(np.shape(a)) if shape is None else _shape(shape, name)
    _check_param_shape(name, shape, np.shape(a))
    a = snp.broadcast_to(stop_gradient(a), shape)
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0:
        return snp.zeros(shape, dtype)
    keys = split(key, size)
    out = vmap(lambda k, al: _gamma_one(k, al, log_space))(keys, snp.reshape(a, (size,)))
    return snp.reshape(out, shape)


def gamma(key, a, shape=None, dtype=None):
    """Gamma(a, 1) floats (no gradient with respect to ``a``: see docs/random.md)."""
    return _gamma(key, a, shape, dtype, False, "gamma")


def loggamma(key, a, shape=None, dtype=None):
    """``log`` of Gamma(a, 1) floats, accurate for small ``a``."""
    return _gamma(key, a, shape, dtype, True, "loggamma")


def beta(key, a, b, shape=None, dtype=None):
    """Beta(a, b) floats, from two log-gamma samples."""
    dtype = _float_dtype(dtype, "beta")
    a, b = _param(a, dtype), _param(b, dtype)
    if shape is None:
        shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    shape = _shape(shape, "beta")
    _check_param_shape("beta", shape, np.shape(a), np.shape(b))
    ka, kb = split(key)
    la = loggamma(ka, snp.broadcast_to(a, shape), shape, dtype)
    lb = loggamma(kb, snp.broadcast_to(b, shape), shape, dtype)
    m = snp.maximum(la, lb)
    ga, gb = snp.exp(la - m), snp.exp(lb - m)
    return ga / (ga + gb)


def dirichlet(key, alpha, shape=None, dtype=None):
    """Dirichlet(alpha) vectors along the last axis (a softmax of log-gamma samples)."""
    from spmd.nn import softmax  # here: spmd.nn imports spmd.random

    dtype = _float_dtype(dtype, "dirichlet")
    alpha = _param(alpha, dtype)
    ashape = tuple(np.shape(alpha))
    if not ashape:
        raise ShapeError("spmd.random.dirichlet: alpha must have at least one dimension "
                         "(the categories)")
    shape = ashape[:-1] if shape is None else _shape(shape, "dirichlet")
    _check_param_shape("dirichlet", shape, ashape[:-1])
    full = shape + ashape[-1:]
    return softmax(loggamma(key, snp.broadcast_to(alpha, full), full, dtype), -1)


def _poisson_knuth(key, lam, shape, dtype, max_iters):
    from spmd.lax import while_loop

    def body(c):
        i, k, rng, log_prod = c
        rng, sub = split(rng)
        k = snp.where(log_prod > -lam, k + 1, k)
        return i + 1, k, rng, log_prod + snp.log(uniform(sub, shape, np.float32))

    def cond(c):
        return snp.any(c[3] > -lam) & (c[0] < max_iters)

    init = (np.int32(0), snp.zeros(shape, dtype), key, snp.zeros(shape, np.float32))
    k = while_loop(cond, body, init)[1]
    return ew.convert(k - 1, dtype)


def _poisson_rejection(key, lam, shape, dtype, max_iters):
    from spmd.lax import while_loop

    fd = get_aval(lam).dtype
    c_ = lambda v: np.array(v, fd)  # noqa: E731
    log_lam = snp.log(lam)
    b = c_(0.931) + c_(2.53) * snp.sqrt(lam)
    a = c_(-0.059) + c_(0.02483) * b
    inv_alpha = c_(1.1239) + c_(1.1328) / (b - c_(3.4))
    v_r = c_(0.9277) - c_(3.6224) / (b - c_(2))

    def body(c):
        i, k_out, accepted, key = c
        key, k0, k1 = split(key, 3)
        u = uniform(k0, shape, fd) - c_(0.5)
        v = uniform(k1, shape, fd)
        us = c_(0.5) - snp.abs(u)
        k = snp.floor((c_(2) * a / us + b) * u + lam + c_(0.43))
        s = snp.log(v * inv_alpha / (a / (us * us) + b))
        t = -lam + k * log_lam - lgamma(k + c_(1))
        accept1 = (us >= c_(0.07)) & (v <= v_r)
        reject = (k < c_(0)) | ((us < c_(0.013)) & (v > us))
        accept = accept1 | (~reject & (s <= t))
        return i + 1, snp.where(accept, k, k_out), accepted | accept, key

    def cond(c):
        return snp.any(~c[2]) & (c[0] < max_iters)

    init = (np.int32(0), snp.full(shape, -1.0, fd), snp.zeros(shape, bool), key)
    return ew.convert(while_loop(cond, body, init)[1], dtype)


def poisson(key, lam, shape=None, dtype=None):
    """Poisson(lam) integers (Knuth below 10, transformed rejection above, as JAX)."""
    _check_key("spmd.random.poisson", key, single=True)
    dtype = dtypes.canonicalize(dtypes.default_int() if dtype is None else dtype)
    if not dtypes.is_int(dtype):
        raise DTypeError(f"spmd.random.poisson: dtype={dtype} must be an integer dtype")
    lam = stop_gradient(_param(lam, np.float32))
    shape = tuple(np.shape(lam)) if shape is None else _shape(shape, "poisson")
    _check_param_shape("poisson", shape, np.shape(lam))
    lam = snp.broadcast_to(lam, shape)
    use_knuth = snp.isnan(lam) | (lam < np.float32(10))
    lam_knuth = snp.where(use_knuth, lam, np.float32(0))
    lam_rej = snp.where(use_knuth, np.float32(1e5), lam)
    max_iters = np.iinfo(dtype).max
    knuth = _poisson_knuth(key, lam_knuth, shape, dtype, max_iters)
    rej = _poisson_rejection(key, lam_rej, shape, dtype, max_iters)
    out = snp.where(use_knuth, knuth, rej)
    return snp.where(lam == np.float32(0), snp.zeros_like(out), out)


def multivariate_normal(key, mean, cov, shape=None, dtype=None, method: str = "cholesky"):
    """Normal vectors with mean ``mean`` (``[..., n]``) and covariance ``cov`` (``[..., n, n]``)."""
    if method not in ("cholesky", "eigh", "svd"):
        raise ArgumentError(f"spmd.random.multivariate_normal: method={method!r}; use "
                            "'cholesky', 'eigh' or 'svd'")
    dtype = _float_dtype(dtype, "multivariate_normal")
    mean, cov = _param(mean, dtype), _param(cov, dtype)
    ms, cs = tuple(np.shape(mean)), tuple(np.shape(cov))
    if len(ms) < 1 or len(cs) < 2 or cs[-2:] != (ms[-1], ms[-1]):
        raise ShapeError(f"spmd.random.multivariate_normal: mean shape {ms} and cov shape "
                         f"{cs} must be [..., n] and [..., n, n]")
    if shape is None:
        shape = np.broadcast_shapes(ms[:-1], cs[:-2])
    shape = _shape(shape, "multivariate_normal")
    _check_param_shape("multivariate_normal", shape, ms[:-1], cs[:-2])
    if method == "svd":
        u, s, _ = linalg.svd(cov)
        factor = u * snp.sqrt(s[..., None, :])
    elif method == "eigh":
        w, v = linalg.eigh(cov)
        factor = v * snp.sqrt(w[..., None, :])
    else:
        factor = linalg.cholesky(cov)
    z = normal(key, shape + ms[-1:], dtype)
    return mean + snp.einsum("...ij,...j->...i", factor, z)


def orthogonal(key, n: int, shape=(), dtype=None, m: int | None = None):
    """Uniformly distributed orthogonal ``n x n`` matrices (semi-orthogonal ``n x m``)."""
    for name, v in (("n", n), ("m", m)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 0):
            raise ArgumentError(f"spmd.random.orthogonal: {name}={v!r} must be a "
                                "non-negative int")
    m = n if m is None else int(m)
    shape = _shape(shape, "orthogonal")
    dtype = _float_dtype(dtype, "orthogonal")
    z = normal(key, shape + (max(n, m), min(n, m)), dtype)
    q, r = linalg.qr(z)
    k = min(n, m)  # r is k x k
    d = snp.sum(r * np.eye(k, dtype=dtype), axis=-1)  # its diagonal
    x = q * snp.expand_dims(snp.sign(d), -2)
    return snp.swapaxes(x, -1, -2) if n < m else x
