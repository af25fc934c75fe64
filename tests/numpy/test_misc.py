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
    assert not bool(snp.allclose([np.nan], [np.nan]))
    assert bool(snp.allclose([np.nan, 1.0], [np.nan, 1.0], equal_nan=True))
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
    f = lambda x: snp.insert(x, obj, values, axis)  # noqa: E731
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
    with pytest.raises(IndexOutOfBoundsError, match="obj=5"):
        snp.insert(a, 5, 1)
    with pytest.raises(ShapeError, match="do not fit"):
        snp.insert(a, [0, 1], [1, 2, 3])
    with pytest.raises(ArgumentError, match="integers"):
        snp.insert(a, [0.5], 1)
    with pytest.raises(ConcretizationError, match="obj"):
        spmd.jit(lambda i: snp.insert(a, i, 1))(1)
