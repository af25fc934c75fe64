"""spmd.nn: values against numpy formulas (eager and jit), stability on large
inputs, and derivatives against finite differences.

(Named test_spmd_nn.py: tests/numpy/test_nn.py has the basename test_nn.py, and
two test modules of one basename in package-less directories cannot both be
collected.)"""

import math

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import nn
from spmd.test_util import check_grads

rng = np.random.default_rng(0)
erf = np.vectorize(math.erf)


def np_logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def np_softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_softplus(x):
    return np.logaddexp(x, 0)


REFS = {
    "relu": (nn.relu, lambda x: np.maximum(x, 0)),
    "relu6": (nn.relu6, lambda x: np.clip(x, 0, 6)),
    "sigmoid": (nn.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "log_sigmoid": (nn.log_sigmoid, lambda x: -np_softplus(-x)),
    "softplus": (nn.softplus, np_softplus),
    "silu": (nn.silu, lambda x: x / (1 + np.exp(-x))),
    "swish": (nn.swish, lambda x: x / (1 + np.exp(-x))),
    "gelu": (nn.gelu, lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi)
                                                       * (x + 0.044715 * x ** 3)))),
    "gelu_exact": (lambda x: nn.gelu(x, approximate=False),
                   lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2)))),
    "elu": (nn.elu, lambda x: np.where(x > 0, x, np.expm1(x))),
    "leaky_relu": (nn.leaky_relu, lambda x: np.where(x >= 0, x, 0.01 * x)),
    "softmax": (nn.softmax, np_softmax),
    "softmax_axis0": (lambda x: nn.softmax(x, axis=0), lambda x: np_softmax(x, axis=0)),
    "softmax_axes": (lambda x: nn.softmax(x, axis=(0, 1)), lambda x: np_softmax(x, (0, 1))),
    "log_softmax": (nn.log_softmax, lambda x: x - np_logsumexp(x, -1, keepdims=True)),
    "logsumexp": (nn.logsumexp, np_logsumexp),
    "logsumexp_axis": (lambda x: nn.logsumexp(x, axis=1, keepdims=True),
                       lambda x: np_logsumexp(x, axis=1, keepdims=True)),
    "logsumexp_b": (lambda x: nn.logsumexp(x, axis=0, b=2.0),
                    lambda x: np_logsumexp(x, axis=0) + np.log(2.0)),
    "standardize": (nn.standardize,
                    lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                                       + 1e-5)),
}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", sorted(REFS))
def test_values(name, jit):
    f, ref = REFS[name]
    x = (rng.standard_normal((3, 4)) * 3).astype(np.float32)
    out = (spmd.jit(f) if jit else f)(x)
    assert isinstance(out, spmd.Array) and out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), ref(x.astype(np.float64)), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", sorted(REFS))
def test_large_inputs_do_not_overflow(name):
    f, ref = REFS[name]
    x = np.array([[1000.0, 0.0, -1000.0], [88.0, 89.0, -89.0]], np.float32)
    out = np.asarray(spmd.jit(f)(x))
    assert np.all(np.isfinite(out)), out
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(out, ref(x.astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_softmax_of_1000_and_0():
    np.testing.assert_array_equal(np.asarray(nn.softmax(np.array([1000.0, 0.0], np.float32))),
                                  [1.0, 0.0])
    out = nn.log_softmax(np.array([1000.0, 0.0], np.float32))
    np.testing.assert_allclose(np.asarray(out), [0.0, -1000.0])


def test_logsumexp_of_all_minus_inf_is_minus_inf():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]], np.float32)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the answer here
        out = nn.logsumexp(x, axis=1)
    np.testing.assert_array_equal(np.asarray(out), [-np.inf, 0.0])


@pytest.mark.parametrize("name", sorted(REFS))
def test_check_grads(name):
    f, _ = REFS[name]
    x = rng.standard_normal((3, 4)) * 2
    x[np.abs(x) < 1e-2] = 0.5  # away from the kinks of relu-like functions
    if name == "relu6":
        x[np.abs(x - 6) < 1e-2] = 5.0
    check_grads(f, (x,), order=2, modes=("fwd", "rev"))


