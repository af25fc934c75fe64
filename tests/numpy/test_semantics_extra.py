"""Regression tests for numpy/JAX semantics beyond the oracle tests: infinities and
gradients of logaddexp, exact integer powers, numpy's float divmod, static
arguments under jit, list indices and ``initial=`` on empty reductions."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import F32, I32, check, mode, run  # noqa: E402,F401

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import errors  # noqa: E402
from spmd.test_util import check_grads  # noqa: E402

INF = np.inf


def _grad2(f, a, b, jit=False):
    g = spmd.grad(f, argnums=(0, 1))
    g = spmd.jit(g) if jit else g
    return [float(v) for v in g(np.float32(a), np.float32(b))]


# ------------------------------------------------------------------ logaddexp

@pytest.mark.parametrize("a,b", [(-INF, -INF), (INF, INF), (INF, -INF), (-INF, 2.0),
                                 (3.0, INF), (1000.0, 1000.0), (-1e30, 5.0)])
def test_logaddexp_special_values(mode, a, b):
    x, y = np.array([a], np.float32), np.array([b], np.float32)
    check(snp.logaddexp, np.logaddexp, x, y, mode=mode, dtype=F32, rtol=1e-6, atol=0,
          upcast=False)


def test_logaddexp_nan_propagates(mode):
    x = np.array([np.nan, 1.0], np.float32)
    y = np.array([1.0, np.nan], np.float32)
    assert np.isnan(np.asarray(run(snp.logaddexp, (x, y), mode))).all()


@pytest.mark.parametrize("jit", [False, True])
def test_logaddexp_gradients_finite_at_ties_and_infinities(jit):
    f = snp.logaddexp
    # a tie splits evenly, as d/dx log(2 e^x) = 1/2 for each copy
    assert _grad2(f, 1.5, 1.5, jit) == [0.5, 0.5]
    assert _grad2(f, -INF, 2.0, jit) == [0.0, 1.0]
    assert _grad2(f, INF, -INF, jit) == [1.0, 0.0]
    for a, b in [(-INF, -INF), (INF, INF)]:
        assert np.isfinite(_grad2(f, a, b, jit)).all()


def test_logaddexp_check_grads():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(5), rng.standard_normal(5)
    check_grads(lambda a, b: snp.logaddexp(a, b).sum(), (a, b), order=2)
    check_grads(lambda a: snp.logaddexp(a, a).sum(), (a,), order=2)
    check_grads(lambda a: snp.logaddexp(a, 0.5).sum(), (a,), order=2)


def test_logaddexp_vmap():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    out = spmd.vmap(snp.logaddexp, in_axes=(0, None))(a, b)
    np.testing.assert_allclose(np.asarray(out), np.logaddexp(a, b), rtol=1e-6)


# -------------------------------------------------------------- integer power

def test_integer_power_array_exponents(mode):
    base = np.array([3, -3, 2, 2, 5, 7, -2, 0, 1], np.int32)
    exp = np.array([19, 19, 31, 32, 14, 0, 31, 5, 1000], np.int32)
    with np.errstate(all="ignore"):
        check(snp.power, np.power, base, exp, mode=mode, dtype=I32)
        check(lambda e: 3 ** e, lambda e: np.power(np.int32(3), e), exp, mode=mode, dtype=I32)


def test_integer_power_negative_array_exponents(mode):
    # numpy raises; under jit we cannot, so the result is 1 / x**n truncated to int
    base = np.array([1, -1, -1, 2, -3, 0], np.int32)
    exp = np.array([-3, -3, -4, -1, -2, -1], np.int32)
    out = run(snp.power, (base, exp), mode)
    np.testing.assert_array_equal(np.asarray(out), [1, -1, 1, 0, 0, 0])
    assert out.dtype == I32


def test_integer_power_negative_static_exponent_raises(mode):
    x = np.array([1, 2], np.int32)
    for fn in (lambda a: snp.power(a, -1), lambda a: a ** -2, lambda a: a ** np.int32(-1)):
        with pytest.raises(errors.DTypeError) as info:
            run(fn, (x,), mode)
        assert isinstance(info.value, TypeError) and "negative" in str(info.value)
    # floats take negative static powers
    check(lambda a: a ** -2, lambda a: a ** -2.0, np.array([2.0, 4.0], np.float32),
          mode=mode, dtype=F32)


def test_power_of_bools_is_integer(mode):
    b = np.array([True, False])
    out = run(snp.power, (b, b), mode)
    np.testing.assert_array_equal(np.asarray(out), [1, 1])
    assert out.dtype == I32
    assert run(lambda a: snp.power(a, 2), (b,), mode).dtype == I32


def test_integer_power_vmap_and_grad_of_float_factor():
    base = np.array([[2, 3], [5, -1]], np.int32)
    exp = np.array([[20, 13], [9, 7]], np.int32)
    np.testing.assert_array_equal(np.asarray(spmd.vmap(snp.power)(base, exp)),
                                  np.power(base, exp))
    g = spmd.grad(lambda x, n: (x * snp.power(n, n)).sum())(np.ones(3, np.float32),
                                                           np.array([1, 2, 3], np.int32))
    np.testing.assert_array_equal(np.asarray(g), [1.0, 4.0, 27.0])


# ------------------------------------------------------------ float divmod

def _bits_equal(got, want):
    got, want = np.asarray(got), np.asarray(want)
    both_nan = np.isnan(got) & np.isnan(want)
    same = (got == want) & (np.signbit(got) == np.signbit(want))
    return bool((same | both_nan).all())


def test_float_divmod_special_values_bit_exact(mode):
    # signed zeros, infinities and division by zero exactly as numpy
    x = np.array([0.0, -0.0, 1.0, -1.0, INF, 1.0, -1.0, 0.0, 1.0, 0.5, -0.5, np.nan, 3.0],
                 np.float32)
    y = np.array([-2.0, 2.0, INF, INF, 2.0, 0.0, 0.0, 0.0, -0.5, -2.0, -2.0, 1.0, -0.0],
                 np.float32)
    with np.errstate(all="ignore"):
        for fn, ref in ((snp.floor_divide, np.floor_divide), (snp.remainder, np.remainder)):
            got = run(fn, (x, y), mode)
            assert _bits_equal(got, ref(x, y)), (fn.__name__, np.asarray(got), ref(x, y))


def test_float_divmod_identity_random(mode):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(200) * 10).astype(np.float32)
    y = (rng.uniform(0.01, 3, 200) * rng.choice([-1, 1], 200)).astype(np.float32)
    q, r = run(lambda a, b: (a // b, a % b), (x, y), mode)
    np.testing.assert_array_equal(np.asarray(q), np.floor_divide(x, y))
    np.testing.assert_array_equal(np.asarray(r), np.remainder(x, y))


def test_float_remainder_gradients():
    rng = np.random.default_rng(3)
    x = rng.uniform(-5, 5, 6)
    y = rng.uniform(0.5, 2, 6) * rng.choice([-1, 1], 6)
    check_grads(lambda a, b: snp.remainder(a, b).sum(), (x, y), order=2)
    gx, gy = spmd.grad(lambda a, b: snp.remainder(a, b).sum(), argnums=(0, 1))(
        x.astype(np.float32), y.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(gx), np.ones(6))
    np.testing.assert_array_equal(np.asarray(gy), -np.floor(x.astype(np.float32) /
                                                             y.astype(np.float32)))
    gq = spmd.grad(lambda a, b: snp.floor_divide(a, b).sum())(x.astype(np.float32),
                                                              y.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(gq), np.zeros(6))


def test_float_divmod_vmap():
    x = np.array([[1.0, -1.0], [7.0, 0.3]], np.float32)
    y = np.array([0.1, -0.3], np.float32)
    q = spmd.vmap(snp.floor_divide, in_axes=(0, None))(x, y)
    r = spmd.vmap(snp.remainder, in_axes=(0, None))(x, y)
    np.testing.assert_array_equal(np.asarray(q), np.floor_divide(x, y))
    np.testing.assert_array_equal(np.asarray(r), np.remainder(x, y))


# --------------------------------------------------------------- reciprocal

def test_reciprocal_dtypes(mode):
    assert run(snp.reciprocal, (np.array([2], np.int32),), mode).dtype == F32
    assert run(snp.reciprocal, (np.array([True]),), mode).dtype == F32
    out = run(lambda x: snp.reciprocal(2) * x, (np.array([4.0], np.float32),), mode)
    assert out.dtype == F32 and float(out[0]) == 2.0  # a Python int stays weak


# ---------------------------------------------------- static arguments in jit

STATIC = [
    ("spmd.numpy.zeros", "shape", lambda x, n: snp.zeros(n)),
    ("spmd.numpy.zeros", "shape", lambda x, n: snp.zeros((n, 2))),
    ("spmd.numpy.ones", "shape", lambda x, n: snp.ones(n)),
    ("spmd.numpy.full", "shape", lambda x, n: snp.full((2, n), 1.0)),
    ("spmd.numpy.zeros_like", "shape", lambda x, n: snp.zeros_like(x, shape=n)),
    ("spmd.numpy.arange", "start", lambda x, n: snp.arange(n)),
    ("spmd.numpy.linspace", "num", lambda x, n: snp.linspace(0.0, 1.0, n)),
    ("spmd.numpy.eye", "N", lambda x, n: snp.eye(n)),
    ("spmd.numpy.eye", "k", lambda x, n: snp.eye(3, k=n)),
    ("spmd.numpy.reshape", "shape", lambda x, n: x.reshape(n, -1)),
    ("spmd.numpy.broadcast_to", "shape", lambda x, n: snp.broadcast_to(x, (n, 2, 3))),
    ("spmd.numpy.sum", "axis", lambda x, n: snp.sum(x, axis=n)),
    ("spmd.numpy.sum", "axis", lambda x, n: x.sum(axis=(n,))),
    ("spmd.numpy.mean", "axis", lambda x, n: snp.mean(x, axis=n)),
    ("spmd.numpy.max", "axis", lambda x, n: snp.max(x, axis=n)),
    ("spmd.numpy.argmax", "axis", lambda x, n: snp.argmax(x, axis=n)),
    ("spmd.numpy.cumsum", "axis", lambda x, n: snp.cumsum(x, axis=n)),
    ("spmd.numpy.sort", "axis", lambda x, n: snp.sort(x, axis=n)),
    ("spmd.numpy.expand_dims", "axis", lambda x, n: snp.expand_dims(x, n)),
    ("spmd.numpy.concatenate", "axis", lambda x, n: snp.concatenate([x, x], axis=n)),
    ("spmd.numpy.tile", "reps", lambda x, n: snp.tile(x, n)),
    ("spmd.numpy.repeat", "repeats", lambda x, n: snp.repeat(x, n)),
    ("spmd.numpy.roll", "shift", lambda x, n: snp.roll(x, n)),
    ("spmd.numpy.pad", "pad_width", lambda x, n: snp.pad(x, (n, 1))),
    ("spmd.numpy.split", "indices_or_sections", lambda x, n: snp.split(x, n)),
    ("spmd.numpy.tensordot", "axes", lambda x, n: snp.tensordot(x, x.T, n)),
    ("spmd.numpy.round", "decimals", lambda x, n: snp.round(x, n)),
]


@pytest.mark.parametrize("fname,arg,fn", STATIC, ids=[f"{c[0][11:]}-{c[1]}-{i}"
                                                      for i, c in enumerate(STATIC)])
def test_traced_static_argument_raises_naming_function_and_argument(fname, arg, fn):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(errors.ConcretizationError) as info:
        spmd.jit(fn)(x, 1)
    msg = str(info.value)
    assert fname in msg and arg in msg and "static_argnums" in msg, msg
    # the suggested fix works, and agrees with the eager call
    out = spmd.jit(fn, static_argnums=1)(x, 1)
    expected = fn(snp.asarray(x), 1)
    for o, e in zip(out if isinstance(out, list) else [out],
                    expected if isinstance(expected, list) else [expected]):
        np.testing.assert_allclose(np.asarray(o), np.asarray(e))


def test_traced_ddof_is_allowed(mode):
    x = np.arange(6, dtype=np.float32)
    check(lambda a, d: snp.var(a, ddof=d), lambda a, d: np.var(a, ddof=d), x, 1, mode=mode,
          dtype=F32)


# -------------------------------------------------------------- list indices

def test_list_index_raises_type_error(mode):
    x = np.arange(5, dtype=np.float32)
    for fn in (lambda a: a[[0, 1]], lambda a: a.at[[0, 1]].set(0.0),
               lambda a: a.at[[0]].get()):
        with pytest.raises(TypeError) as info:
            run(fn, (x,), mode)
        assert "tuple" in str(info.value) and "array" in str(info.value)
    # a list inside a tuple is an integer index array, as in numpy and JAX
    check(lambda a: a[[0, 3], ], lambda a: a[[0, 3], ], x, mode=mode, dtype=F32)


# ------------------------------------------------------- initial= in max/min

def test_max_min_initial_on_empty(mode):
    e = np.zeros((0, 3), np.float32)
    for axis in (None, 0, 1):
        for keepdims in (False, True):
            check(lambda a: snp.max(a, axis=axis, keepdims=keepdims, initial=-1.0),
                  lambda a: np.max(a, axis=axis, keepdims=keepdims, initial=-1.0),
                  e, mode=mode, dtype=F32)
            check(lambda a: snp.min(a, axis=axis, keepdims=keepdims, initial=2.0),
                  lambda a: np.min(a, axis=axis, keepdims=keepdims, initial=2.0),
                  e, mode=mode, dtype=F32)


def test_max_initial_keeps_array_dtype(mode):
    x = np.array([1, 2], np.int32)
    check(lambda a: snp.max(a, initial=5.7), lambda a: np.max(a, initial=5.7), x,
          mode=mode, dtype=I32)
    check(lambda a: snp.min(np.zeros(0, np.int32), initial=3) + a[0],
          lambda a: np.min(np.zeros(0, np.int32), initial=3) + a[0], x, mode=mode, dtype=I32)
    b = np.array([True, False])
    check(lambda a: snp.max(a, initial=False), lambda a: np.max(a, initial=False), b,
          mode=mode, dtype=np.bool_)
    with pytest.raises(errors.ArgumentError):
        run(lambda a: snp.max(a, initial=np.ones(2, np.float32)), (x,), mode)


def test_max_initial_traced_and_grad():
    x = np.array([1.0, 3.0], np.float32)
    out = spmd.jit(lambda a, i: snp.max(a, initial=i))(x, np.float32(5.0))
    assert float(out) == 5.0
    g = spmd.grad(lambda a: snp.max(a, initial=2.0))(x)
    np.testing.assert_array_equal(np.asarray(g), [0.0, 1.0])
