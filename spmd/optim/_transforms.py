"""Gradient transformations and the optimizers built from them (optax's formulas).

Updates follow optax's sign convention: an optimizer's updates are *added* to the
parameters, so the learning-rate step scales by ``-learning_rate``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from spmd import tree_util
import spmd.numpy as snp
from spmd.compiler.core.array import Array
from spmd.shard.arrays.placing import make_array_from_callback
from spmd.shard.arrays.spec import NamedSharding
from spmd.optim._base import (GradientTransformation, OptimError, abs_sq, chain,
                              check_same_structure, global_norm, safe_int32_increment,
                              stateless)

_is_none = lambda x: x is None  # noqa: E731


def _map(f, *trees):
    """``f`` over the leaves of ``trees``; a ``None`` update (a frozen parameter) stays
    ``None``."""
    return tree_util.tree_map(lambda u, *r: None if u is None else f(u, *r), *trees,
                              is_leaf=_is_none)


def _zeros(params):
    """Zeros like each parameter, placed like it: the state of a parameter sharded over
    ``'data'`` is sharded the same way (ZeRO), each process making only its blocks."""
    return tree_util.tree_map(_zeros_like_placed, params)


def _zeros_like_placed(p):
    sharding = getattr(p, "sharding", None) if isinstance(p, Array) else None
    if isinstance(sharding, NamedSharding):
        dtype = p.dtype

        def block(index):
            shape = tuple(len(range(*s.indices(n))) for s, n in zip(index, p.shape))
            return np.zeros(shape, dtype)

        return make_array_from_callback(p.shape, sharding, block)
    return snp.zeros_like(p)


def _check_rate(name: str, value) -> None:
    if callable(value):
        return
    if not isinstance(value, (int, float, np.number)) or isinstance(value, bool):
        raise OptimError(f"{name}: the learning rate must be a number or a schedule "
                         f"(a function of the step count), got {type(value).__name__} {value!r}")
    if value < 0:
        raise OptimError(f"{name}: the learning rate must be >= 0, got {value!r}; updates "
                         "already point downhill (they are added to the parameters)")


def _check_decay(name: str, arg: str, value, hi_open: bool = True) -> None:
    ok = isinstance(value, (int, float, np.number)) and 0 <= value < 1 if hi_open else 0 <= value
    if not ok:
        raise OptimError(f"{name}: {arg} must be in [0, 1), got {value!r}")


# -------------------------------------------------------------- scaling

def scale(step_size: float) -> GradientTransformation:
    """Multiply the updates by ``step_size``."""
    return stateless(lambda u, p: _map(lambda g: g * step_size, u))


class ScaleByScheduleState(NamedTuple):
    count: Any  # int32 scalar: updates applied so far


def scale_by_schedule(schedule: Callable) -> GradientTransformation:
    """Multiply the updates by ``schedule(count)``; ``count`` starts at 0."""
    def init(params):
        return ScaleByScheduleState(snp.zeros((), snp.int32))

    def update(updates, state, params=None):
        factor = schedule(state.count)
        return (_map(lambda g: g * snp.asarray(factor).astype(snp.asarray(g).dtype), updates),
                ScaleByScheduleState(safe_int32_increment(state.count)))

    return GradientTransformation(init, update)


def scale_by_learning_rate(learning_rate, *, flip_sign: bool = True) -> GradientTransformation:
    """Multiply by ``-learning_rate`` (a number or a schedule)."""
    _check_rate("scale_by_learning_rate", learning_rate)
    m = -1 if flip_sign else 1
    if callable(learning_rate):
        return scale_by_schedule(lambda count: m * learning_rate(count))
    return scale(m * learning_rate)


# ------------------------------------------------------------- momentum

class TraceState(NamedTuple):
    trace: Any


def trace(decay: float, nesterov: bool = False) -> GradientTransformation:
    """Momentum: ``t = g + decay * t``; the update is ``t`` (or ``g + decay * t`` with
    ``nesterov``)."""
    _check_decay("trace", "decay", decay)

    def init(params):
        return TraceState(_zeros(params))

    def update(updates, state, params=None):
        new = _map(lambda g, t: g + decay * t, updates, state.trace)
        out = _map(lambda g, t: g + decay * t, updates, new) if nesterov else new
        return out, TraceState(tree_util.tree_map(lambda t, old: old if t is None else t, new,
                                                  state.trace, is_leaf=_is_none))

    return GradientTransformation(init, update)


# ----------------------------------------------------------------- adam

class ScaleByAdamState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def _bias_correction(moment, decay, count):
    correction = 1 - snp.asarray(decay, snp.float32) ** snp.asarray(count, snp.float32)
    return _map(lambda m: m / correction.astype(snp.asarray(m).dtype), moment)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                  eps_root: float = 0.0) -> GradientTransformation:
    """Adam's direction: ``m_hat / (sqrt(v_hat + eps_root) + eps)`` with bias-corrected
    moments ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``."""
    _check_decay("scale_by_adam", "b1", b1)
    _check_decay("scale_by_adam", "b2", b2)

    def init(params):
        return ScaleByAdamState(snp.zeros((), snp.int32), _zeros(params), _zeros(params))

    def update(updates, state, params=None):
        mu = _map(lambda g, m: (1 - b1) * g + b1 * m, updates, state.mu)
        # |g|^2: the second moment of a complex gradient is its squared magnitude.
        nu = _map(lambda g, v: (1 - b2) * abs_sq(g) + b2 * v, updates, state.nu)
        count = safe_int32_increment(state.count)
        mu_hat = _bias_correction(mu, b1, count)
        nu_hat = _bias_correction(nu, b2, count)
        # (Without eps_root, no pass adding 0.0: v is never -0.0, so the same bits.)
        root = (lambda v: snp.sqrt(v + eps_root)) if eps_root else snp.sqrt
        out = _map(lambda m, v: m / (root(v) + eps), mu_hat, nu_hat)
        return out, ScaleByAdamState(count, _keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


def _keep(new, old):
    """The new moments, keeping the old ones of frozen (``None``) parameters."""
    return tree_util.tree_map(lambda n, o: o if n is None else n, new, old, is_leaf=_is_none)


# ----------------------------------------------------------------- lion

class ScaleByLionState(NamedTuple):
    count: Any
    mu: Any


def scale_by_lion(b1: float = 0.9, b2: float = 0.99) -> GradientTransformation:
    """Lion's direction: ``sign((1 - b1) g + b1 m)``, then ``m = (1 - b2) g + b2 m``
    (Chen et al. 2023)."""
    _check_decay("scale_by_lion", "b1", b1)
    _check_decay("scale_by_lion", "b2", b2)

    def init(params):
        return ScaleByLionState(snp.zeros((), snp.int32), _zeros(params))

    def update(updates, state, params=None):
        out = _map(lambda g, m: snp.sign((1 - b1) * g + b1 * m), updates, state.mu)
        mu = _map(lambda g, m: (1 - b2) * g + b2 * m, updates, state.mu)
        return out, ScaleByLionState(safe_int32_increment(state.count), _keep(mu, state.mu))

    return GradientTransformation(init, update)


# ----------------------------------------------------------- weight decay

def _mask_tree(mask, params):
    """The boolean mask tree for ``params`` (``mask`` may be a function of them)."""
    m = mask(params) if callable(mask) else mask
    check_same_structure("the weight-decay mask", m, params)
    for path, leaf in tree_util.tree_flatten_with_path(m)[0]:
        if not isinstance(leaf, (bool, np.bool_)):
            raise OptimError(f"the weight-decay mask must hold Python booleans, got "
                             f"{type(leaf).__name__} {leaf!r} at {tree_util.keystr(path)}")
    return m


def add_decayed_weights(weight_decay: float = 0.0, mask=None) -> GradientTransformation:
    """Add ``weight_decay * params`` to the updates (decoupled weight decay), only where
    ``mask`` (a tree of booleans like the parameters, or a function returning one) is
    True.

    >>> add_decayed_weights(1e-4, mask=lambda p: {k: k != "bias" for k in p})
    """
    if not isinstance(weight_decay, (int, float, np.number)) or weight_decay < 0:
        raise OptimError(f"add_decayed_weights: weight_decay must be a number >= 0, got "
                         f"{weight_decay!r}")

    def fn(updates, params):
        if params is None:
            raise OptimError("add_decayed_weights needs the parameters: call "
                             "update(grads, state, params)")
        check_same_structure("the updates", updates, params)
        if mask is None:
            return _map(lambda g, p: g + weight_decay * p, updates, params)
        m = _mask_tree(mask, params)
        return _map(lambda g, p, on: g + weight_decay * p if on else g, updates, params, m)

    return stateless(fn)


# ------------------------------------------------------------- clipping

def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scale all updates by ``max_norm / norm`` when their global norm exceeds
    ``max_norm``."""
    if not isinstance(max_norm, (int, float, np.number)) or not max_norm > 0:
        raise OptimError(f"clip_by_global_norm: max_norm must be a number > 0, got "
                         f"{max_norm!r}")

    def fn(updates, params):
        norm = global_norm(updates)
        factor = snp.where(norm < max_norm, 1.0, max_norm / snp.maximum(norm, max_norm))
        return _map(lambda g: g * factor.astype(snp.asarray(g).dtype), updates)

    return stateless(fn)


