"""Autodiff of complex functions against finite differences and JAX's convention.

JAX's convention (its autodiff cookbook): transposes do not conjugate, so for a
real-valued ``f`` of ``z = x + iy``, ``grad(f)(z) = df/dx - i df/dy``; e.g.
``grad(lambda z: abs(z) ** 2)(3 + 4j) == 6 - 8j``.  For a holomorphic ``f``,
``grad(f, holomorphic=True)(z) == f'(z)``.  A jvp is the real-linear directional
derivative ``(f(z + h t) - f(z - h t)) / 2h``.
"""

import numpy as np
import pytest

import spmd
import spmd.autodiff
import spmd.numpy as snp
from spmd import errors

H = 1e-3


def crand(shape, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(np.complex64)


def _f64(f, z):
    """``f`` evaluated at a complex128 point in x64 mode (a precise oracle)."""
    try:
        spmd.config.update("enable_x64", True)
        return np.asarray(f(np.asarray(z, np.complex128)))
    finally:
        spmd.config.update("enable_x64", False)


def fd_grad(f, z):
    """``df/dx - i df/dy`` per element by central differences (JAX's grad)."""
    z = np.asarray(z, np.complex128)
    g = np.zeros(z.shape, np.complex128)
    for idx in np.ndindex(z.shape):
        e = np.zeros(z.shape, np.complex128)
        e[idx] = H
        dx = (_f64(f, z + e) - _f64(f, z - e)) / (2 * H)
        dy = (_f64(f, z + 1j * e) - _f64(f, z - 1j * e)) / (2 * H)
        g[idx] = dx - 1j * dy
    return g


def fd_jvp(f, z, t):
    z, t = np.asarray(z, np.complex128), np.asarray(t, np.complex128)
    return (_f64(f, z + H * t) - _f64(f, z - H * t)) / (2 * H)


REAL_LOSSES = {
    "abs2": lambda z: snp.sum(snp.real(z) ** 2 + snp.imag(z) ** 2),
    "abs": lambda z: snp.sum(snp.abs(z)),
    "real_exp": lambda z: snp.sum(snp.real(snp.exp(z) * z)),
    "imag_log": lambda z: snp.sum(snp.imag(snp.log(z * z + 2))),
    "conj_mix": lambda z: snp.sum(snp.real(snp.conj(z) * snp.sin(z) / (z + 3))),
    "angle": lambda z: snp.sum(snp.angle(z) * snp.abs(z)),
    "matmul": lambda z: snp.abs(snp.sum(z @ snp.conj(z.T) @ z)),
    "var_mean": lambda z: snp.var(z) + snp.real(snp.mean(z * z)),
    "einsum": lambda z: snp.real(snp.einsum("ij,ij->", z, snp.exp(z))),
    "prod": lambda z: snp.abs(snp.prod(z * 0.7 + 0.2j)),
    # Functions JAX defines on complex numbers through an order or a principal branch.
    "arcsin": lambda z: snp.sum(snp.abs(snp.arcsin(z))),
    "arccos": lambda z: snp.sum(snp.real(snp.arccos(z) * z)),
    "arctan": lambda z: snp.sum(snp.imag(snp.arctan(z * 0.5))),
    "logistic": lambda z: snp.sum(snp.abs(spmd.lax.logistic(z))),
    "cumprod": lambda z: snp.abs(snp.sum(snp.cumprod(z * 0.5 + 0.3, axis=1))),
    "maximum": lambda z: snp.sum(snp.abs(snp.maximum(z, 0.5 * z + 0.1) * z)),
    "max": lambda z: snp.abs(snp.max(z, axis=0) * snp.sum(z)).sum(),
    "min": lambda z: snp.real(snp.min(z) * snp.sum(z)),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(REAL_LOSSES))
def test_grad_of_real_loss_matches_fd(name, jit):
    f = REAL_LOSSES[name]
    z = crand((2, 2), seed=3)
    g = (spmd.jit(spmd.grad(f)) if jit else spmd.grad(f))(z)
    assert g.dtype == np.complex64
    np.testing.assert_allclose(np.asarray(g), fd_grad(f, z), rtol=2e-3, atol=2e-3)


def test_jax_documented_value():
    # The autodiff cookbook's example: grad of |z|^2 at 3 + 4j is 6 - 8j.
    g = spmd.grad(lambda z: snp.real(z) ** 2 + snp.imag(z) ** 2)(np.complex64(3 + 4j))
    assert complex(g) == 6 - 8j
    assert complex(spmd.grad(snp.real)(np.complex64(1 + 1j))) == 1
    assert complex(spmd.grad(snp.imag)(np.complex64(1 + 1j))) == -1j


@pytest.mark.parametrize("fn,deriv", [(snp.exp, np.exp), (snp.sin, np.cos),
                                      (lambda z: z * z * z, lambda z: 3 * z * z),
                                      (lambda z: 1 / z, lambda z: -1 / z ** 2),
                                      (snp.sqrt, lambda z: 0.5 / np.sqrt(z)),
                                      (snp.arcsin, lambda z: 1 / np.sqrt(1 - z * z)),
                                      (snp.arccos, lambda z: -1 / np.sqrt(1 - z * z)),
                                      (snp.arctan, lambda z: 1 / (1 + z * z)),
                                      (spmd.lax.logistic,
                                       lambda z: np.exp(-z) / (1 + np.exp(-z)) ** 2)])
def test_holomorphic(fn, deriv):
    z = crand((3,), seed=5)
    want = deriv(z.astype(np.complex128))
    g = spmd.vmap(spmd.grad(fn, holomorphic=True))(z)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4)
    jf = spmd.jacfwd(fn, holomorphic=True)(z)
    jr = spmd.jacrev(fn, holomorphic=True)(z)
    np.testing.assert_allclose(np.asarray(jf), np.diag(want), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jr), np.diag(want), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["real_exp", "conj_mix", "matmul"])
