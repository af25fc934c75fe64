"""``spmd.nn.initializers``: parameter initialisers with JAX's names and values.

Each builder returns ``init(key, shape, dtype=None, out_sharding=None)``; for
the same key, shape and dtype the values are those of ``jax.nn.initializers``
(they draw from ``spmd.random`` with JAX's recipes).  With ``out_sharding`` (or
under ``jit(out_shardings=...)``) each device draws only its own block of a
sharded parameter.

>>> import spmd
>>> w = glorot_normal()(spmd.random.key(0), (784, 512))
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

import spmd.numpy as snp
from spmd import random
from spmd.compiler.core import dtypes
from spmd.errors import ArgumentError, ShapeError
from spmd.random.sharded import with_out_sharding

Initializer = Callable[..., "snp.ndarray"]

__all__ = ["Initializer", "constant", "glorot_normal", "glorot_uniform", "he_normal",
           "he_uniform", "kaiming_normal", "kaiming_uniform", "lecun_normal",
           "lecun_uniform", "normal", "ones", "orthogonal", "truncated_normal", "uniform",
           "variance_scaling", "xavier_normal", "xavier_uniform", "zeros"]


def _dtype(dtype):
    return dtypes.canonicalize(dtypes.default_float() if dtype is None else dtype)


def _shape(shape, name):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0
            for s in shape):
        raise ShapeError(f"spmd.nn.initializers.{name}: shape={shape!r} must be a tuple of "
                         "non-negative ints")
    return tuple(int(s) for s in shape)


@with_out_sharding
def zeros(key, shape, dtype=None):
    """An initializer of zeros (``key`` is ignored)."""
    return snp.zeros(_shape(shape, "zeros"), _dtype(dtype))


@with_out_sharding
def ones(key, shape, dtype=None):
    """An initializer of ones (``key`` is ignored)."""
    return snp.ones(_shape(shape, "ones"), _dtype(dtype))


def constant(value, dtype=None) -> Initializer:
    """An initializer filling arrays with ``value``."""
    @with_out_sharding
    def init(key, shape, dtype=dtype):
        return snp.full(_shape(shape, "constant"), value, _dtype(dtype))

    return init


def uniform(scale=1e-2, dtype=None) -> Initializer:
    """Uniform in ``[0, scale)``."""
    @with_out_sharding
    def init(key, shape, dtype=dtype):
        d = _dtype(dtype)
        return random.uniform(key, _shape(shape, "uniform"), d) * np.array(scale, d)

    return init


def normal(stddev=1e-2, dtype=None) -> Initializer:
    """Normal with mean 0 and standard deviation ``stddev``."""
    @with_out_sharding
    def init(key, shape, dtype=dtype):
        d = _dtype(dtype)
        return random.normal(key, _shape(shape, "normal"), d) * np.array(stddev, d)

    return init


def truncated_normal(stddev=1e-2, dtype=None, lower=-2.0, upper=2.0) -> Initializer:
    """A standard normal truncated to ``(lower, upper)``, times ``stddev``."""
    @with_out_sharding
    def init(key, shape, dtype=dtype):
        d = _dtype(dtype)
        x = random.truncated_normal(key, lower, upper, _shape(shape, "truncated_normal"), d)
        return x * np.array(stddev, d)

    return init


def _prod(shape, axes):
    if isinstance(axes, (int, np.integer)):
        return shape[axes]
    return math.prod(shape[i] for i in axes)


def _compute_fans(shape, in_axis=-2, out_axis=-1, batch_axis=()):
    """(fan_in, fan_out) of a weight; axes outside in/out/batch are a receptive field."""
    if isinstance(in_axis, int) and in_axis == -2 and len(shape) <= 1:
        raise ShapeError(f"variance_scaling: a {len(shape)}-dimensional weight of shape "
                         f"{shape} has no input axis at -2; give a 2-D or larger shape, or "
                         "in_axis explicitly")
    in_size, out_size = _prod(shape, in_axis), _prod(shape, out_axis)
    field = math.prod(shape) / in_size / out_size / _prod(shape, batch_axis)
    return in_size * field, out_size * field


_MODES = ("fan_in", "fan_out", "fan_avg", "fan_geo_avg")
_DISTRIBUTIONS = ("truncated_normal", "normal", "uniform")


def variance_scaling(scale, mode: str, distribution: str, in_axis: int | Sequence[int] = -2,
                     out_axis: int | Sequence[int] = -1, batch_axis: int | Sequence[int] = (),
                     dtype=None) -> Initializer:
    """Samples with variance ``scale / n``, ``n`` the fan given by ``mode``.

    >>> init = variance_scaling(2.0, "fan_in", "normal")
    """
    if mode not in _MODES:
        raise ArgumentError(f"variance_scaling: mode={mode!r}; use one of {_MODES}")
    if distribution not in _DISTRIBUTIONS:
        raise ArgumentError(f"variance_scaling: distribution={distribution!r}; use one of "
                            f"{_DISTRIBUTIONS}")

    @with_out_sharding
    def init(key, shape, dtype=dtype):
        d = _dtype(dtype)
        shape = _shape(shape, "variance_scaling")
        fan_in, fan_out = _compute_fans(shape, in_axis, out_axis, batch_axis)
        den = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2,
               "fan_geo_avg": (fan_in * fan_out) ** 0.5}[mode]
        variance = np.array(scale / den, d)
        if distribution == "truncated_normal":
            # The standard deviation of a unit normal truncated to (-2, 2).
            std = np.sqrt(variance) / np.array(0.87962566103423978, d)
            return random.truncated_normal(key, -2, 2, shape, d) * std
        if distribution == "normal":
            return random.normal(key, shape, d) * np.sqrt(variance)
        return random.uniform(key, shape, d, -1) * np.sqrt(np.array(3, d) * variance)

    return init


def _family(scale, mode, distribution, name):
    def builder(in_axis=-2, out_axis=-1, batch_axis=(), dtype=None) -> Initializer:
        return variance_scaling(scale, mode, distribution, in_axis, out_axis, batch_axis,
                                dtype)

    builder.__name__ = name
    builder.__doc__ = (f"``variance_scaling({scale}, {mode!r}, {distribution!r})`` "
                       "(JAX's {name}).".replace("{name}", name))
    return builder


glorot_uniform = _family(1.0, "fan_avg", "uniform", "glorot_uniform")
glorot_normal = _family(1.0, "fan_avg", "truncated_normal", "glorot_normal")
lecun_uniform = _family(1.0, "fan_in", "uniform", "lecun_uniform")
lecun_normal = _family(1.0, "fan_in", "truncated_normal", "lecun_normal")
he_uniform = _family(2.0, "fan_in", "uniform", "he_uniform")
he_normal = _family(2.0, "fan_in", "truncated_normal", "he_normal")
xavier_uniform, xavier_normal = glorot_uniform, glorot_normal
kaiming_uniform, kaiming_normal = he_uniform, he_normal


def orthogonal(scale=1.0, column_axis: int = -1, dtype=None) -> Initializer:
    """Uniformly distributed orthogonal matrices (reshaped for larger shapes), times ``scale``."""
    @with_out_sharding
    def init(key, shape, dtype=dtype):
        d = _dtype(dtype)
        shape = _shape(shape, "orthogonal")
        if len(shape) < 2:
            raise ShapeError(f"orthogonal initializer: shape {shape} must have at least 2 "
                             "dimensions")
        if 0 in shape:
            return snp.zeros(shape, d)
        n_cols = shape[column_axis]
        n_rows = math.prod(shape) // n_cols
        q = random.orthogonal(key, n_rows, (), d, n_cols)
        rest = tuple(np.delete(np.array(shape), column_axis))
        q = snp.reshape(q, rest + (n_cols,))
        return np.array(scale, d) * snp.moveaxis(q, -1, column_axis)

    return init
