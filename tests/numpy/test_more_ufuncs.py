"""More elementwise functions, dtype helpers, index helpers and small utilities
of spmd.numpy against numpy (eager and under jit), derivatives, errors."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.errors import ArgumentError, ConcretizationError, ShapeError
from spmd.test_util import check_grads

RNG = np.random.default_rng(0)
X = RNG.uniform(-3, 3, (4, 5)).astype(np.float32)
POS = RNG.uniform(0.1, 5, (4, 5)).astype(np.float32)
GE1 = RNG.uniform(1.0, 6, (4, 5)).astype(np.float32)
UNIT = RNG.uniform(-0.95, 0.95, (4, 5)).astype(np.float32)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -2.5, 2.5], np.float32)

UNARY = [("log2", POS), ("log10", POS), ("exp2", X), ("arcsinh", X), ("arccosh", GE1),
         ("arctanh", UNIT), ("deg2rad", X), ("rad2deg", X), ("radians", X), ("degrees", X),
         ("cbrt", X), ("sinc", np.append(X.ravel(), np.float32(0.0)).astype(np.float32)), ("trunc", X), ("fix", X),
         ("rint", X * 2), ("positive", X), ("isposinf", SPECIAL), ("isneginf", SPECIAL),
         ("nan_to_num", SPECIAL)]


@pytest.mark.parametrize("name,x", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("jit", [False, True])
def test_unary_matches_numpy(name, x, jit):
    f = getattr(snp, name)
    got = (spmd.jit(f) if jit else f)(x)
    want = getattr(np, name)(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got), want, rtol=3e-6, atol=1e-6)


BINARY = [("hypot", X, POS), ("fmax", SPECIAL, SPECIAL[::-1]), ("fmin", SPECIAL, SPECIAL[::-1]),
          ("fmod", X, POS), ("heaviside", np.array([-1.0, 0.0, 2.0], np.float32),
                             np.float32(0.5)),
          ("logaddexp2", X, POS), ("float_power", POS, X)]


@pytest.mark.parametrize("name,a,b", BINARY, ids=[u[0] for u in BINARY])
@pytest.mark.parametrize("jit", [False, True])
def test_binary_matches_numpy(name, a, b, jit):
    f = getattr(snp, name)
    got = (spmd.jit(f) if jit else f)(a, b)
    want = getattr(np, name)(a, b)
    np.testing.assert_allclose(np.asarray(got), want.astype(got.dtype), rtol=3e-6, atol=1e-6)


def test_extremes_and_derivatives():
    np.testing.assert_allclose(snp.arcsinh(np.array([1e9, -1e20, 1e-10], np.float32)),
                               np.arcsinh(np.array([1e9, -1e20, 1e-10], np.float32)),
                               rtol=1e-6)
    assert float(snp.hypot(np.float32(3e30), np.float32(4e30))) == pytest.approx(5e30, 1e-6)
    assert float(spmd.grad(snp.arcsinh)(np.float32(0.0))) == 1.0
    assert float(spmd.grad(snp.sinc)(np.float32(0.0))) == 0.0
    for f, x in ((snp.arcsinh, X), (snp.arccosh, GE1), (snp.arctanh, UNIT), (snp.log10, POS),
                 (snp.hypot, None), (snp.sinc, X)):
        if x is None:
            check_grads(f, (X.astype(np.float64), POS.astype(np.float64)), order=2)
        else:
            check_grads(f, (x.astype(np.float64),), order=2)


def test_dtype_helpers():
    assert snp.finfo(snp.float32).eps == np.finfo(np.float32).eps
    assert snp.iinfo(np.int32).max == 2**31 - 1
    assert snp.finfo(snp.ones(2)).bits == 32
    assert snp.issubdtype(snp.float32, snp.floating) and snp.issubdtype(snp.int8, snp.integer)
    assert not snp.issubdtype(snp.float32, snp.integer)
    assert snp.can_cast(np.int8, np.int32) and not snp.can_cast(np.float32, np.int32)
    assert snp.result_type(np.ones(2, np.int32), 1.0) == np.float32  # weak Python float
    assert snp.result_type(np.int8, np.uint8) == np.int16
    assert snp.promote_types(np.int32, np.float32) == np.float32
    x = snp.ones((2, 3))
    assert (snp.ndim(x), snp.shape(x), snp.size(x), snp.size(x, 1)) == (2, (2, 3), 6, 3)
    assert spmd.jit(lambda v: v * snp.size(v))(np.ones(4, np.float32)).tolist() == [4.0] * 4


def test_index_helpers_match_numpy():
    i = np.array([0, 5, 11, 7])
    for got, want in zip(snp.unravel_index(i, (3, 4)), np.unravel_index(i, (3, 4))):
        np.testing.assert_array_equal(np.asarray(got), want)
    rows, cols = np.array([0, 2, 1]), np.array([3, 0, 2])
    np.testing.assert_array_equal(np.asarray(snp.ravel_multi_index((rows, cols), (3, 4))),
                                  np.ravel_multi_index((rows, cols), (3, 4)))
    np.testing.assert_array_equal(
        np.asarray(snp.ravel_multi_index((rows + 5, cols), (3, 4), mode="clip")),
        np.ravel_multi_index((rows + 5, cols), (3, 4), mode="clip"))
    np.testing.assert_array_equal(np.asarray(snp.indices((2, 3))), np.indices((2, 3)))
    for got, want in zip(snp.indices((2, 3), sparse=True), np.indices((2, 3), sparse=True)):
        np.testing.assert_array_equal(np.asarray(got), want)
    for f in ("tril_indices", "triu_indices"):
        for got, want in zip(getattr(snp, f)(4, 1, 5), getattr(np, f)(4, 1, 5)):
            np.testing.assert_array_equal(np.asarray(got), want)
    for got, want in zip(snp.diag_indices(3), np.diag_indices(3)):
        np.testing.assert_array_equal(np.asarray(got), want)
    m = np.arange(24).reshape(2, 3, 4)
    for k in range(-1, 5):
        np.testing.assert_array_equal(np.asarray(snp.rot90(m, k, axes=(1, 2))),
                                      np.rot90(m, k, axes=(1, 2)))


def test_utilities_match_numpy():
    x = np.arange(6)
    conds = [x < 2, x > 3]
    np.testing.assert_array_equal(np.asarray(snp.select(conds, [x, -x], 99)),
                                  np.select(conds, [x, -x], 99))
    np.testing.assert_array_equal(np.asarray(snp.append(x.reshape(2, 3), np.ones((1, 3), int),
                                                        axis=0)),
                                  np.append(x.reshape(2, 3), np.ones((1, 3), int), axis=0))
    np.testing.assert_array_equal(np.asarray(snp.append(x, np.array([7]))),
                                  np.append(x, [7]))
    for obj, axis in ((1, None), ([0, -1], 1), (slice(0, 2), 0)):
        a = x.reshape(3, 2) if axis is not None else x
        np.testing.assert_array_equal(np.asarray(snp.delete(a, obj, axis)),
                                      np.delete(a, obj, axis))
    np.testing.assert_array_equal(np.asarray(snp.isin(x, np.array([1, 4, 9]))),
                                  np.isin(x, [1, 4, 9]))
    np.testing.assert_array_equal(np.asarray(snp.isin(x, np.array([1, 4]), invert=True)),
                                  np.isin(x, [1, 4], invert=True))
    b = np.array([0, 1, 1, 3, 1])
    np.testing.assert_array_equal(np.asarray(snp.bincount(b)), np.bincount(b))
    np.testing.assert_allclose(np.asarray(snp.bincount(b, np.arange(5.0), minlength=6)),
                               np.bincount(b, np.arange(5.0), minlength=6))
    got = spmd.jit(lambda v: snp.bincount(v, length=3))(b)
    assert np.asarray(got).tolist() == [1, 3, 0]  # 3 is dropped, as in JAX
    v = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(np.asarray(snp.vander(v)), np.vander(v))
    np.testing.assert_allclose(np.asarray(snp.vander(v, 4, increasing=True)),
                               np.vander(v, 4, increasing=True))
    d = RNG.standard_normal((3, 7))
    np.testing.assert_allclose(np.asarray(snp.cov(d)), np.cov(d), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(snp.cov(d.T, rowvar=False, bias=True)),
                               np.cov(d.T, rowvar=False, bias=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(snp.cov(d[0], d[1])), np.cov(d[0], d[1]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(snp.corrcoef(d)), np.corrcoef(d), rtol=1e-5,
                               atol=1e-6)
    vf = snp.vectorize(lambda a, b: snp.where(a > b, a - b, a * b))
    np.testing.assert_allclose(np.asarray(vf(X, X[0])), np.where(X > X[0], X - X[0], X * X[0]),
                               rtol=1e-6)


def test_errors():
    with pytest.raises(ArgumentError, match="must match"):
        snp.select([np.ones(2, bool)], [1, 2])
    with pytest.raises(ArgumentError, match="bool"):
        snp.select([np.ones(2)], [1])
    with pytest.raises(ArgumentError, match="out of bounds"):
        snp.delete(np.arange(3), 5)
    with pytest.raises(ArgumentError, match="mode='raise'"):
        snp.ravel_multi_index((np.array([5]), np.array([0])), (3, 4))
    with pytest.raises(ConcretizationError, match="length="):
        spmd.jit(snp.bincount)(np.array([0, 1]))
    with pytest.raises(NotImplementedError, match="signature"):
        snp.vectorize(lambda a: a, signature="(n)->()")
    with pytest.raises(ArgumentError, match="two different axes"):
        snp.rot90(np.ones((2, 2)), axes=(0, 0))


@pytest.mark.parametrize("kw", [{}, {"bins": 7}, {"bins": 5, "range": (-1.0, 1.0)},
                                {"density": True}, {"weights": "w"},
                                {"bins": np.array([-3.0, -0.5, 0.0, 0.5, 3.0])}])
def test_histogram_against_numpy(kw):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(10, 12)).astype(np.float32)
    kw = dict(kw)
    if kw.get("weights") == "w":
        kw["weights"] = rng.random((10, 12)).astype(np.float32)
    for run in (lambda: snp.histogram(a, **kw),
                lambda: spmd.jit(lambda v: snp.histogram(v, **kw))(a)):
        counts, edges = run()
        want_c, want_e = np.histogram(a, **kw)
        np.testing.assert_allclose(np.asarray(edges), want_e, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(counts), want_c, rtol=1e-5, atol=1e-6)
        assert counts.dtype == edges.dtype == np.float32  # float counts, as in JAX
    np.testing.assert_allclose(np.asarray(snp.histogram_bin_edges(a, **{
        k: v for k, v in kw.items() if k in ("bins", "range")})),
        np.histogram_bin_edges(a, **{k: v for k, v in kw.items() if k in ("bins", "range")}),
        rtol=1e-5, atol=1e-6)


def test_histogram_edges_and_errors():
    # One value: numpy's unit-wide range; the last edge is inside the last bin.
    c, e = snp.histogram(np.array([3.0, 3.0]), bins=2)
    np.testing.assert_array_equal(np.asarray(e), [2.5, 3.0, 3.5])
    np.testing.assert_array_equal(np.asarray(c), [0.0, 2.0])
    c, _ = snp.histogram(np.array([1, 2, 3, 10, 11, 15, 19, 25]), bins=np.array([0, 10, 20, 30]))
    np.testing.assert_array_equal(np.asarray(c), [3.0, 4.0, 1.0])
    with pytest.raises(ArgumentError, match="bins='auto': named binning rules"):
        snp.histogram(np.ones(3), bins="auto")
    with pytest.raises(ArgumentError, match="bins must be a positive int"):
        snp.histogram(np.ones(3), bins=0)
    with pytest.raises(ShapeError, match=r"weights of shape \(2,\) must have a's shape \(3,\)"):
        snp.histogram(np.ones(3), weights=np.ones(2))
