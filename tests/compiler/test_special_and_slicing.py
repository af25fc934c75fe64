"""lax.erf/erf_inv/lgamma/digamma/polygamma against scipy.special (reference
values) and finite differences; lax.dynamic_*_in_dim, top_k, approx_max_k and
approx_min_k against numpy."""

import json
import math
import pathlib

import numpy as np
import pytest

import spmd
from spmd import lax
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.test_util import check_grads

special = pytest.importorskip("scipy.special")


# --------------------------------------------------------- special functions

def test_values_match_scipy_and_math():
    x = np.linspace(0.1, 4.0, 17)
    np.testing.assert_allclose(np.asarray(lax.erf(x)), [math.erf(v) for v in x], rtol=2e-6)
    np.testing.assert_allclose(np.asarray(lax.lgamma(x)), [math.lgamma(v) for v in x],
                               rtol=2e-6)
    np.testing.assert_allclose(np.asarray(lax.digamma(x)), special.digamma(x), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(lax.polygamma(2, x)), special.polygamma(2, x),
                               rtol=2e-6)
    u = np.linspace(-0.95, 0.95, 9)
    np.testing.assert_allclose(np.asarray(lax.erf(lax.erf_inv(u))), u, rtol=2e-6)
    # JAX-documented points: erf_inv(±1) = ±inf, digamma(1) = -Euler's gamma
    assert np.asarray(lax.erf_inv(np.array([1.0, -1.0]))).tolist() == [np.inf, -np.inf]
    np.testing.assert_allclose(float(lax.digamma(1.0)), -0.5772156649015329, rtol=2e-6)


def test_float32_stays_float32_under_jit():
    x = np.linspace(0.5, 2.0, 4, dtype=np.float32)
    for f in (lax.erf, lax.erf_inv, lax.lgamma, lax.digamma, lambda v: lax.polygamma(1, v)):
        arg = x / 4 if f is lax.erf_inv else x
        assert spmd.jit(f)(arg).dtype == np.float32
        assert f(arg).dtype == np.float32


@pytest.mark.parametrize("f,x", [
    (lax.erf, np.array([-1.3, 0.2, 2.0])),
    (lax.erf_inv, np.array([-0.7, 0.1, 0.9])),
    (lax.lgamma, np.array([0.3, 1.5, 4.0])),
    (lax.digamma, np.array([0.3, 1.5, 4.0])),
    (lambda v: lax.polygamma(1, v), np.array([0.7, 1.5, 4.0])),
], ids=["erf", "erf_inv", "lgamma", "digamma", "polygamma1"])
def test_derivatives(f, x):
    check_grads(f, (x,), order=2, rtol=1e-3, atol=1e-4)


def test_vmap_and_errors():
    x = np.linspace(0.5, 2, 6).reshape(2, 3)
    np.testing.assert_allclose(np.asarray(spmd.vmap(lax.lgamma)(x)), special.gammaln(x), rtol=1e-6)
    with pytest.raises(DTypeError):
        lax.erf(np.arange(3))
    with pytest.raises(ArgumentError, match="non-negative integer"):
        lax.polygamma(-1, x)
    with pytest.raises(ArgumentError, match="static"):
        spmd.jit(lambda m, v: lax.polygamma(m, v))(1, x)


# ------------------------------------------------------- erf_inv: one primitive

def _jax(name: str) -> np.ndarray:
    """Values recorded from JAX 0.10.2 by tests/random/record_jax_values.py."""
    fname = "jax_values_x64.json" if name.endswith("float64") else "jax_values.json"
    with open(pathlib.Path(__file__).parents[1] / "random" / fname) as f:
        e = json.load(f)[name]
    return np.array(e["values"], e["dtype"])


