"""spmd.nn activations and helpers against numpy formulas."""

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import F32, I32, check, mode, rand  # noqa: E402,F401

import spmd.nn  # noqa: E402

RTOL, ATOL = 1e-4, 1e-6


def np_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def np_logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def np_log_softmax(x, axis=-1):
    return x - np_logsumexp(x, axis=axis, keepdims=True)


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)], ids=str)
def test_one_hot(mode, shape):
    labels = rand(shape, I32, 1, 0, 6)
    check(lambda l: spmd.nn.one_hot(l, 6), lambda l: np.eye(6)[l], labels,
          mode=mode, dtype=F32, rtol=0, atol=0)


def test_one_hot_out_of_range_label_is_all_zeros(mode):
    labels = np.array([0, 2, -1, 3], np.int32)
    expected = np.zeros((4, 3))
    expected[0, 0] = expected[1, 2] = 1
    check(lambda l: spmd.nn.one_hot(l, 3), lambda l: expected, labels,
          mode=mode, dtype=F32, rtol=0, atol=0)


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax(mode, name, axis):
    x = rand((3, 4, 5), F32, 2) * 3
    ref = np_softmax if name == "softmax" else np_log_softmax
    check(lambda a: getattr(spmd.nn, name)(a, axis=axis), lambda a: ref(a, axis=axis),
          x, mode=mode, dtype=F32, rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_default_axis_and_sums_to_one(mode, name):
    x = rand((4, 7), F32, 3)
    ref = np_softmax if name == "softmax" else np_log_softmax
    out = check(getattr(spmd.nn, name), ref, x, mode=mode, dtype=F32, rtol=RTOL, atol=1e-6)
    p = np.asarray(out) if name == "softmax" else np.exp(np.asarray(out))
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)


def test_softmax_is_stable_for_large_inputs(mode):
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0]], np.float32)
    for name, ref in (("softmax", np_softmax), ("log_softmax", np_log_softmax)):
        out = check(getattr(spmd.nn, name), ref, x, mode=mode, dtype=F32, rtol=RTOL, atol=1e-6)
        assert np.all(np.isfinite(np.asarray(out)))
    out = check(lambda a: spmd.nn.logsumexp(a, axis=-1), lambda a: np_logsumexp(a, axis=-1),
                x, mode=mode, dtype=F32, rtol=1e-6, atol=1e-4)
    assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)], ids=repr)
def test_logsumexp(mode, axis, keepdims):
    x = rand((2, 3, 4), F32, 4) * 2
    check(lambda a: spmd.nn.logsumexp(a, axis=axis, keepdims=keepdims),
          lambda a: np_logsumexp(a, axis=axis, keepdims=keepdims),
          x, mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)


ACTIVATIONS = {
    "relu": lambda a: np.maximum(a, 0),
    "gelu": np_gelu_tanh,  # jax.nn.gelu defaults to approximate=True
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
}


@pytest.mark.parametrize("shape", [(), (7,), (3, 4)], ids=str)
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations(mode, name, shape):
    x = rand(shape, F32, 5) * 3
    check(getattr(spmd.nn, name), ACTIVATIONS[name], x, mode=mode, dtype=F32,
          rtol=RTOL, atol=ATOL)


def test_gelu_exact(mode):
    x = rand((3, 4), F32, 6) * 3
    check(lambda a: spmd.nn.gelu(a, approximate=False), np_gelu_erf, x,
          mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)
    check(lambda a: spmd.nn.gelu(a, approximate=True), np_gelu_tanh, x,
          mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)


def test_sigmoid_saturates_without_nan(mode):
    x = np.array([-100.0, -20.0, 0.0, 20.0, 100.0], np.float32)
    out = check(spmd.nn.sigmoid, ACTIVATIONS["sigmoid"], x, mode=mode, dtype=F32,
                rtol=RTOL, atol=ATOL)
    assert np.all(np.isfinite(np.asarray(out)))


def test_relu_int(mode):
    x = rand((3, 4), I32, 7)
    check(spmd.nn.relu, lambda a: np.maximum(a, 0), x, mode=mode, dtype=I32)