# ------------------------------------------------------------- optimizers

def sgd(learning_rate, momentum: float | None = None,
        nesterov: bool = False) -> GradientTransformation:
    """Stochastic gradient descent, with optional (Nesterov) momentum.

    >>> opt = sgd(0.1, momentum=0.9)
    """
    _check_rate("sgd", learning_rate)
    parts = [trace(momentum, nesterov)] if momentum else []
    return chain(*parts, scale_by_learning_rate(learning_rate))


def adam(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0) -> GradientTransformation:
    """Adam (Kingma and Ba, 2015).

    >>> opt = adam(1e-3)
    """
    _check_rate("adam", learning_rate)
    return chain(scale_by_adam(b1, b2, eps, eps_root), scale_by_learning_rate(learning_rate))


def adamw(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          eps_root: float = 0.0, weight_decay: float = 1e-4, mask=None) -> GradientTransformation:
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019).

    >>> opt = adamw(1e-3, weight_decay=0.01, mask=lambda p: tree_map(lambda x: x.ndim > 1, p))
    """
    _check_rate("adamw", learning_rate)
    return chain(scale_by_adam(b1, b2, eps, eps_root), add_decayed_weights(weight_decay, mask),
                 scale_by_learning_rate(learning_rate))


def lion(learning_rate, b1: float = 0.9, b2: float = 0.99, weight_decay: float = 1e-3,
         mask=None) -> GradientTransformation:
    """Lion (Chen et al., 2023): the sign of an interpolated momentum, with decoupled
    weight decay.

    >>> opt = lion(1e-4)
    """
    _check_rate("lion", learning_rate)
    return chain(scale_by_lion(b1, b2), add_decayed_weights(weight_decay, mask),
                 scale_by_learning_rate(learning_rate))


