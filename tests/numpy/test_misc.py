"""isclose, allclose, isnan, isinf, copy, insert against numpy."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.errors import (ArgumentError, ConcretizationError, IndexOutOfBoundsError,
                         ShapeError)

SPECIAL = np.array([0.0, 1.0, 1.0 + 1e-7, 1.1, -np.inf, np.inf, np.nan, 1e-9], np.float32)


@pytest.mark.parametrize("equal_nan", [False, True])
@pytest.mark.parametrize("jit", [False, True])
def test_isclose_matches_numpy_on_special_values(equal_nan, jit):
    a, b = np.meshgrid(SPECIAL, SPECIAL)
    f = lambda x, y: snp.isclose(x, y, equal_nan=equal_nan)  # noqa: E731
    got = (spmd.jit(f) if jit else f)(a, b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(got), np.isclose(a, b, equal_nan=equal_nan))


def test_isclose_tolerances_broadcasting_and_ints():
    a = np.array([[1.0], [2.0]], np.float32)
    b = np.array([1.05, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(np.asarray(snp.isclose(a, b, rtol=0.1)),
                                  np.isclose(a, b, rtol=0.1))
    np.testing.assert_array_equal(np.asarray(snp.isclose(a, b, atol=1.0, rtol=0)),
                                  np.isclose(a, b, atol=1.0, rtol=0))
    assert bool(snp.isclose(3, 3)) and not bool(snp.isclose(3, 4))


def test_allclose():
    x = np.linspace(0, 1, 7).astype(np.float32)
    assert bool(snp.allclose(x, x + 1e-9)) and not bool(snp.allclose(x, x + 1e-3))
    nan, nan1 = np.array([np.nan]), np.array([np.nan, 1.0])
    assert not bool(snp.allclose(nan, nan))
    assert bool(snp.allclose(nan1, nan1, equal_nan=True))
    out = spmd.jit(snp.allclose)(x, x)
    assert out.shape == () and out.dtype == np.bool_ and bool(out)


def test_isnan_isinf():
    np.testing.assert_array_equal(np.asarray(snp.isnan(SPECIAL)), np.isnan(SPECIAL))
    np.testing.assert_array_equal(np.asarray(snp.isinf(SPECIAL)), np.isinf(SPECIAL))
    assert not np.asarray(snp.isnan(np.arange(3))).any()
    assert not np.asarray(snp.isinf(np.arange(3))).any()


def test_copy_is_a_new_buffer():
    x = snp.arange(4.0)
    y = snp.copy(x)
    assert y is not x and np.array_equal(np.asarray(y), np.asarray(x))
    assert not np.shares_memory(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(snp.copy([1, 2])), [1, 2])
    assert spmd.grad(lambda v: snp.copy(v).sum())(x).tolist() == [1.0] * 4
    with pytest.raises(ArgumentError, match="order='F'"):
        snp.copy(x, order="F")


INSERT_CASES = [
    (1, 9, None), (1, [7, 8], None), ([0, 2], [7, 8], None), ([2, 0], [7, 8], None),
    (1, [10, 20], 1), (1, [[10], [20]], 1), (0, [[1, 2], [3, 4]], 1),
    (1, [[10, 20, 30]], 0), ([1, 1], 5, 1), (slice(0, 2), [5, 6], 1), (-1, 4, 0),
    (3, 1, 1), (np.array([0, 3]), 0, -1),
]


@pytest.mark.parametrize("obj,values,axis", INSERT_CASES, ids=str)
@pytest.mark.parametrize("jit", [False, True])
def test_insert_matches_numpy(obj, values, axis, jit):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    f = lambda x: snp.insert(x, obj, np.asarray(values), axis)  # noqa: E731
    got = (spmd.jit(f) if jit else f)(a)
    want = np.insert(a, obj, values, axis)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), want)


def test_insert_casts_values_and_differentiates():
    assert snp.insert(np.arange(3, dtype=np.int32), 1, 2.7).tolist() == [0, 2, 1, 2]

    def f(x, v):
        return (snp.insert(x, [0, 2], v) * snp.arange(5.0)).sum()

    gx, gv = spmd.grad(f, argnums=(0, 1))(np.ones(3, np.float32), np.ones(2, np.float32))
    # output positions: v0 x0 x1 v1 x2
    assert gx.tolist() == [1.0, 2.0, 4.0] and gv.tolist() == [0.0, 3.0]


def test_insert_errors():
    a = np.arange(3)
    with pytest.raises(TypeError, match="list at position 1"):
        snp.insert(a, 0, [1, 2])
    with pytest.raises(IndexOutOfBoundsError, match="obj=5"):
        snp.insert(a, 5, 1)
    with pytest.raises(ShapeError, match="do not fit"):
        snp.insert(a, [0, 1], np.array([1, 2, 3]))
    with pytest.raises(ArgumentError, match="integers"):
        snp.insert(a, [0.5], 1)
    with pytest.raises(ConcretizationError, match="obj"):
        spmd.jit(lambda i: snp.insert(a, i, 1))(1)


# ------------------------------------------------------- convolve, correlate

@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("fn", ["convolve", "correlate"])
def test_convolve_correlate_match_numpy_for_all_length_pairs(fn, mode):
    rng = np.random.default_rng(0)
    for n in range(1, 7):
        for m in range(1, 7):
            a = rng.standard_normal(n).astype(np.float32)
            v = rng.standard_normal(m).astype(np.float32)
            got = getattr(snp, fn)(a, v, mode)
            want = getattr(np, fn)(a, v, mode)
            assert got.shape == want.shape, (n, m)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_convolve_jit_ints_and_gradient():
    a, v = np.array([1, 2, 3], np.int32), np.array([0, 1, 2], np.int32)
    got = spmd.jit(snp.convolve)(a, v)
    assert got.dtype == np.int32 and got.tolist() == np.convolve(a, v).tolist()
    from spmd.test_util import check_grads

    x, k = np.random.default_rng(1).standard_normal((2, 6))
    check_grads(lambda p, q: snp.convolve(p, q[:3], "same"), (x, k), order=2)
    check_grads(lambda p, q: snp.correlate(p, q[:4]), (x, k), order=1)


def test_convolve_errors():
    with pytest.raises(ShapeError, match="1-d"):
        snp.convolve(np.ones((2, 2)), np.ones(2))
    with pytest.raises(ShapeError, match="empty"):
        snp.convolve(np.ones(0), np.ones(2))
    with pytest.raises(ArgumentError, match="mode='circular'"):
        snp.convolve(np.ones(3), np.ones(2), "circular")
