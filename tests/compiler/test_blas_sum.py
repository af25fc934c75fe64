"""reduce_sum on numpy as a product with ones (spmd/compiler/ops/reduce.py,
``_blas_sum``): against numpy's sum in float64 over shapes, axes, strides and
dtypes, eager and jitted the same bits, the fallbacks, and ``out=``."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.ops import reduce as R

rng = np.random.default_rng(0)

CASES = [((2048, 64), (1,)), ((1, 32, 64, 64), (3,)), ((1, 32, 64, 256), (1, 2)),
         ((8, 4, 16), (0, 1)), ((8, 4, 16), (1, 2)), ((3, 5, 7), (1,)), ((64, 8), (0,)),
         ((5,), (0,)), ((2, 3, 4, 5), (0, 1, 2, 3)), ((7, 1, 9), (1, 2))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axes", CASES)
def test_the_sum_equals_numpy_to_rounding_eager_and_jitted_alike(shape, axes, dtype, x64):
    x = rng.standard_normal(shape).astype(dtype)
    want = np.sum(x.astype(np.float64), axis=axes)
    eager = np.asarray(snp.sum(snp.asarray(x), axis=axes))
    jitted = np.asarray(spmd.jit(lambda a: snp.sum(a, axis=axes))(x))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(eager, want, rtol=tol, atol=tol * np.sqrt(np.prod(shape)))
    assert eager.dtype == dtype and eager.shape == want.shape
    np.testing.assert_array_equal(jitted, eager)  # one function computes both


def test_a_float_sum_over_adjacent_axes_is_emitted_as_the_product():
    f = spmd.jit(lambda a: snp.sum(a, axis=-1))
    src = f.lower(np.zeros((32, 64), np.float32)).compile().source
    assert "_blas_sum(" in src and "xp.sum(" not in src


@pytest.mark.parametrize("x,axes,why", [
    (np.ones((4, 5, 6), np.float32), (0, 2), "axes not adjacent"),
    (np.ones((3, R.BLAS_SUM_MAX + 1), np.float32), (1,), "a long axis: pairwise"),
    (np.ones((4, 6), np.int32), (1,), "integers"),
    (np.ones((4, 6), np.float16), (1,), "no BLAS for float16"),
    (np.ones((4, 1), np.float32), (1,), "nothing to add"),
    (np.ones((0, 6), np.float32), (1,), "empty"),
])
def test_other_sums_stay_numpy_sums(x, axes, why):
    assert R._sum_plan(x.shape, x.dtype, axes) is None, why
    got = np.asarray(spmd.jit(lambda a: snp.sum(a, axis=axes))(x))
    np.testing.assert_array_equal(got, np.sum(x, axis=axes, dtype=x.dtype))
    assert got.dtype == x.dtype


def test_strided_operands_and_non_finite_values():
    x = rng.standard_normal((64, 48)).astype(np.float32)
    x[3, 5], x[7, 9], x[7, 10] = np.nan, np.inf, -np.inf
    for view in (x.T, x[::2], x[:, ::3]):
        for axes in ((0,), (1,)):
            with np.errstate(invalid="ignore"):  # inf + -inf, as numpy's sum warns
                got = R.sum_numpy(view, axes)
                want = np.sum(view.astype(np.float64), axis=axes)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def test_out_is_written_whether_contiguous_or_not():
    x = rng.standard_normal((6, 32, 16)).astype(np.float32)
    plan = R._sum_plan(x.shape, x.dtype, (1,))
    want = R._blas_sum(x, (1,), *plan)
    flat = np.zeros(200, np.float32)
    out = flat[8:8 + 96].reshape(6, 16)
    assert R._blas_sum(x, (1,), *plan, out=out) is out
    np.testing.assert_array_equal(out, want)
    strided = np.zeros((16, 6), np.float32).T
    R._blas_sum(x, (1,), *plan, out=strided)
    np.testing.assert_array_equal(strided, want)
    assert not flat[:8].any() and not flat[104:].any()  # nothing outside its slice


def test_the_ones_are_shared_and_read_only():
    a, b = R._ones(64, np.dtype(np.float32)), R._ones(64, np.dtype(np.float32))
    assert a is b and not a.flags.writeable
