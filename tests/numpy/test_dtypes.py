"""Default dtypes, input canonicalisation, weak typing and astype (JAX rules)."""

import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import (  # noqa: E402
    BOOL, F16, F32, I32, assert_array, check, mode, rand, run, same,  # noqa: F401
)

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402

I8, U8, I16 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)


def test_default_dtypes_are_32_bit():
    assert snp.array([1.0, 2.0]).dtype == np.float32
    assert snp.array([1, 2]).dtype == np.int32
    assert snp.array(1).dtype == np.int32
    assert snp.array(1.0).dtype == np.float32
    assert snp.array(True).dtype == np.bool_
    assert snp.arange(3).dtype == np.int32
    assert snp.arange(3.0).dtype == np.float32
    assert snp.zeros(2).dtype == np.float32
    assert snp.ones((2, 2)).dtype == np.float32
    assert snp.eye(2).dtype == np.float32
    assert snp.linspace(0, 1, 3).dtype == np.float32
    assert snp.full(2, 3).dtype == np.int32


@pytest.mark.parametrize("np_dtype,want", [(np.float64, F32), (np.int64, I32),
                                           (np.float32, F32), (np.int32, I32),
                                           (np.bool_, BOOL), (np.float16, F16),
                                           (np.int8, I8), (np.uint8, U8)], ids=str)
def test_numpy_inputs_are_canonicalised(mode, np_dtype, want):
    x = np.arange(6).reshape(2, 3).astype(np_dtype)
    out = run(lambda a: a, (x,), mode)
    assert_array(out, x, want)
    # numpy inputs straight into an spmd.numpy function
    out = snp.reshape(x, (-1,))
    assert isinstance(out, spmd.Array) and out.dtype == want
    assert snp.asarray(x).dtype == want and snp.array(x).dtype == want


def test_functions_accept_raw_numpy_inputs():
    out = snp.sin(np.linspace(0, 1, 5))  # float64 input
    assert isinstance(out, spmd.Array) and out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), np.sin(np.linspace(0, 1, 5)), rtol=1e-6)
    out = snp.add(np.arange(3), 1)  # int64 input, weak int scalar
    assert out.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3])
    out = snp.maximum(np.ones(3, np.float32), np.arange(3))
    assert out.dtype == np.float32


@pytest.mark.parametrize("arg,want", [(2.0, F32), (3, I32), (True, BOOL)], ids=str)
def test_python_scalar_arguments_to_jit(arg, want):
    out = spmd.jit(lambda a: a)(arg)
    assert isinstance(out, spmd.Array) and out.shape == () and out.dtype == want
    assert np.asarray(out) == arg
    # a Python scalar argument is weakly typed: it does not widen a float16 array
    out = spmd.jit(lambda a, h: h * a)(arg, np.ones(2, np.float16))
    assert out.dtype == F16


# (label, fn, input dtype, expected dtype)
WEAK_CASES = [
    ("f32*2.0", lambda x: x * 2.0, F32, F32),
    ("2.0*f32", lambda x: 2.0 * x, F32, F32),
    ("f32+1", lambda x: x + 1, F32, F32),
    ("i32+1.5", lambda x: x + 1.5, I32, F32),
    ("1.5+i32", lambda x: 1.5 + x, I32, F32),
    ("i32+1", lambda x: x + 1, I32, I32),
    ("1-i32", lambda x: 1 - x, I32, I32),
    ("i32*True", lambda x: x * True, I32, I32),
    ("f16+1.0", lambda x: x + 1.0, F16, F16),
    ("1.0+f16", lambda x: 1.0 + x, F16, F16),
    ("f16*2", lambda x: x * 2, F16, F16),
    ("i8+1", lambda x: x + 1, I8, I8),
    ("u8+1", lambda x: x + 1, U8, U8),
    ("i8*2.0", lambda x: x * 2.0, I8, F32),
    ("bool+1", lambda x: x + 1, BOOL, I32),
    ("bool*1.5", lambda x: x * 1.5, BOOL, F32),
    ("bool&True", lambda x: x & True, BOOL, BOOL),
    ("f32<1", lambda x: x < 1, F32, BOOL),
    ("i32/2", lambda x: x / 2, I32, F32),
    ("i32**2", lambda x: x ** 2, I32, I32),
    ("f16**2", lambda x: x ** 2, F16, F16),
    ("snp.add(i32,1.0)", lambda x: snp.add(x, 1.0) if not isinstance(x, np.ndarray)
     else np.add(x, 1.0), I32, F32),
    ("snp.multiply(f16,2)", lambda x: snp.multiply(x, 2) if not isinstance(x, np.ndarray)
     else np.multiply(x, 2), F16, F16),
    ("snp.where(bool, i32, 1.5)", lambda x: (snp if not isinstance(x, np.ndarray) else np)
     .where(x > 0, x, 1.5), I32, F32),
    ("snp.maximum(f16,0.0)", lambda x: (snp if not isinstance(x, np.ndarray) else np)
     .maximum(x, 0.0), F16, F16),
]