def _ulps32(a, b) -> np.ndarray:
    """Distance in float32 ulps (ordered integer images of the bit patterns)."""
    def ordered(v):
        i = np.asarray(v, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


@pytest.mark.parametrize("native", [True, False], ids=["c-kernel", "numpy"])
@pytest.mark.parametrize("jit", [False, True])
def test_erf_inv_float32_is_xlas(native, jit, monkeypatch):
    """float32 erf_inv is XLA's polynomial: JAX's values, whether eager or jitted,
    through the C kernel or numpy."""
    from spmd.compiler.ops import threefry_native

    if native and threefry_native.library() is None:
        pytest.skip("the C kernel is not built on this machine (no C compiler)")
    if not native:
        monkeypatch.setattr(threefry_native, "_lib", [None])
    x, want = _jax("erf_inv_in_float32"), _jax("erf_inv_float32")
    got = np.asarray((spmd.jit(lax.erf_inv) if jit else lax.erf_inv)(x))
    assert got.dtype == np.float32
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])  # +-inf at +-1
    # Up to 2 ulps: XLA rounds log1p and the polynomial's multiply-adds (fused on
    # its CPU backend) differently from numpy's separate operations.
    assert _ulps32(got[finite], want[finite]).max() <= 2
    # The bound tells the polynomial from a correctly rounded erfinv: scipy's float32
    # values are up to 40-odd ulps from JAX's near +-1.
    assert _ulps32(special.erfinv(x)[finite], want[finite]).max() > 20


def test_random_normal_goes_through_lax_erf_inv():
    """One primitive: the normal sampler's program binds lax.erf_inv's."""
    from spmd import random as sr
    from spmd.compiler.ops.special import erf_inv_p

    text = str(spmd.make_jaxpr(lambda k: sr.normal(k, (3,)))(sr.key(0)))
    assert f"{erf_inv_p.name}[" in text or f" {erf_inv_p.name} " in text, text


def test_erf_inv_float64_stays_accurate(x64):
    """float64 erf_inv is accurate to the last bits, where XLA's double-precision
    polynomial (JAX's values) is off by up to a relative 1e-10 near 1.  Oracle:
    erfc(erf_inv(x)) = 1 - x, exact for x >= 1/2, where erfc amplifies an error of
    erf_inv by only 2 y^2 (y = erf_inv(x) <= 6 here)."""
    x, jax_vals = _jax("erf_inv_in_float64"), _jax("erf_inv_float64")
    got = np.asarray(lax.erf_inv(x))
    assert got.dtype == np.float64
    finite = np.isfinite(jax_vals)
    np.testing.assert_array_equal(got[~finite], jax_vals[~finite])
    near = (x >= 0.5) & (x < 1)

    def err(y):
        return np.max(np.abs(special.erfc(y[near]) - (1 - x[near])) / (1 - x[near]))

    assert err(got) < 1e-13
    assert err(jax_vals) > 1e-9  # the oracle does tell the two apart
    # atol: XLA's CPU backend flushes subnormals to zero (JAX gives -0.0 for the
    # smallest subnormal input, where the accurate value is that subnormal).
    np.testing.assert_allclose(got[finite], jax_vals[finite], rtol=2e-10, atol=1e-300)


def test_erf_inv_narrow_floats_compute_in_float32():
    """float16 goes through the float32 polynomial and rounds once, as XLA does."""
    x = np.linspace(-0.99, 0.99, 11).astype(np.float16)
    got = np.asarray(lax.erf_inv(x))
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.asarray(lax.erf_inv(x.astype(np.float32))
                                                  ).astype(np.float16))


def test_erf_inv_rejects_integers():
    with pytest.raises(DTypeError, match="erf_inv"):
        lax.erf_inv(np.arange(3))


# ------------------------------------------------------------ *_in_dim

@pytest.mark.parametrize("jit", [False, True])
def test_dynamic_slice_and_index_in_dim(jit):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    wrap = spmd.jit if jit else (lambda f: f)
    got = wrap(lambda v, i: lax.dynamic_slice_in_dim(v, i, 3, axis=1))(x, 2)
    np.testing.assert_array_equal(np.asarray(got), x[:, 2:5])
    got = wrap(lambda v, i: lax.dynamic_slice_in_dim(v, i, 3, axis=1))(x, 5)  # clamped to 3
    np.testing.assert_array_equal(np.asarray(got), x[:, 3:6])
    got = wrap(lambda v, i: lax.dynamic_slice_in_dim(v, i, 2))(x, -2)       # from the end
    np.testing.assert_array_equal(np.asarray(got), x[2:4])
    got = wrap(lambda v, i: lax.dynamic_index_in_dim(v, i, axis=1, keepdims=False))(x, -1)
    np.testing.assert_array_equal(np.asarray(got), x[:, -1])
    got = wrap(lambda v, i: lax.dynamic_index_in_dim(v, i))(x, 1)
    np.testing.assert_array_equal(np.asarray(got), x[1:2])


