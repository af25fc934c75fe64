"""spmd.numpy.linalg on complex matrices: values against numpy, derivatives against
central finite differences with JAX's convention (for a real loss of z = x + iy,
grad = dL/dx - i dL/dy; see tests/compiler/test_complex_ad.py).  Eigenvectors and
singular vectors are compared through quantities that do not depend on their
phases (JAX's rules fix a gauge the finite differences do not see)."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compiler.test_complex_ad import crand, fd_grad  # noqa: E402

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import errors  # noqa: E402

LA = snp.linalg


def _hpd(n, seed):
    """A Hermitian positive definite matrix."""
    a = crand((n, n), seed).astype(np.complex128)
    return (a @ a.conj().T + n * np.eye(n)).astype(np.complex64)


def _close(got, want, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_values_match_numpy(jit):
    a, b, h = crand((3, 3), 1), crand((3, 2), 2), _hpd(3, 3)
    run = spmd.jit if jit else (lambda f: f)
    _close(run(LA.solve)(a, b), np.linalg.solve(a, b))
    _close(run(LA.inv)(a), np.linalg.inv(a))
    _close(run(LA.det)(a), np.linalg.det(a))
    sign, logdet = run(LA.slogdet)(a)
    want_sign, want_log = np.linalg.slogdet(a)
    assert np.asarray(logdet).dtype == np.float32 and np.asarray(sign).dtype == np.complex64
    _close(sign, want_sign)
    _close(logdet, want_log)
    L = run(LA.cholesky)(h)
    _close(L, np.linalg.cholesky(h))
    _close(run(lambda m: LA.cholesky(m, upper=True))(h), np.linalg.cholesky(h).conj().T)
    q, r = run(LA.qr)(crand((4, 3), 4))
    _close(np.asarray(q) @ np.asarray(r), crand((4, 3), 4))
    _close(np.asarray(q).conj().T @ np.asarray(q), np.eye(3))
    w, v = run(LA.eigh)(h)
    assert np.asarray(w).dtype == np.float32
    _close(w, np.linalg.eigvalsh(h))
    _close(h @ np.asarray(v), np.asarray(v) * np.asarray(w)[None, :], atol=1e-4)
    for shape in ((3, 3), (4, 2), (2, 4)):
        m = crand(shape, 5)
        u, s, vh = run(lambda x: LA.svd(x, full_matrices=False))(m)
        assert np.asarray(s).dtype == np.float32
        _close(s, np.linalg.svd(m, compute_uv=False))
        _close((np.asarray(u) * np.asarray(s)) @ np.asarray(vh), m)
    for ord in (2, -2, "nuc", "fro", 1, np.inf):
        _close(run(lambda x, o=ord: LA.norm(x, o))(a), np.linalg.norm(a, ord))


def test_batched_and_vmapped():
    a, b = crand((2, 3, 3), 6), crand((2, 3), 7)
    _close(LA.solve(a, b[..., None])[..., 0], np.linalg.solve(a, b[..., None])[..., 0])
    _close(spmd.vmap(LA.inv)(a), np.linalg.inv(a))
    _close(spmd.vmap(lambda m: LA.svd(m, compute_uv=False))(a),
           np.linalg.svd(a, compute_uv=False))


A = crand((3, 3), 11)
C1, C2 = crand((3, 3), 12), crand((3, 3), 13)
B = crand((3, 2), 14)
HB = (C1 + C1.conj().T) / 2  # a Hermitian weight


def _herm(m):
    return m @ snp.conj(m.T) + 3 * snp.eye(3)


LOSSES = {  # real-valued losses of a complex 3x3 matrix
    "solve": lambda m: snp.real(snp.sum(LA.solve(m, B) * C1[:, :2])),
    "inv": lambda m: snp.abs(snp.sum(LA.inv(m) * C1)),
    "det": lambda m: snp.real(LA.det(m) * (1 + 2j)),
    "slogdet": lambda m: LA.slogdet(m)[1] + snp.real(LA.slogdet(m)[0] * (0.5 - 1j)),
    "cholesky": lambda m: snp.real(snp.sum(LA.cholesky(_herm(m)) * C1)),
    "qr": lambda m: snp.real(snp.sum(LA.qr(m)[0] * C1) + snp.sum(LA.qr(m)[1] * C2)),
    "qr_tall": lambda m: snp.real(snp.sum(LA.qr(m[:, :2])[0] * C1[:, :2])),
    "eigh_w": lambda m: snp.sum(LA.eigh(_herm(m))[0] * np.array([1.0, -2.0, 0.5])),
    # V diag(f) V^H does not depend on the eigenvectors' phases.
    "eigh_v": lambda m: snp.real(snp.trace(
        (LA.eigh(_herm(m))[1] * np.array([1.0, -2.0, 0.5])) @ snp.conj(LA.eigh(_herm(m))[1].T)
        @ HB)),
    "svd_s": lambda m: snp.sum(LA.svd(m, compute_uv=False) * np.array([1.0, 0.3, -2.0])),
    # U diag(g) V^H does not depend on the singular pairs' common phases.
    "svd_uv": lambda m: snp.real(snp.trace(
        (LA.svd(m, full_matrices=False)[0] * np.array([1.0, 0.3, -2.0]))
        @ LA.svd(m, full_matrices=False)[2] @ C1)),
    "svd_uv_wide": lambda m: snp.real(snp.trace(
        (LA.svd(m[:2], full_matrices=False)[0] * np.array([1.0, -0.4]))
        @ LA.svd(m[:2], full_matrices=False)[2] @ C1[:, :2])),
    "svd_uv_tall": lambda m: snp.real(snp.trace(
        (LA.svd(m[:, :2], full_matrices=False)[0] * np.array([1.0, -0.4]))
        @ LA.svd(m[:, :2], full_matrices=False)[2] @ C1[:2])),
    "norm2": lambda m: LA.norm(m, 2),
    "nuc": lambda m: LA.norm(m, "nuc"),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_grad_matches_finite_differences(name, jit):
    f = LOSSES[name]
    g = (spmd.jit(spmd.grad(f)) if jit else spmd.grad(f))(A)
    assert np.asarray(g).dtype == np.complex64
    _close(g, fd_grad(f, A), rtol=3e-3, atol=3e-3)


def test_holomorphic_inverse_and_solve():
    """inv and solve are holomorphic: jacfwd(holomorphic=True) is d inv(a) = -a^-1 da a^-1."""
    a = crand((2, 2), 21)
    jac = np.asarray(spmd.jacfwd(LA.inv, holomorphic=True)(a))
    ai = np.linalg.inv(a.astype(np.complex128))
    want = -np.einsum("ik,lj->ijkl", ai, ai)
    _close(jac, want, rtol=1e-3, atol=1e-4)


def test_non_float_matrices_raise():
    with pytest.raises(errors.DTypeError, match="float32, float64, complex64 and complex128"):
        spmd.compiler.ops.linalg_decomp.svd(np.ones((2, 2), np.float16))
