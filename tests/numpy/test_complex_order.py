"""Complex inputs to the functions JAX defines on them through an order or by
parts: max/min/argmax/argmin and maximum/minimum (lexicographic on (real, imag)),
sign (z/|z|), round (each part), floor_divide (JAX's complex rule), cumprod,
arcsin/arccos/arctan and logistic.  Oracles: numpy on complex arrays, eagerly and
under jit."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import C64, check, mode  # noqa: E402,F401

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import lax  # noqa: E402


def _ties():
    """Real parts that tie, so the imaginary parts decide the order."""
    z = np.array([1 + 2j, 1 + 3j, -2 + 9j, 0.5 - 1j, 1 + 3j, -2 - 9j], np.complex64)
    w = np.array([1 + 3j, 1 + 1j, -2 + 9j, 0.25 + 5j, 2 + 0j, -2 - 8j], np.complex64)
    return z, w


def test_maximum_minimum_are_lexicographic(mode):
    z, w = _ties()
    check(snp.maximum, np.maximum, z, w, mode=mode, dtype=C64, upcast=False)
    check(snp.minimum, np.minimum, z, w, mode=mode, dtype=C64, upcast=False)
    check(lax.max, np.maximum, z, w, mode=mode, dtype=C64, upcast=False)
    check(lax.min, np.minimum, z, w, mode=mode, dtype=C64, upcast=False)
    check(snp.fmax, np.fmax, z, w, mode=mode, dtype=C64, upcast=False)


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin", "ptp"])
def test_reductions_are_lexicographic(name, mode):
    z, w = _ties()
    m = np.stack([z, w])
    want_dtype = np.dtype(np.int32) if name.startswith("arg") else C64
    check(getattr(snp, name), getattr(np, name), z, mode=mode, dtype=want_dtype, upcast=False)
    for axis in (0, 1):
        check(lambda a, ax=axis: getattr(snp, name)(a, axis=ax),
              lambda a, ax=axis: getattr(np, name)(a, axis=ax), m, mode=mode,
              dtype=want_dtype, upcast=False)


def test_sign_is_z_over_abs(mode):
    z = np.array([3 + 4j, 0j, -2j, -1 + 0j, 1e-30 + 1e-30j], np.complex64)
    want = np.where(z == 0, 0, z / np.where(z == 0, 1, np.abs(z)))
    check(snp.sign, lambda a: want, z, mode=mode, dtype=C64, upcast=False)
    check(lax.sign, lambda a: want, z, mode=mode, dtype=C64, upcast=False)


def test_sign_with_an_infinite_part_is_numpys(mode):
    # x / |x| is inf / inf = nan there; numpy gives the unit along the infinite part.
    inf, nan = np.inf, np.nan
    z = np.array([complex(inf, 0), complex(-inf, 5), complex(0, inf), complex(3, -inf),
                  complex(inf, nan), complex(inf, inf), complex(nan, 1), 3 + 4j], np.complex64)
    with np.errstate(invalid="ignore"):
        want = np.sign(z)
    assert want[:5].tolist() == [1, -1, 1j, -1j, 1]  # numpy's rule, as this test assumes
    with np.errstate(invalid="ignore"):  # numpy warns on the NaN entries, and so do we
        check(snp.sign, lambda a: want, z, mode=mode, dtype=C64, upcast=False)


@pytest.mark.parametrize("decimals", [0, 1, -1])
def test_round_rounds_each_part(decimals, mode):
    z = np.array([1.25 + 2.5j, -3.55 + 0.45j, 12.5 - 17.5j, 0.5 - 1.5j], np.complex64)
    check(lambda a: snp.round(a, decimals), lambda a: np.round(a, decimals), z, mode=mode,
          dtype=C64, upcast=False)


def test_floor_divide_is_the_floor_of_the_real_quotient(mode):
    z, w = _ties()
    want = np.floor((z.astype(np.complex128) / w).real) + 0j
    check(snp.floor_divide, lambda a, b: want, z, w, mode=mode, dtype=C64)
    check(lambda a, b: a // b, lambda a, b: want, z, w, mode=mode, dtype=C64)


def test_cumprod(mode):
    z = (np.arange(6).reshape(2, 3) * 0.3 + 1j * np.arange(6).reshape(2, 3)[::-1] * 0.2 + 0.5)
    z = z.astype(np.complex64)
    for axis in (0, 1):
        check(lambda a, ax=axis: snp.cumprod(a, axis=ax),
              lambda a, ax=axis: np.cumprod(a, axis=ax), z, mode=mode, dtype=C64, rtol=1e-5)
    check(lambda a: lax.cumprod(a, 1, reverse=True),
          lambda a: np.cumprod(a[:, ::-1], axis=1)[:, ::-1], z, mode=mode, dtype=C64)


@pytest.mark.parametrize("name", ["arcsin", "arccos", "arctan"])
def test_inverse_trigonometric(name, mode):
    z = np.array([0.3 + 0.2j, -1.5 + 0.5j, 2.0 - 3.0j, -0.1 - 0.9j, 4j], np.complex64)
    check(getattr(snp, name), getattr(np, name), z, mode=mode, dtype=C64, rtol=2e-5)


def test_logistic(mode):
    z = np.array([0.3 + 0.2j, -1.5 + 0.5j, 2.0 - 3.0j, -0.1 - 0.9j], np.complex64)
    want = lambda a: 1 / (1 + np.exp(-a))  # noqa: E731
    check(lax.logistic, want, z, mode=mode, dtype=C64, rtol=2e-5)
    check(spmd.nn.sigmoid, want, z, mode=mode, dtype=C64, rtol=2e-5)