@pytest.mark.parametrize("label,fn,dtype,want", WEAK_CASES, ids=[c[0] for c in WEAK_CASES])
def test_python_scalars_are_weakly_typed(mode, label, fn, dtype, want):
    x = rand((2, 3), dtype, 1, 0, 5)
    same(fn, x, mode=mode, dtype=want, rtol=1e-5, atol=1e-6)


# array-array promotion (JAX's lattice; 32-bit mode)
PAIRS = [
    (F32, I32, F32), (I32, F32, F32), (BOOL, I32, I32), (I32, BOOL, I32),
    (F16, F32, F32), (I8, I32, I32), (U8, I32, I32), (I8, U8, I16),
    (BOOL, BOOL, BOOL), (BOOL, F32, F32), (F16, I32, F16), (I8, F16, F16),
]


@pytest.mark.parametrize("da,db,want", PAIRS, ids=[f"{a}+{b}" for a, b, _ in PAIRS])
def test_array_array_promotion(mode, da, db, want):
    a, b = rand((2, 3), da, 2, 0, 5), rand((3,), db, 3, 0, 5)
    op = (lambda x, y: x | y) if da == db == BOOL else (lambda x, y: x + y)
    check(op, op, a, b, mode=mode, dtype=want, rtol=1e-5, atol=1e-6)


def test_numpy_scalars_are_not_weak(mode):
    # numpy scalars carry a dtype (JAX: they are not weakly typed)
    xi = rand((3,), I32, 4)
    check(lambda a: a * np.float32(2.0), lambda a: a * np.float32(2.0), xi,
          mode=mode, dtype=F32)
    xh = rand((3,), F16, 5)
    check(lambda a: a + np.float32(1.0), lambda a: a + np.float32(1.0), xh,
          mode=mode, dtype=F32, rtol=1e-3, atol=1e-3)


def test_numpy_scalar_and_array_on_the_left_defer_to_spmd():
    x = snp.arange(3)
    out = np.float32(2.0) * x
    assert isinstance(out, spmd.Array) and out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), [0.0, 2.0, 4.0])
    out = np.ones(3, np.float32) + x
    assert isinstance(out, spmd.Array) and out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), [1.0, 2.0, 3.0])


# ---------------------------------------------------------------------------
# astype

ASTYPE = [
    (F32, np.int32, I32, (-20, 20)),     # truncates toward zero
    (F32, bool, BOOL, None),
    (F32, np.float16, F16, None),
    (F32, np.uint8, U8, (0, 200)),
    (I32, np.float32, F32, None),
    (I32, bool, BOOL, None),
    (I32, np.int8, I8, None),
    (I32, np.float16, F16, None),
    (BOOL, np.float32, F32, None),
    (BOOL, np.int32, I32, None),
    (F16, np.float32, F32, None),
    (I32, np.int32, I32, None),
]


@pytest.mark.parametrize("src,dst,want,rng", ASTYPE,
                         ids=[f"{s}->{np.dtype(d)}" for s, d, _, _ in ASTYPE])
def test_astype(mode, src, dst, want, rng):
    x = rand((3, 4), src, 6, *(rng or (None, None)))
    if src == F32 and dst is bool:
        x[0, :2] = 0.0
    check(lambda a: a.astype(dst), lambda a: a.astype(dst), x, mode=mode, dtype=want,
          upcast=False)
    check(lambda a: snp.astype(a, dst) if hasattr(snp, "astype") else a.astype(dst),
          lambda a: a.astype(dst), x, mode=mode, dtype=want, upcast=False)


def test_astype_negative_float_truncates_toward_zero(mode):
    x = np.array([-2.7, -0.5, 0.5, 2.7], np.float32)
    check(lambda a: a.astype(np.int32), lambda a: a.astype(np.int32), x, mode=mode, dtype=I32)


def test_requesting_64_bit_dtype_without_x64_gives_32_bit(mode):
    x = rand((3,), F32, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run(lambda a: a.astype(np.float64), (x,), mode)
        assert out.dtype == np.float32
        out = run(lambda a: snp.asarray(a, dtype=np.float64), (x,), mode)
        assert out.dtype == np.float32
        assert snp.zeros(2, dtype=np.int64).dtype == np.int32
        assert snp.arange(3, dtype=np.int64).dtype == np.int32


def test_enable_x64_mode_switch():
    f = spmd.jit(lambda a: a * 2)
    x = np.arange(3, dtype=np.float64)
    assert f(x).dtype == np.float32
    spmd.config.update("enable_x64", True)
    try:
        assert snp.array([1.0, 2.0]).dtype == np.float64
        assert snp.arange(3).dtype == np.int64
        assert snp.asarray(np.arange(3)).dtype == np.int64
        out = f(x)  # the same jitted function must not reuse the 32-bit trace
        assert out.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(out), x * 2)
        assert (snp.ones(2, dtype=np.float32) * 2.0).dtype == np.float32  # still weak
    finally:
        spmd.config.update("enable_x64", False)
    assert snp.array([1.0, 2.0]).dtype == np.float32
    assert snp.arange(3).dtype == np.int32
    assert f(x).dtype == np.float32