def test_jvp_matches_fd(name):
    f = REAL_LOSSES[name]
    z, t = crand((2, 2), 1), crand((2, 2), 2)
    _, tan = spmd.jvp(f, (z,), (t,))
    np.testing.assert_allclose(np.asarray(tan), fd_jvp(f, z, t), rtol=2e-3, atol=2e-3)


def test_complex_output_jvp_and_vjp_are_transposes():
    """<ct, J t> == <J^T ct, t> under the unconjugated pairing Re(sum(a * b))."""
    f = lambda z: snp.conj(z) * snp.exp(z) + snp.real(z) * 1j  # noqa: E731 (not holomorphic)
    z, t, ct = crand((4,), 1), crand((4,), 2), crand((4,), 3)
    _, jt = spmd.jvp(f, (z,), (t,))
    np.testing.assert_allclose(np.asarray(jt), fd_jvp(f, z, t), rtol=2e-3, atol=2e-3)
    _, f_vjp = spmd.vjp(f, z)
    (jct,) = f_vjp(ct)
    lhs = np.sum(np.asarray(ct) * np.asarray(jt)).real
    rhs = np.sum(np.asarray(jct) * t).real
    np.testing.assert_allclose(lhs, rhs, rtol=1e-4)


def test_real_input_complex_intermediate():
    f = lambda x: snp.abs(snp.exp(1j * x) + x)  # noqa: E731
    x = np.float32(0.3)
    g = spmd.grad(f)(x)
    assert g.dtype == np.float32
    want = (_f64(f, x + H).real - _f64(f, x - H).real) / (2 * H)
    np.testing.assert_allclose(float(g), want, rtol=1e-3)


def test_complex_to_real_by_convert_is_refused_in_ad():
    with pytest.raises(errors.DTypeError, match="imaginary"):
        spmd.grad(lambda z: z.astype(np.float32))(np.complex64(1j))


def test_grad_errors():
    z = np.complex64(1 + 1j)
    with pytest.raises(spmd.autodiff.GradientError, match="holomorphic=True"):
        spmd.grad(snp.exp)(z)  # a complex output needs holomorphic=True
    with pytest.raises(spmd.autodiff.GradientError, match="complex inputs"):
        spmd.grad(lambda x: x * 1j, holomorphic=True)(np.float32(1.0))
    with pytest.raises(spmd.autodiff.GradientError, match="returns a complex value"):
        spmd.grad(snp.abs, holomorphic=True)(z)
    with pytest.raises(spmd.autodiff.GradientError, match="holomorphic=True"):
        spmd.jacfwd(snp.exp)(np.array([z]))
    with pytest.raises(spmd.autodiff.GradientError, match="holomorphic=True"):
        spmd.jacrev(snp.exp)(np.array([z]))
    with pytest.raises(spmd.autodiff.GradientError, match="real"):
        spmd.jvp(snp.sin, (np.float32(1.0),), (np.complex64(1j),))


