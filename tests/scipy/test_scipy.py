"""spmd.scipy.special, spmd.scipy.linalg and spmd.scipy.stats.norm against scipy
(float64 under x64 for the tails), derivatives against finite differences."""

import numpy as np
import pytest

from spmd import lax
from spmd.errors import ArgumentError
from spmd.scipy import linalg as sla, special as ssp
from spmd.scipy.stats import norm
from spmd.test_util import check_grads

scipy_special = pytest.importorskip("scipy.special")
scipy_stats = pytest.importorskip("scipy.stats")
scipy_linalg = pytest.importorskip("scipy.linalg")

RNG = np.random.default_rng(0)
X = np.linspace(-4.0, 4.0, 17)
POS = np.linspace(0.2, 6.0, 13)
PROB = np.linspace(0.01, 0.99, 11)


CASES = [("erf", X), ("erfc", X * 3), ("erfinv", PROB * 2 - 1), ("gammaln", POS),
         ("gamma", np.array([-2.5, -1.5, -0.5, 0.5, 3.0])), ("digamma", POS),
         ("expit", X), ("logit", PROB), ("entr", np.array([0.0, 0.3, 1.0, 2.0, -1.0])),
         ("ndtr", X * 3), ("log_ndtr", np.linspace(-30.0, 5.0, 15)), ("ndtri", PROB)]


@pytest.mark.parametrize("name,x", CASES, ids=[c[0] for c in CASES])
def test_unary_special_functions_match_scipy(name, x, x64):
    got = getattr(ssp, name)(x)
    np.testing.assert_allclose(np.asarray(got), getattr(scipy_special, name)(x), rtol=1e-6,
                               atol=1e-12)


def test_binary_and_reductions_match_scipy(x64):
    a, b = POS, POS[::-1]
    np.testing.assert_allclose(ssp.betaln(a, b), scipy_special.betaln(a, b), rtol=1e-10)
    np.testing.assert_allclose(ssp.polygamma(2, a), scipy_special.polygamma(2, a), rtol=1e-10)
    y = np.array([0.0, 0.5, 2.0])
    np.testing.assert_allclose(ssp.xlogy(np.array([0.0, 1.0, 2.0]), y),
                               scipy_special.xlogy([0.0, 1.0, 2.0], y))
    np.testing.assert_allclose(ssp.xlog1py(np.array([0.0, 1.0, 2.0]), y - 1),
                               scipy_special.xlog1py([0.0, 1.0, 2.0], y - 1))
    m = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(ssp.logsumexp(m, axis=1), scipy_special.logsumexp(m, axis=1))
    np.testing.assert_allclose(ssp.softmax(m, axis=0), scipy_special.softmax(m, axis=0))
    np.testing.assert_allclose(ssp.log_softmax(m), scipy_special.log_softmax(m))


def test_erfc_keeps_relative_accuracy_in_float32_tails():
    x = np.array([3.0, 5.0, 9.0], np.float32)
    np.testing.assert_allclose(lax.erfc(x), scipy_special.erfc(x.astype(np.float64)),
                               rtol=1e-5)
    assert lax.erfc(x).dtype == np.float32


def test_norm_matches_scipy(x64):
    x = np.linspace(-40.0, 40.0, 21)
    for name in ("pdf", "logpdf", "cdf", "logcdf", "sf", "logsf"):
        got = getattr(norm, name)(x, 1.5, 2.0)
        want = getattr(scipy_stats.norm, name)(x, 1.5, 2.0)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-300, err_msg=name)
    np.testing.assert_allclose(norm.ppf(PROB, 1.0, 3.0), scipy_stats.norm.ppf(PROB, 1.0, 3.0),
                               rtol=1e-10)