@pytest.mark.parametrize("jit", [False, True])
def test_dynamic_update_slice_in_dim(jit):
    x = np.zeros((3, 5), np.float32)
    u = np.ones((3, 2), np.float32)
    f = lambda v, w, i: lax.dynamic_update_slice_in_dim(v, w, i, axis=1)  # noqa: E731
    got = (spmd.jit(f) if jit else f)(x, u, 1)
    want = x.copy()
    want[:, 1:3] = 1
    np.testing.assert_array_equal(np.asarray(got), want)
    got = (spmd.jit(f) if jit else f)(x, u, -1)  # -1 -> 4, clamped to 3
    want = x.copy()
    want[:, 3:5] = 1
    np.testing.assert_array_equal(np.asarray(got), want)


def test_in_dim_derivatives_and_errors():
    x = np.arange(6.0)
    check_grads(lambda v: lax.dynamic_slice_in_dim(v, 2, 3), (x,), order=1)
    check_grads(lambda v, u: lax.dynamic_update_slice_in_dim(v, u, 1, 0), (x, x[:2]), order=1)
    with pytest.raises(ArgumentError, match="scalar integer"):
        lax.dynamic_slice_in_dim(x, np.array([1, 2]), 2)
    with pytest.raises(ArgumentError, match="axis=2"):
        lax.dynamic_index_in_dim(x, 0, axis=2)


# -------------------------------------------------------------------- top-k

@pytest.mark.parametrize("jit", [False, True])
def test_top_k_matches_numpy(jit):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    vals, idx = (spmd.jit(lambda v: lax.top_k(v, 3)) if jit else lambda v: lax.top_k(v, 3))(x)
    want = np.argsort(-x, axis=-1, kind="stable")[:, :3]
    assert idx.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(idx), want)
    np.testing.assert_array_equal(np.asarray(vals), np.take_along_axis(x, want, -1))


def test_top_k_ties_ints_and_nan():
    vals, idx = lax.top_k(np.array([1, 3, 3, -2**31, 2], np.int32), 4)
    assert vals.tolist() == [3, 3, 2, 1] and idx.tolist() == [1, 2, 4, 0]
    vals, idx = lax.top_k(np.array([1.0, np.nan, 2.0], np.float32), 2)
    assert np.isnan(vals[0]) and idx.tolist() == [1, 2]
    vals, idx = lax.top_k(np.array([True, False, True]), 2)
    assert vals.tolist() == [True, True] and idx.tolist() == [0, 2]


def test_top_k_gradient_and_vmap():
    x = np.array([0.5, 2.0, -1.0, 3.0])
    g = spmd.grad(lambda v: (lax.top_k(v, 2)[0] * np.array([1.0, 10.0])).sum())(x)
    assert np.asarray(g).tolist() == [0.0, 10.0, 0.0, 1.0]
    check_grads(lambda v: lax.top_k(v, 2)[0], (x,), order=1)
    xs = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    v, i = spmd.vmap(lambda r: lax.top_k(r, 2))(xs)
    np.testing.assert_array_equal(np.asarray(i), np.argsort(-xs, -1, kind="stable")[:, :2])


def test_approx_max_min_k_are_exact():
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    vals, idx = lax.approx_max_k(x, 3, reduction_dimension=0, recall_target=0.9)
    want = np.argsort(-x, axis=0, kind="stable")[:3]
    np.testing.assert_array_equal(np.asarray(idx), want)
    np.testing.assert_array_equal(np.asarray(vals), np.take_along_axis(x, want, 0))
    vals, idx = lax.approx_min_k(x, 2)
    want = np.argsort(x, axis=-1, kind="stable")[:, :2]
    np.testing.assert_array_equal(np.asarray(idx), want)
    np.testing.assert_array_equal(np.asarray(vals), np.take_along_axis(x, want, -1))


def test_top_k_errors():
    with pytest.raises(ShapeError, match="k=5"):
        lax.top_k(np.ones(4), 5)
    with pytest.raises(ShapeError, match="at least one dimension"):
        lax.top_k(np.float32(1.0), 1)
    with pytest.raises(ArgumentError, match="static"):
        spmd.jit(lambda v, k: lax.top_k(v, k))(np.ones(4), 2)
