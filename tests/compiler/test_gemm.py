"""``gemm_into`` (spmd/compiler/engine/gemm.py): ``out += a @ b`` in place through numpy's
OpenBLAS, against numpy's product and add, for every layout BLAS reads in place, the
ones it cannot (copied first), and the fallback."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from spmd.compiler.engine import gemm
from spmd.compiler.engine.gemm import gemm_into


def _case(rng, m, k, n, dtype, a_t=False, b_t=False):
    a = rng.normal(size=(k, m) if a_t else (m, k)).astype(dtype)
    b = rng.normal(size=(n, k) if b_t else (k, n)).astype(dtype)
    return (a.T if a_t else a), (b.T if b_t else b)


def _check(a, b, out):
    expected = out + np.matmul(a, b)
    got = gemm_into(a, b, out)
    assert got is out
    tol = 1e-5 if out.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True),
                                     (True, True)])
def test_it_adds_the_product_for_each_transposed_layout(dtype, a_t, b_t):
    rng = np.random.default_rng(0)
    a, b = _case(rng, 33, 17, 21, dtype, a_t, b_t)
    _check(a, b, rng.normal(size=(33, 21)).astype(dtype))


def test_strided_operands_are_copied_and_slabs_written_in_place():
    rng = np.random.default_rng(1)
    big = rng.normal(size=(40, 60)).astype(np.float32)
    a, b = big[::2, :30], big[:30, ::2]  # neither row nor column of unit stride
    buf = rng.normal(size=(3, 20, 30)).astype(np.float32)
    before = buf.copy()
    _check(a, b, buf[1])  # a slab of a larger buffer: only it changes
    np.testing.assert_array_equal(buf[0], before[0])
    np.testing.assert_array_equal(buf[2], before[2])


def test_stacks_of_one_matrix():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 8, 5)).astype(np.float32)
    g = rng.normal(size=(1, 8, 6)).astype(np.float32)
    out = rng.normal(size=(1, 5, 6)).astype(np.float32)
    expected = out + x.transpose(0, 2, 1) @ g
    gemm_into(x.transpose(0, 2, 1), g, out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    w = rng.normal(size=(5, 6)).astype(np.float32)  # (1, m, k) @ (k, n)
    out2 = rng.normal(size=(1, 8, 6)).astype(np.float32)
    expected2 = out2 + x @ w
    gemm_into(x, w, out2)
    np.testing.assert_allclose(out2, expected2, rtol=1e-5, atol=1e-5)


def test_empty_products_leave_the_sum():
    out = np.ones((3, 4), np.float32)
    gemm_into(np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32), out)
    np.testing.assert_array_equal(out, np.ones((3, 4), np.float32))
    empty = np.zeros((0, 4), np.float32)
    gemm_into(np.zeros((0, 2), np.float32), np.ones((2, 4), np.float32), empty)
    assert empty.shape == (0, 4)


@pytest.mark.parametrize("what", ["int", "mixed", "strided out", "no cblas"])
def test_what_blas_cannot_take_is_a_numpy_product_and_add(what, monkeypatch):
    rng = np.random.default_rng(3)
    a, b = _case(rng, 6, 4, 5, np.float32)
    out = rng.normal(size=(6, 5)).astype(np.float32)
    if what == "int":
        a, b, out = (np.arange(24).reshape(6, 4), np.arange(20).reshape(4, 5),
                     np.ones((6, 5), np.int64))
    elif what == "mixed":
        b = b.astype(np.float64)
        out = out.astype(np.float64)
    elif what == "strided out":
        out = np.asfortranarray(out)
    else:
        monkeypatch.setattr(gemm, "_cblas", lambda dtype: None)
    expected = out + a @ b
    gemm_into(a, b, out)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_threads_at_once(each_on_a_thread):
    rng = np.random.default_rng(4)
    cases = [(_case(rng, 64, 48, 80, np.float32), rng.normal(size=(64, 80)).astype(np.float32))
             for _ in range(8)]
    expected = [out + a @ b for (a, b), out in cases]

    def call(k):
        (a, b), out = cases[k]
        gemm_into(a, b, out)

    each_on_a_thread(call, len(cases))
    for ((_, _), out), exp in zip(cases, expected):
        np.testing.assert_allclose(out, exp, rtol=1e-5, atol=1e-5)


def test_numpy_openblas_products_are_found():
    from spmd.compiler.engine.threads import numpy_openblas

    if numpy_openblas() is None:
        pytest.skip("numpy's BLAS is not OpenBLAS here: gemm_into adds numpy products")
    assert gemm._cblas(np.dtype(np.float32)) is not None
    assert gemm._cblas(np.dtype(np.float64)) is not None
    assert gemm._cblas(np.dtype(np.int32)) is None


def _layout(rng, shape, dtype, how):
    """An array of ``shape`` laid out as ``how`` says: C order, the transpose of a
    C-order array, or every other row/column of a larger one (no unit stride)."""
    r, c = shape
    if how == "c":
        return rng.normal(size=(r, c)).astype(dtype)
    if how == "t":
        return rng.normal(size=(c, r)).astype(dtype).T
    return rng.normal(size=(2 * r, 2 * c)).astype(dtype)[::2, ::2]


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 40), k=st.integers(0, 40), n=st.integers(0, 40),
       dtype=st.sampled_from([np.float32, np.float64]),
       la=st.sampled_from(["c", "t", "strided"]), lb=st.sampled_from(["c", "t", "strided"]),
       slab=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_any_layout_adds_the_product(m, k, n, dtype, la, lb, slab, seed):
    rng = np.random.default_rng(seed)
    a, b = _layout(rng, (m, k), dtype, la), _layout(rng, (k, n), dtype, lb)
    buf = rng.normal(size=(3, m, n)).astype(dtype)
    out = buf[1] if slab else buf[1].copy()
    before = buf.copy()
    expected = out + (a.astype(np.float64) @ b.astype(np.float64)).astype(dtype)
    gemm_into(a, b, out)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * max(k, 1))
    np.testing.assert_array_equal(buf[0], before[0])  # only the slab is written
    np.testing.assert_array_equal(buf[2], before[2])