def test_linalg_matches_scipy():
    a = RNG.standard_normal((4, 4))
    spd = a @ a.T + 4 * np.eye(4)
    b = RNG.standard_normal((4, 2))
    for lower in (False, True):
        np.testing.assert_allclose(sla.cholesky(spd, lower=lower),
                                   scipy_linalg.cholesky(spd, lower=lower), rtol=1e-4)
        c = sla.cho_factor(spd, lower=lower)
        np.testing.assert_allclose(sla.cho_solve(c, b), np.linalg.solve(spd, b), rtol=1e-4)
        for trans in (0, 1, "T"):
            got = sla.solve_triangular(a, b, trans=trans, lower=lower)
            want = scipy_linalg.solve_triangular(a, b, trans=trans, lower=lower)
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(sla.solve_triangular(a, b, lower=True, unit_diagonal=True),
                               scipy_linalg.solve_triangular(a, b, lower=True,
                                                             unit_diagonal=True), rtol=1e-3)
    np.testing.assert_allclose(sla.solve(spd, b, assume_a="pos"), np.linalg.solve(spd, b),
                               rtol=1e-4)
    np.testing.assert_allclose(sla.det(a), np.linalg.det(a), rtol=1e-4)
    np.testing.assert_allclose(sla.eigh(spd, eigvals_only=True), np.linalg.eigvalsh(spd),
                               rtol=1e-4)
    q, r = sla.qr(a[:, :3], mode="economic")
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a[:, :3], atol=1e-5)
    (r_only,) = sla.qr(a, mode="r")
    assert r_only.shape == (4, 4)
    with pytest.raises(ArgumentError, match="trans"):
        sla.solve_triangular(a, b, trans=3)
    with pytest.raises(ArgumentError, match="assume_a"):
        sla.solve(a, b, assume_a="banded")


def test_linalg_on_complex_matches_scipy():
    """Hermitian factorizations and the conjugate transpose (trans='C' differs from
    'T' on complex matrices)."""
    a = (RNG.standard_normal((4, 4)) + 1j * RNG.standard_normal((4, 4))).astype(np.complex64)
    hpd = a @ a.conj().T + 4 * np.eye(4, dtype=np.complex64)
    b = (RNG.standard_normal((4, 2)) + 1j * RNG.standard_normal((4, 2))).astype(np.complex64)
    for lower in (False, True):
        np.testing.assert_allclose(sla.cholesky(hpd, lower=lower),
                                   scipy_linalg.cholesky(hpd, lower=lower), rtol=1e-4,
                                   atol=1e-5)
        c = sla.cho_factor(hpd, lower=lower)
        np.testing.assert_allclose(sla.cho_solve(c, b), np.linalg.solve(hpd, b), rtol=1e-3,
                                   atol=1e-4)
        for trans in (0, 1, 2, "T", "C"):
            got = sla.solve_triangular(a, b, trans=trans, lower=lower)
            want = scipy_linalg.solve_triangular(a, b, trans=trans, lower=lower)
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(sla.solve(hpd, b, assume_a="pos"), np.linalg.solve(hpd, b),
                               rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(sla.eigh(hpd, eigvals_only=True, lower=False),
                               np.linalg.eigvalsh(hpd), rtol=1e-4)


def test_derivatives():
    check_grads(ssp.erfc, (X,), order=2)
    check_grads(ssp.ndtr, (X,), order=1)
    check_grads(lambda v: norm.logpdf(v, 0.5, 2.0), (X,), order=2)
    check_grads(ssp.xlogy, (POS, POS), order=1)
    a = RNG.standard_normal((3, 3))
    spd = a @ a.T + 3 * np.eye(3)
    check_grads(lambda m, v: sla.cho_solve(sla.cho_factor(m, lower=True), v),
                (spd, RNG.standard_normal(3)), order=1)


def test_complex_inputs():
    """xlogy/logit follow the complex formulas; entr (defined by the sign) refuses."""
    import spmd.scipy.special as sps
    from spmd.errors import DTypeError

    z = np.array([1 + 1j, 0.5 - 2j], np.complex64)
    np.testing.assert_allclose(np.asarray(sps.xlogy(z, z)), z * np.log(z), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sps.logit(z)), np.log(z / (1 - z)), rtol=1e-5)
    with pytest.raises(DTypeError, match="complex input"):
        sps.entr(z)
