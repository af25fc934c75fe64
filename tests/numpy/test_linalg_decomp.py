"""spmd.numpy.linalg: values against numpy.linalg, derivatives against finite
differences (``check_grads``), batching against a loop, error cases."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.test_util import check_grads

LA = snp.linalg
RNG = np.random.default_rng(0)


def _general(n=4, m=None, batch=(), seed=0):
    return np.random.default_rng(seed).standard_normal(batch + (n, m or n))


def _spd(n=4, batch=(), seed=0):
    a = _general(n, batch=batch, seed=seed)
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _run(mode, f, *args):
    if mode == "jit":
        return spmd.jit(f)(*args)
    return f(*[snp.asarray(a) for a in args])


@pytest.fixture(params=["eager", "jit"])
def mode(request):
    return request.param


def _close(got, want, tol=1e-4):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


# ------------------------------------------------------------------ values

def test_solve_inv_det_slogdet_match_numpy(mode):
    a, b, bm = _spd(), RNG.standard_normal(4), RNG.standard_normal((4, 3))
    a32 = a.astype(np.float32)
    _close(_run(mode, LA.solve, a32, b.astype(np.float32)), np.linalg.solve(a, b))
    _close(_run(mode, LA.solve, a32, bm.astype(np.float32)), np.linalg.solve(a, bm))
    _close(_run(mode, LA.inv, a32), np.linalg.inv(a))
    _close(_run(mode, LA.det, a32), np.linalg.det(a), 1e-3)
    sign, logdet = _run(mode, LA.slogdet, -a32)
    want = np.linalg.slogdet(-a)
    _close(sign, want[0])
    _close(logdet, want[1])


def test_solve_broadcasts_batches():
    a, b = _spd(batch=(2, 1)), RNG.standard_normal((3, 4, 2))
    got = LA.solve(a, b)
    assert got.shape == (2, 3, 4, 2)
    _close(got, np.linalg.solve(np.broadcast_to(a, (2, 3, 4, 4)), b))


def test_decompositions_match_numpy(mode):
    a, spd = _general(5, 3), _spd()
    _close(_run(mode, LA.cholesky, spd.astype(np.float32)), np.linalg.cholesky(spd))
    _close(_run(mode, lambda x: LA.cholesky(x, upper=True), spd), np.linalg.cholesky(spd).T)
    for m in ("reduced", "complete"):
        q, r = _run(mode, lambda x: LA.qr(x, mode=m), a)
        wq, wr = np.linalg.qr(a, mode=m)
        _close(q, wq)
        _close(r, wr)
    _close(_run(mode, lambda x: LA.qr(x, mode="r"), a), np.linalg.qr(a, mode="r"))
    w, v = _run(mode, LA.eigh, spd)
    _close(w, np.linalg.eigvalsh(spd))
    _close(np.abs(np.asarray(v)), np.abs(np.linalg.eigh(spd)[1]))
    for full in (True, False):
        u, s, vh = _run(mode, lambda x: LA.svd(x, full_matrices=full), a)
        wu, ws, wvh = np.linalg.svd(a, full_matrices=full)
        assert u.shape == wu.shape and vh.shape == wvh.shape
        _close(s, ws)
        u, s, vh = np.asarray(u), np.asarray(s), np.asarray(vh)
        _close((u[:, :3] * s) @ vh[:3], a)
        _close(np.abs(u[:, :3]), np.abs(wu[:, :3]))
    _close(_run(mode, LA.svdvals, a), np.linalg.svd(a, compute_uv=False))
    _close(_run(mode, LA.eigvalsh, spd), np.linalg.eigvalsh(spd))


def test_results_are_named_tuples():
    spd = _spd()
    assert LA.eigh(spd).eigenvalues.shape == (4,)
    assert LA.svd(spd).Vh.shape == (4, 4)
    assert LA.qr(spd).R.shape == (4, 4)
    assert LA.slogdet(spd).logabsdet.shape == ()


@pytest.mark.parametrize("ord", [None, 0, 1, -1, 2, 3, 0.5, np.inf, -np.inf])
def test_vector_norms_match_numpy(mode, ord):
    x = RNG.standard_normal((3, 5))
    _close(_run(mode, lambda v: LA.norm(v, ord, axis=1), x), np.linalg.norm(x, ord, axis=1))
    _close(_run(mode, lambda v: LA.norm(v[0], ord), x), np.linalg.norm(x[0], ord))


@pytest.mark.parametrize("ord", [None, "fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf])
def test_matrix_norms_match_numpy(mode, ord):
    x = RNG.standard_normal((3, 4, 5))
    _close(_run(mode, lambda v: LA.norm(v[0], ord), x), np.linalg.norm(x[0], ord))
    _close(_run(mode, lambda v: LA.norm(v, ord, axis=(2, 0)), x),
           np.linalg.norm(x, ord, axis=(2, 0)))
    _close(_run(mode, lambda v: LA.norm(v, ord, axis=(0, 1), keepdims=True), x),
           np.linalg.norm(x, ord, axis=(0, 1), keepdims=True))


def test_norm_of_nd_array_flattens_and_int_inputs_promote():
    x = np.arange(24).reshape(2, 3, 4)
    got = LA.norm(x)
    assert got.dtype == np.float32
    _close(got, np.linalg.norm(x))
    _close(LA.norm(x, keepdims=True), np.linalg.norm(x, keepdims=True))
    assert LA.inv(np.array([[2, 0], [0, 4]])).dtype == np.float32


def test_failures_give_nan_like_jax():
    assert np.isnan(np.asarray(LA.inv(np.zeros((2, 2))))).all()
    assert np.isnan(np.asarray(LA.cholesky(-np.eye(3)))).all()
    # one bad matrix in a batch spoils only its own result
    out = np.asarray(LA.cholesky(np.stack([np.eye(2), -np.eye(2)])))
    assert np.allclose(out[0], np.eye(2)) and np.isnan(out[1]).all()


# ------------------------------------------------------------ derivatives

def test_solve_inv_det_derivatives():
    a, b = _spd(3), RNG.standard_normal((3, 2))
    check_grads(LA.solve, (a, b), order=2)
    check_grads(lambda x: LA.solve(x, b[:, 0]), (a,), order=1)
    check_grads(LA.inv, (a,), order=2)
    check_grads(LA.det, (_general(3),), order=2)
    check_grads(lambda x: LA.slogdet(x)[1], (_general(3),), order=2)


def test_cholesky_derivative():
    check_grads(LA.cholesky, (_spd(3),), order=2)
    check_grads(lambda x: LA.cholesky(x, upper=True), (_spd(3, batch=(2,)),), order=1)


@pytest.mark.parametrize("shape", [(3, 3), (5, 3)])
def test_qr_derivative(shape):
    check_grads(lambda x: LA.qr(x), (_general(*shape),), order=2)


def test_qr_derivative_of_wide_matrix_raises():
    with pytest.raises(NotImplementedError, match="qr"):
        spmd.grad(lambda x: LA.qr(x).R.sum())(np.ones((2, 3), np.float32))


def test_eigh_derivative():
    spd = _spd(3)
    check_grads(lambda x: LA.eigh(x).eigenvalues, (spd,), order=2)
    # eigenvector signs are arbitrary: check sign-free functions of them
    check_grads(lambda x: LA.eigh(x).eigenvectors ** 2, (spd,), order=1)
    check_grads(lambda x: (lambda w, v: (v * snp.sin(w)) @ v.T)(*LA.eigh(x)), (spd,), order=2)


@pytest.mark.parametrize("shape", [(3, 3), (5, 3), (3, 5)])
def test_svd_derivative(shape):
    a = _general(*shape)
    check_grads(LA.svdvals, (a,), order=2)

    def f(x):
        u, s, vh = LA.svd(x, full_matrices=False)
        return (u * snp.tanh(s)) @ vh, u ** 2, vh ** 2

    check_grads(f, (a,), order=1)


def test_svd_full_matrices_derivative_raises_for_non_square():
    with pytest.raises(NotImplementedError, match="full_matrices=False"):
        spmd.grad(lambda x: LA.svd(x).U.sum())(np.ones((3, 2), np.float32))


@pytest.mark.parametrize("ord", [None, 1, np.inf, 3])
def test_norm_derivatives(ord):
    check_grads(lambda x: LA.norm(x, ord), (RNG.standard_normal(5),), order=2)


@pytest.mark.parametrize("ord", ["fro", "nuc", 2, 1])
def test_matrix_norm_derivatives(ord):
    check_grads(lambda x: LA.norm(x, ord), (_general(4, 3),), order=1)


# ------------------------------------------------------------------ vmap

def test_vmap_matches_loop():
    spds = _spd(3, batch=(4,))
    b = RNG.standard_normal((4, 3))
    for f in (LA.inv, LA.cholesky, LA.det, lambda x: LA.eigh(x).eigenvalues, LA.svdvals,
              lambda x: LA.qr(x).R, lambda x: LA.slogdet(x)[1]):
        got = spmd.vmap(f)(spds)
        want = np.stack([np.asarray(f(s)) for s in spds])
        _close(got, want)
    _close(spmd.vmap(LA.solve)(spds, b), np.linalg.solve(spds, b[..., None])[..., 0])
    _close(spmd.vmap(LA.solve, in_axes=(None, 0))(spds[0], b),
           np.linalg.solve(spds[0], b.T).T)
    _close(spmd.vmap(spmd.grad(lambda x: LA.det(x)))(spds),
           np.stack([np.linalg.det(s) * np.linalg.inv(s).T for s in spds]), 1e-2)


# ------------------------------------------------------------------ errors

def test_errors():
    with pytest.raises(ShapeError, match="square"):
        LA.inv(np.ones((2, 3)))
    with pytest.raises(ShapeError, match="at least 2"):
        LA.det(np.ones(3))
    with pytest.raises(ShapeError, match="rows"):
        LA.solve(np.eye(3), np.ones(2))
    with pytest.raises(ArgumentError, match="mode='raw'"):
        LA.qr(np.eye(2), mode="raw")
    with pytest.raises(ArgumentError, match="ord='nuc'"):
        LA.norm(np.ones(3), "nuc")
    with pytest.raises(ArgumentError, match="ord=3"):
        LA.norm(np.ones((2, 2)), 3)
    with pytest.raises(ArgumentError, match="1-d or 2-d"):
        LA.norm(np.ones((2, 2, 2)), 1)
    with pytest.raises(DTypeError, match="float16"):
        LA.inv(np.eye(2, dtype=np.float16))


def test_det_gradient_is_the_adjugate_also_at_singular_matrices():
    a = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)   # rank 1
    _close(spmd.grad(LA.det)(a), [[4.0, -2.0], [-2.0, 1.0]])  # adj(a)^T
    _close(spmd.grad(LA.det)(np.zeros((3, 3), np.float32)), np.zeros((3, 3)))
    b = _general(3)
    _close(spmd.grad(LA.det)(b), np.linalg.det(b) * np.linalg.inv(b).T, 1e-3)
    _close(spmd.jit(spmd.vmap(spmd.grad(LA.det)))(np.stack([a, 2 * a])),
           [[[4.0, -2.0], [-2.0, 1.0]], [[8.0, -4.0], [-4.0, 2.0]]])
