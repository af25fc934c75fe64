"""spmd.numpy's diagonals, triangles, meshgrid, diff, kron, cross, counting, NaN
reductions, average, quantiles, searchsorted, interp, polyval, trapezoid, logspace:
values against numpy (eager and under jit), a few derivatives, errors."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.errors import ArgumentError, ShapeError
from spmd.test_util import check_grads

pytestmark = pytest.mark.filterwarnings("ignore:Arrays of 2-dimensional vectors:DeprecationWarning")
RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 4, 5)).astype(np.float32)
M = RNG.standard_normal((4, 4)).astype(np.float32)
V = RNG.standard_normal(5).astype(np.float32)
NANS = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [4.0, 5.0, 6.0]], np.float32)


def _run(jit, f, *args):
    return (spmd.jit(f) if jit else f)(*args)


CASES = [
    ("diagonal", lambda x: snp.diagonal(x), lambda x: np.diagonal(x), M),
    ("diagonal_off", lambda x: snp.diagonal(x, 1, 2, 0), lambda x: np.diagonal(x, 1, 2, 0), A),
    ("diagonal_neg", lambda x: snp.diagonal(x, -2), lambda x: np.diagonal(x, -2), M),
    ("trace", lambda x: snp.trace(x), lambda x: np.trace(x), M),
    ("trace_3d", lambda x: snp.trace(x, 1, 1, 2), lambda x: np.trace(x, 1, 1, 2), A),
    ("diag_vec", lambda x: snp.diag(x, -1), lambda x: np.diag(x, -1), V),
    ("diag_mat", lambda x: snp.diag(x, 1), lambda x: np.diag(x, 1), M),
    ("tril", lambda x: snp.tril(x, -1), lambda x: np.tril(x, -1), A),
    ("triu", lambda x: snp.triu(x, 1), lambda x: np.triu(x, 1), A),
    ("diff", lambda x: snp.diff(x, 2, axis=1), lambda x: np.diff(x, 2, axis=1), A),
    ("diff_prepend", lambda x: snp.diff(x, prepend=0.0, append=x[-1:]),
     lambda x: np.diff(x, prepend=0.0, append=x[-1:]), V),
    ("kron", lambda x: snp.kron(x, x[:2, :3]), lambda x: np.kron(x, x[:2, :3]), M),
    ("kron_mixed", lambda x: snp.kron(x[0], x), lambda x: np.kron(x[0], x), M),
    ("cross3", lambda x: snp.cross(x[:, :3], x[:, 1:]), lambda x: np.cross(x[:, :3], x[:, 1:]), M),
    ("cross2", lambda x: snp.cross(x[:, :2], x[:, 2:]), lambda x: np.cross(x[:, :2], x[:, 2:]), M),
    ("count_nonzero", lambda x: snp.count_nonzero(x > 0, axis=1),
     lambda x: np.count_nonzero(x > 0, axis=1), A),
    ("nansum", lambda x: snp.nansum(x, axis=1), lambda x: np.nansum(x, axis=1), NANS),
    ("nanmean", lambda x: snp.nanmean(x[::2], axis=0), lambda x: np.nanmean(x[::2], axis=0), NANS),
    ("nanmax", lambda x: snp.nanmax(x[::2], axis=1), lambda x: np.nanmax(x[::2], axis=1), NANS),
    ("nanmin", lambda x: snp.nanmin(x), lambda x: np.nanmin(x), NANS),
    ("average", lambda x: snp.average(x, axis=1, weights=np.arange(1.0, 5.0)),
     lambda x: np.average(x, axis=1, weights=np.arange(1.0, 5.0)), A),
    ("average_plain", lambda x: snp.average(x), lambda x: np.average(x), A),
    ("median", lambda x: snp.median(x, axis=1), lambda x: np.median(x, axis=1), A),
    ("median_all", lambda x: snp.median(x), lambda x: np.median(x), A),
    ("quantile", lambda x: snp.quantile(x, np.array([0.1, 0.5, 0.9]), axis=2),
     lambda x: np.quantile(x, [0.1, 0.5, 0.9], axis=2), A),
    ("quantile_keep", lambda x: snp.quantile(x, np.array([0.25, 1.0]), axis=1, keepdims=True),
     lambda x: np.quantile(x, [0.25, 1.0], axis=1, keepdims=True), A),
    ("percentile", lambda x: snp.percentile(x, 30.0), lambda x: np.percentile(x, 30.0), A),
    ("median_nan", lambda x: snp.median(x, axis=1), lambda x: np.median(x, axis=1), NANS),
    ("searchsorted", lambda x: snp.searchsorted(np.sort(V), x),
     lambda x: np.searchsorted(np.sort(V), x), A),
    ("searchsorted_r", lambda x: snp.searchsorted(np.array([1.0, 2, 2, 3]), x, side="right"),
     lambda x: np.searchsorted(np.array([1.0, 2, 2, 3]), x, side="right"),
     np.array([0.0, 2.0, 2.5, 9.0], np.float32)),
    ("interp", lambda x: snp.interp(x, np.array([-1.0, 0.0, 2.0]), np.array([1.0, 3.0, 0.0])),
     lambda x: np.interp(x, [-1.0, 0.0, 2.0], [1.0, 3.0, 0.0]), A),
    ("interp_lr", lambda x: snp.interp(x, np.array([0.0, 1.0]), np.array([1.0, 2.0]), -5.0, 5.0),
     lambda x: np.interp(x, [0.0, 1.0], [1.0, 2.0], -5.0, 5.0), V),
    ("polyval", lambda x: snp.polyval(np.array([2.0, -1.0, 0.5]), x),
     lambda x: np.polyval([2.0, -1.0, 0.5], x), A),
    ("trapezoid", lambda x: snp.trapezoid(x, axis=1), lambda x: np.trapezoid(x, axis=1), A),
    ("trapezoid_x", lambda x: snp.trapezoid(x, np.cumsum(np.arange(1.0, 6.0))),
     lambda x: np.trapezoid(x, np.cumsum(np.arange(1.0, 6.0))), A),
]


@pytest.mark.parametrize("name,f,g,x", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("jit", [False, True])
def test_matches_numpy(name, f, g, x, jit):
    got = _run(jit, f, x)
    want = g(x)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-5)


def test_meshgrid_array_equal_logspace():
    x, y, z = np.arange(3.0), np.arange(4.0), np.arange(2.0)
    for kw in ({}, {"indexing": "ij"}, {"sparse": True}):
        got = snp.meshgrid(x, y, z, **kw)
        want = np.meshgrid(x, y, z, **kw)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)
    assert bool(snp.array_equal(M, M.copy())) and not bool(snp.array_equal(M, M[:2]))
    assert not bool(snp.array_equal(NANS, NANS)) and bool(snp.array_equal(NANS, NANS, True))
    np.testing.assert_allclose(snp.logspace(0, 2, 5), np.logspace(0, 2, 5), rtol=1e-5)
    np.testing.assert_allclose(snp.logspace(0, 3, 4, base=2.0), np.logspace(0, 3, 4, base=2),
                               rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(snp.diff(np.array([True, True, False]))),
                                  np.diff(np.array([True, True, False])))
    w = snp.average(A, axis=0, weights=np.ones((3, 4, 5)), returned=True)
    np.testing.assert_allclose(w[1], np.full((4, 5), 3.0))


def test_derivatives():
    m = M.astype(np.float64)
    check_grads(lambda x: snp.trace(x @ x), (m,), order=2)
    check_grads(lambda x: snp.tril(x) @ snp.triu(x, 1), (m,), order=1)
    check_grads(lambda x: snp.kron(x[:2, :2], x), (m,), order=1)
    check_grads(lambda x: snp.quantile(x, np.array([0.3, 0.8]), axis=1), (m,), order=1)
    check_grads(lambda x: snp.interp(x, np.array([-3.0, 0.0, 3.0]), np.array([0.0, 1.0, 4.0])),
                (np.array([-1.0, 0.5, 2.0]),), order=1)
    check_grads(lambda x: snp.cross(x[:, :3], x[:, 1:]), (m,), order=2)


def test_errors():
    with pytest.raises(ShapeError, match="at least 2"):
        snp.trace(V)
    with pytest.raises(ArgumentError, match="must differ"):
        snp.diagonal(M, 0, 1, 1)
    with pytest.raises(ShapeError, match="1-d or 2-d"):
        snp.diag(A)
    with pytest.raises(ArgumentError, match="n=-1"):
        snp.diff(V, -1)
    with pytest.raises(ShapeError, match="2 or 3"):
        snp.cross(M, M)
    with pytest.raises(ShapeError, match="weights"):
        snp.average(A, weights=np.ones(3))
    with pytest.raises(ArgumentError, match="method='nearest'"):
        snp.quantile(V, 0.5, method="nearest")
    with pytest.raises(ShapeError, match="1-d"):
        snp.searchsorted(M, V)
    with pytest.raises(ArgumentError, match="side='middle'"):
        snp.searchsorted(V, V, side="middle")
    with pytest.raises(ArgumentError, match="indexing='yx'"):
        snp.meshgrid(V, V, indexing="yx")
    with pytest.raises(TypeError, match="requires ndarray"):
        snp.trace([[1, 2], [3, 4]])