def _loops(z):
    from spmd import lax

    def body(c, x):
        return c * x * 0.5 + 1j, snp.real(c)

    c, ys = lax.scan(body, z, snp.stack([z, z * 0.3]))
    c = lax.cond(True, lambda a: a * a, lambda a: -a, c)
    c = lax.fori_loop(0, 3, lambda i, a: a * 0.5 + 1j, c)
    c = spmd.checkpoint(lambda a: snp.sin(a) * snp.conj(a))(c)
    return snp.sum(snp.abs(c) ** 2) + snp.sum(ys)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grad_through_control_flow_and_checkpoint(jit):
    z = crand((2,), seed=9) * 0.5
    g = (spmd.jit(spmd.grad(_loops)) if jit else spmd.grad(_loops))(z)
    np.testing.assert_allclose(np.asarray(g), fd_grad(_loops, z), rtol=2e-3, atol=2e-3)


def test_vmap_of_complex_parts():
    z = crand((3, 2), seed=4)
    out = spmd.vmap(lambda a: snp.real(a) * snp.imag(a) + snp.conj(a) * a)(z)
    np.testing.assert_allclose(np.asarray(out), z.real * z.imag + np.conj(z) * z, rtol=1e-6)


def test_custom_rules_on_complex():
    @spmd.custom_jvp
    def f(z):
        return snp.exp(z)

    @f.defjvp
    def f_jvp(primals, tangents):
        y = snp.exp(primals[0])
        return y, y * tangents[0]

    @spmd.custom_vjp
    def g(z):
        return snp.exp(z)

    g.defvjp(lambda z: (snp.exp(z), snp.exp(z)), lambda r, ct: (ct * r,))
    z = np.complex64(0.5 + 1j)
    want = np.exp(0.5 + 1j)  # grad of Re(exp) is conj(conj(exp(z))) = exp(z)
    for h in (f, g):
        for gr in (spmd.grad(lambda v: snp.real(h(v))),
                   spmd.jit(spmd.grad(lambda v: snp.real(h(v))))):
            np.testing.assert_allclose(complex(gr(z)), want, rtol=1e-5)


def test_lax_complex_parts():
    from spmd import lax

    x, y = np.float32([1.0, -2.0]), np.float32([0.5, 3.0])
    z = lax.complex(x, y)
    assert z.dtype == np.complex64
    np.testing.assert_array_equal(np.asarray(z), x + 1j * y)
    np.testing.assert_array_equal(np.asarray(lax.real(z)), x)
    np.testing.assert_array_equal(np.asarray(lax.imag(z)), y)
    np.testing.assert_array_equal(np.asarray(lax.conj(z)), x - 1j * y)
    # complex(x, y) transposes to (real(ct), -imag(ct)) (JAX's rule): d/dx of
    # Re(ct * z) is Re(ct), d/dy is -Im(ct).
    ct = np.complex64(2 - 3j)
    gx, gy = spmd.grad(lambda a, b: snp.real(ct * lax.complex(a, b)), argnums=(0, 1))(
        np.float32(1.0), np.float32(2.0))
    assert (float(gx), float(gy)) == (2.0, 3.0)
    with pytest.raises(errors.DTypeError, match="not complex"):
        lax.real(x)
    with pytest.raises(errors.DTypeError, match="float32 or float64"):
        lax.complex(np.int32([1]), np.int32([2]))


def test_hessian_holomorphic_and_vjp_cotangent_check():
    z = crand((3,), seed=6)
    h = spmd.hessian(lambda v: snp.sum(v ** 3), holomorphic=True)(z)
    np.testing.assert_allclose(np.asarray(h), np.diag(6 * z.astype(np.complex128)), rtol=1e-5,
                               atol=1e-6)
    _, f_vjp = spmd.vjp(snp.sin, np.float32(1.0))
    with pytest.raises(spmd.autodiff.GradientError, match="primal is real"):
        f_vjp(np.complex64(1j))  # a complex cotangent for a real output would lose Im


def test_piecewise_constant_complex_functions_have_zero_derivative():
    """As in JAX: sign, round and floor_divide differentiate to zero (sign's rule is
    zero for every dtype), so only the other factors contribute."""
    z = crand((3,), seed=6)
    for fn in (snp.sign, lambda a: snp.round(a * 3), lambda a: a // (0.3 + 0.2j)):
        g = spmd.grad(lambda v: snp.sum(snp.real(fn(v) * 2.0)))(z)
        np.testing.assert_array_equal(np.asarray(g), np.zeros(3, np.complex64))
    g = spmd.grad(lambda v: snp.sum(snp.real(snp.sign(v) * v)))(z)
    np.testing.assert_allclose(np.asarray(g), z / np.abs(z), rtol=1e-6)  # d Re(s z) = s