def test_gradients_at_zero_follow_jax():
    g = lambda f: float(spmd.grad(f)(np.float32(0.0)))
    assert g(nn.relu) == 0.0
    assert g(nn.softplus) == pytest.approx(0.5)
    assert g(nn.sigmoid) == pytest.approx(0.25)
    assert g(nn.silu) == pytest.approx(0.5)


def test_gelu_backward_is_one_product_with_its_derivative():
    """gelu (tanh) has its derivative in closed form: the gradient program computes
    the tanh once and multiplies the cotangent by the derivative, against the
    derivative of the formula in float64 (and the value is the forward's bits)."""
    x = (rng.standard_normal((64, 32)) * 3).astype(np.float32)
    ct = rng.standard_normal((64, 32)).astype(np.float32)
    f = lambda a: snp.sum(nn.gelu(a) * ct)  # noqa: E731
    text = spmd.jit(spmd.grad(f)).lower(x).as_text(executed=True)
    # (as an equation, or inside a fused kernel's expression)
    assert text.count("tanh") == 1 and text.count("\n") < 25, text
    c, a = np.sqrt(2 / np.pi), 0.044715
    x64 = x.astype(np.float64)
    th = np.tanh(c * (x64 + a * x64 ** 3))
    want = (0.5 * (1 + th) + 0.5 * x64 * (1 - th ** 2) * c * (1 + 3 * a * x64 ** 2)) * ct
    np.testing.assert_allclose(np.asarray(spmd.jit(spmd.grad(f))(x)), want, rtol=2e-5,
                               atol=2e-6)
    value, _ = spmd.jit(spmd.value_and_grad(f))(x)
    assert float(value) == float(spmd.jit(f)(x))


def test_grads_of_large_inputs_are_finite():
    x = np.array([1000.0, 0.0, -1000.0], np.float32)
    for f in (nn.softplus, nn.sigmoid, nn.log_sigmoid, nn.elu,
              lambda a: nn.softmax(a)[0], lambda a: nn.logsumexp(a)):
        g = np.asarray(spmd.grad(lambda a: snp.sum(f(a)))(x))
        assert np.all(np.isfinite(g)), g


def test_softmax_grad_matches_formula():
    x = rng.standard_normal(5).astype(np.float32)
    ct = rng.standard_normal(5).astype(np.float32)
    s = np_softmax(x.astype(np.float64))
    g = spmd.grad(lambda a: snp.sum(nn.softmax(a) * ct))(x)
    np.testing.assert_allclose(np.asarray(g), s * (ct - np.dot(s, ct)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    labels = np.array([[0, 2, 5], [1, -1, 3]], np.int32)  # 5 and -1 are out of range
    out = spmd.jit(lambda l: nn.one_hot(l, 4, axis=axis))(labels)
    ref = np.moveaxis((labels[..., None] == np.arange(4)).astype(np.float32), -1, axis)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(out), ref)
    assert nn.one_hot(labels, 4, dtype=np.int32).dtype == np.int32


def test_vmap_softmax_and_one_hot():
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    out = spmd.vmap(lambda a: nn.softmax(a, axis=0), in_axes=1)(x)
    ref = np.stack([np_softmax(x[:, i].astype(np.float64), axis=0) for i in range(3)])
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)
    labels = np.array([[0, 1], [2, 0]], np.int32)
    out = spmd.vmap(lambda l: nn.one_hot(l, 3))(labels)
    np.testing.assert_array_equal(np.asarray(out), np.eye(3)[labels])


def test_int_inputs():
    x = np.array([-2, 0, 3], np.int32)
    assert nn.relu(x).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(nn.relu(x)), [0, 0, 3])
    assert nn.sigmoid(x).dtype == np.float32
    assert nn.softmax(x).dtype == np.float32


def test_logsumexp_is_only_in_nn():
    assert spmd.nn.logsumexp is nn.logsumexp
    with pytest.raises(NotImplementedError, match="return_sign"):
        nn.logsumexp(np.ones(3, np.float32), return_sign=True)
