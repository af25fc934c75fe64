"""The compiled loops' float32 exp and tanh (spmd/compiler/engine/kernel_math.py): ulps
against float64 over the whole range, and the special values where numpy puts them."""

from __future__ import annotations

import re

import numpy as np
import pytest

nb = pytest.importorskip("numba", reason="the compiled loops' functions are numba's")
km = pytest.importorskip("spmd.compiler.engine.kernel_math")


@nb.njit(nogil=True, error_model="numpy", fastmath={"contract"})
def _exp_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = km.expf(x[i])


@nb.njit(nogil=True, error_model="numpy", fastmath={"contract"})
def _tanh_loop(x, out):
    for i in range(x.shape[0]):
        out[i] = km.tanhf(x[i])


def _apply(loop, x):
    out = np.empty_like(x)
    loop(x, out)
    return out


def _ulps(got, exact):
    """Distance in float32 steps between ``got`` and the correctly rounded ``exact``."""
    def ordered(a):
        i = a.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(got) - ordered(exact))


def _samples():
    r = np.random.default_rng(0)
    return np.concatenate([
        r.uniform(-104, 89, 1 << 18), r.standard_normal(1 << 16) * 10,
        r.uniform(-1, 1, 1 << 16), r.uniform(-1e-3, 1e-3, 1 << 12),
        np.linspace(-0.7, 0.7, 4097)]).astype(np.float32)


def test_exp_is_within_one_ulp_over_the_normal_range():
    x = _samples()
    exact = np.exp(x.astype(np.float64))
    normal = (exact >= np.finfo(np.float32).tiny) & (exact <= np.finfo(np.float32).max)
    got = _apply(_exp_loop, x)
    assert _ulps(got[normal], exact[normal]).max() <= 1


def test_exp_rounds_through_the_subnormals_to_zero():
    x = np.linspace(-104, -87.4, 2001).astype(np.float32)
    exact = np.exp(x.astype(np.float64))
    got = _apply(_exp_loop, x)
    # Subnormal results: within two of their steps (the scaling rounds twice).
    assert np.abs(got - exact).max() <= 2 * np.finfo(np.float32).smallest_subnormal
    assert (got >= 0).all()


def test_tanh_is_within_two_ulps():
    x = _samples()
    got = _apply(_tanh_loop, x)
    assert _ulps(got, np.tanh(x.astype(np.float64))).max() <= 2


@pytest.mark.parametrize("name", ["exp", "tanh"])
def test_special_values_land_where_numpy_puts_them(name):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, 89.0, 1e30, -1e30,
                  -103.9, -104.5, 1e-30, -1e-30, 20.0, -20.0], np.float32)
    got = _apply(_exp_loop if name == "exp" else _tanh_loop, x)
    with np.errstate(over="ignore"):
        want = getattr(np, name)(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert _ulps(got[ok & (want != 0)], want[ok & (want != 0)]).max() <= 2
    np.testing.assert_array_equal(got[want == 0], 0)
    # The sign of a zero: tanh(-0.0) is -0.0.
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


def test_the_loops_are_vectorized():
    """Written for the vectorizer (a scalar libm call per element was 3-6x slower than
    numpy's float32 exp): the loop's machine code holds packed float32 arithmetic."""
    _apply(_exp_loop, np.ones(16, np.float32))
    asm = _exp_loop.inspect_asm(_exp_loop.signatures[0])
    assert re.search(r"\bv?(mulps|addps|vfmadd\w*ps)\b", asm)
