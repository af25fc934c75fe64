"""Complex arrays through spmd.numpy (complex64; complex128 under x64) against numpy,
eagerly and under jit."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import C64, F32, BOOL, check, mode  # noqa: E402,F401

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import errors  # noqa: E402

C128 = np.dtype(np.complex128)


def crand(shape, seed=0, dtype=np.complex64):
    r = np.random.default_rng(seed)
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(dtype)


UNARY = {  # name -> result dtype for a complex64 input
    "exp": C64, "log": C64, "sqrt": C64, "sin": C64, "cos": C64, "tan": C64,
    "tanh": C64, "sinh": C64, "cosh": C64, "expm1": C64, "log1p": C64,
    "negative": C64, "square": C64, "conj": C64, "conjugate": C64,
    "real": F32, "imag": F32, "abs": F32, "absolute": F32, "angle": F32,
    "isfinite": BOOL, "isnan": BOOL, "isinf": BOOL,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, mode):
    x = crand((3, 4))
    check(getattr(snp, name), getattr(np, name), x, mode=mode, dtype=UNARY[name],
          rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "power", "equal",
                                "not_equal", "less", "less_equal", "greater",
                                "greater_equal"])
def test_binary(op, mode):
    x, y = crand((3, 4), 1), crand((4,), 2)
    y[1] = x[0, 1]  # a tie, for the comparisons
    y2 = y.copy()
    y2[2] = x[1, 2].real + 5j  # equal real parts: the imaginary part decides
    x[1, 2] = x[1, 2].real + 1j
    dt = BOOL if op in ("equal", "not_equal", "less", "less_equal", "greater",
                        "greater_equal") else C64
    check(getattr(snp, op), getattr(np, op), x, y2, mode=mode, dtype=dt, rtol=1e-4,
          atol=1e-5)


def test_operators_and_methods(mode):
    x = crand((2, 3))
    f = lambda a: (a * 2.0 + 1j) / (a - 3) ** 2 + abs(a) + a.real - a.imag * a.conj()  # noqa
    check(f, f, x, mode=mode, dtype=C64, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,dtype", [("sum", C64), ("mean", C64), ("prod", C64), ("var", F32),
                                        ("std", F32), ("cumsum", C64)])
def test_reductions(name, dtype, mode):
    x = crand((3, 5))
    check(lambda a: getattr(snp, name)(a, axis=1), lambda a: getattr(np, name)(a, axis=1),
          x, mode=mode, dtype=dtype, rtol=1e-5, atol=1e-5)


def test_products(mode):
    a, b, v = crand((3, 4), 1), crand((4, 2), 2), crand((4,), 3)
    check(snp.matmul, np.matmul, a, b, mode=mode, dtype=C64, rtol=1e-5, atol=1e-5)
    check(snp.dot, np.dot, a, v, mode=mode, dtype=C64, rtol=1e-5, atol=1e-5)
    check(snp.vdot, np.vdot, v, v, mode=mode, dtype=C64, rtol=1e-5, atol=1e-5)
    check(lambda p, q: snp.einsum("ij,jk->ik", p, q), lambda p, q: np.einsum("ij,jk->ik", p, q),
          a, b, mode=mode, dtype=C64, rtol=1e-5, atol=1e-5)
    check(lambda p: snp.linalg.norm(p), np.linalg.norm, a, mode=mode, dtype=F32, rtol=1e-5)


def test_creation_and_promotion():
    assert snp.array(1 + 2j).dtype == C64
    assert snp.zeros(3, snp.complex64).dtype == C64
    assert snp.ones(2, complex).dtype == C64  # complex128 narrows without x64
    assert snp.asarray(np.ones(2, np.complex128)).dtype == C64
    assert (snp.ones(2, np.float32) + 1j).dtype == C64  # a weak complex scalar
    assert (snp.arange(3) * 1j).dtype == C64
    assert (snp.ones(2, np.float16) + snp.ones(2, np.complex64)).dtype == C64
    np.testing.assert_array_equal(np.asarray(snp.arange(3) * 1j), np.arange(3) * 1j)
    assert complex(snp.array(1 + 2j)) == 1 + 2j
    assert snp.iscomplexobj(snp.array(1j)) and snp.isrealobj(snp.ones(2))


def test_x64_complex128():
    try:
        spmd.config.update("enable_x64", True)
        x = crand((3,), dtype=np.complex128)
        out = spmd.jit(lambda a: snp.exp(a) * 2 + 1j)(x)
        assert out.dtype == C128
        np.testing.assert_allclose(np.asarray(out), np.exp(x) * 2 + 1j, rtol=1e-12)
        assert (snp.ones(2, np.float64) + snp.ones(2, np.complex64)).dtype == C128
        assert (snp.ones(2, np.float32) + 1j).dtype == C64  # f32 with weak complex: c64
        assert snp.abs(snp.asarray(x)).dtype == np.float64
    finally:
        spmd.config.update("enable_x64", False)


def test_real_of_real_arrays():
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(snp.real(x)), x)
    np.testing.assert_array_equal(np.asarray(snp.imag(x)), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(snp.conj(x)), x)
    np.testing.assert_allclose(np.asarray(snp.angle(np.array([-1.0, 1.0]), deg=True)),
                               [180.0, 0.0])


@pytest.mark.parametrize("fn,match", [
    (lambda a: a.astype(np.float32), "imaginary"),
    (lambda a: snp.asarray(a, dtype=np.float32), "imaginary"),
    (lambda a: snp.floor(a), "numpy and JAX refuse it too"),
    (lambda a: snp.ceil(a), "numpy and JAX refuse it too"),
    (lambda a: snp.remainder(a, a), "numpy and JAX refuse them"),
    (lambda a: snp.fmod(a, a), "numpy refuses it too"),
    (lambda a: snp.clip(a, 0, 1), "a is complex.*no order to clip by"),
    (lambda a: snp.clip(snp.real(a), 0, 1j), "max is complex"),
    (lambda a: snp.median(a), "JAX refuses it too"),
    (lambda a: snp.quantile(a, 0.3), "JAX refuses it too"),
    (lambda a: snp.arctan2(a, a), "atan2: operand dtype complex64"),
    (lambda a: spmd.lax.round(a), "round: operand dtype complex64"),
], ids=["astype", "asarray", "floor", "ceil", "remainder", "fmod", "clip", "clip_max", "median",
        "quantile", "arctan2", "lax.round"])
def test_unsupported_raise_instead_of_dropping_imag(fn, match, mode):
    """Nothing silently drops an imaginary part or orders complex numbers where JAX
    refuses to (each raises, naming why)."""
    x = crand((4,))
    with pytest.raises(errors.DTypeError, match=match):
        fn(snp.asarray(x)) if mode == "eager" else spmd.jit(fn)(x)


def test_astype_message_names_the_fix():
    with pytest.raises(errors.DTypeError, match=r"snp.real\(x\)"):
        snp.asarray(crand((2,))).astype(np.float32)


@pytest.mark.parametrize("m", ["full", "same", "valid"])
def test_convolve_correlate(m, mode):
    a, b = crand((3,), 1), crand((5,), 2)
    for x, y in ((a, b), (b, a)):  # numpy slides the shorter operand
        check(lambda p, q: snp.convolve(p, q, mode=m), lambda p, q: np.convolve(p, q, mode=m),
              x, y, mode=mode, dtype=C64, rtol=1e-5, atol=1e-5)
        check(lambda p, q: snp.correlate(p, q, mode=m),
              lambda p, q: np.correlate(p, q, mode=m), x, y, mode=mode, dtype=C64,
              rtol=1e-5, atol=1e-5)


def test_isclose_sort(mode):
    a = crand((6,), 4)
    b = a.copy()
    b[::2] += 1e-3j
    check(snp.isclose, np.isclose, a, b, mode=mode, dtype=BOOL)
    a[1] = a[3].real + 2j  # a tie on the real part: the imaginary part orders
    check(snp.sort, np.sort, a, mode=mode, dtype=C64)


@pytest.mark.parametrize("fn", [
    lambda: snp.asarray(np.array([1j]), dtype=np.float32),
    lambda: snp.array([1j, 2], dtype=np.float32),
    lambda: snp.full(2, 1j, np.float32),
    lambda: snp.full((2,), snp.asarray(1j), np.int32),
    lambda: snp.zeros(2).at[0].set(1j),
], ids=["asarray-numpy", "array-list", "full-scalar", "full-array", "at-set"])
def test_creation_refuses_dropping_imag(fn):
    with pytest.raises(errors.DTypeError, match="imaginary part"):
        fn()


def test_creation_with_complex_fill():
    np.testing.assert_array_equal(np.asarray(snp.full(2, 1j)), [1j, 1j])
    assert snp.full(2, 1j).dtype == C64
    assert snp.full(2, 1.5, snp.complex64).dtype == C64
    np.testing.assert_array_equal(np.asarray(snp.array([1j, 2])), [1j, 2])


def test_nan_functions_and_real_only_ufuncs(mode):
    z = crand((5,), 8)
    z[1] = np.nan + 2j
    z[3] = np.inf - 1j
    check(snp.nan_to_num, np.nan_to_num, z, mode=mode, dtype=C64, upcast=False)
    check(snp.nansum, np.nansum, z, mode=mode, dtype=C64, rtol=1e-5, upcast=False)
    for name in ("trunc", "isposinf", "isneginf"):
        with pytest.raises(errors.DTypeError, match="complex input"):
            getattr(snp, name)(snp.asarray(z)) if mode == "eager" else \
                spmd.jit(getattr(snp, name))(z)


def test_cov_is_hermitian_and_hypot_refuses(mode):
    x = crand((2, 5), 11)
    check(snp.cov, np.cov, x, mode=mode, dtype=C64, rtol=1e-5, atol=1e-5)
    with pytest.raises(errors.DTypeError, match="complex input"):
        snp.hypot(snp.asarray(x), 1.0) if mode == "eager" else spmd.jit(snp.hypot)(x, 1.0)


@pytest.mark.parametrize("name", ["log2", "log10", "exp2", "arcsinh", "arccosh", "arctanh",
                                  "sinc"])
def test_more_unary(name, mode):
    check(getattr(snp, name), getattr(np, name), crand((6,), 12), mode=mode, dtype=C64,
          rtol=2e-5, atol=2e-5)


def test_float_power_and_heaviside(mode):
    z = crand((4,), 13)
    check(lambda a: snp.float_power(a, 2), lambda a: np.float_power(a, 2).astype(C64), z,
          mode=mode, dtype=C64, rtol=1e-5, atol=1e-5)
    with pytest.raises(errors.DTypeError, match="complex input"):
        snp.heaviside(snp.asarray(z), 0.5) if mode == "eager" else \
            spmd.jit(snp.heaviside)(z, 0.5)
