"""Dtype rules of the compiler layer: JAX's promotion table (weak Python scalars
included), canonicalisation of 64-bit inputs, and the x64 switch.

The expected results are JAX's (``jnp.promote_types`` / ``jnp.result_type`` with
x64 disabled), written out by hand: JAX is not a dependency of the tests.
"""

import itertools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.core import dtypes

B, U8, I8, I16, I32, F16, F32 = map(np.dtype, ("bool", "uint8", "int8", "int16", "int32",
                                               "float16", "float32"))
I64, U32, U64, F64 = map(np.dtype, ("int64", "uint32", "uint64", "float64"))
STRONG = [B, U8, I8, I32, F16, F32]

# JAX's promote_types for strong operands (x64 off), one row per unordered pair.
STRONG_TABLE = {
    (B, B): B, (B, U8): U8, (B, I8): I8, (B, I32): I32, (B, F16): F16, (B, F32): F32,
    (U8, U8): U8, (U8, I8): I16, (U8, I32): I32, (U8, F16): F16, (U8, F32): F32,
    (I8, I8): I8, (I8, I32): I32, (I8, F16): F16, (I8, F32): F32,
    (I32, I32): I32, (I32, F16): F16, (I32, F32): F32,
    (F16, F16): F16, (F16, F32): F32,
    (F32, F32): F32,
}

# A strong array with a weak Python scalar: (dtype, weak) of JAX's result.
# Python int is the weak i*, Python float the weak f*.
WEAK_INT_TABLE = {B: (I32, True), U8: (U8, False), I8: (I8, False), I32: (I32, False),
                  F16: (F16, False), F32: (F32, False)}
WEAK_FLOAT_TABLE = {B: (F32, True), U8: (F32, True), I8: (F32, True), I32: (F32, True),
                    F16: (F16, False), F32: (F32, False)}


def arr(dtype, shape=(2,)):
    return snp.asarray(np.ones(shape, dtype))


def test_strong_table_is_complete():
    pairs = {tuple(sorted((a, b), key=STRONG.index)) for a in STRONG for b in STRONG}
    assert pairs == set(STRONG_TABLE)


@pytest.mark.parametrize("a, b", list(itertools.product(STRONG, STRONG)),
                         ids=lambda d: str(d))
def test_result_type_strong_pairs(a, b):
    expected = STRONG_TABLE.get((a, b)) or STRONG_TABLE[(b, a)]
    assert dtypes.result_type((a, False), (b, False)) == (expected, False)


@pytest.mark.parametrize("a, b", [p for p in itertools.product(STRONG, STRONG)
                                  if p != (B, B)], ids=lambda d: str(d))
def test_addition_promotes_like_jax(a, b):
    expected = STRONG_TABLE.get((a, b)) or STRONG_TABLE[(b, a)]
    out = arr(a) + arr(b)
    assert out.dtype == expected and not out.weak_type
    jitted = spmd.jit(lambda x, y: x + y)(np.ones(2, a), np.ones(2, b))
    assert jitted.dtype == expected


@pytest.mark.parametrize("dtype", STRONG, ids=str)
def test_weak_python_int(dtype):
    expected = WEAK_INT_TABLE[dtype]
    assert dtypes.result_type((dtype, False), (I32, True)) == expected
    for out in (arr(dtype) * 2, 2 * arr(dtype), spmd.jit(lambda x: x * 2)(np.ones(2, dtype))):
        assert (out.dtype, out.weak_type) == expected


@pytest.mark.parametrize("dtype", STRONG, ids=str)
def test_weak_python_float(dtype):
    expected = WEAK_FLOAT_TABLE[dtype]
    assert dtypes.result_type((dtype, False), (F32, True)) == expected
    for out in (arr(dtype) * 2.0, 2.0 * arr(dtype),
                spmd.jit(lambda x: x * 2.0)(np.ones(2, dtype))):
        assert (out.dtype, out.weak_type) == expected


def test_weak_scalars_together():
    assert dtypes.result_type((I32, True), (F32, True)) == (F32, True)
    assert dtypes.result_type((I32, True), (I32, True)) == (I32, True)
    assert dtypes.result_type((B, True), (I32, True)) == (I32, True)
    out = spmd.jit(lambda x, y: x * y)(2, 3.0)
    assert (out.dtype, out.weak_type) == (F32, True)
    out = spmd.jit(lambda x, y: x + y)(2, 3)
    assert (out.dtype, out.weak_type, int(out)) == (I32, True, 5)


def test_weak_scalar_keeps_small_float():
    x = arr(F16)
    assert (x + 1.5).dtype == F16  # not float32: the Python scalar adapts
    assert (x + np.float32(1.5)).dtype == F32  # a numpy scalar is strong


def test_python_scalar_avals():
    from spmd.compiler.core.trace import get_aval
    assert get_aval(1.0) == spmd.ShapedArray((), F32, True)
    assert get_aval(1) == spmd.ShapedArray((), I32, True)
    assert get_aval(True).dtype == B
    assert get_aval(np.float32(1.0)) == spmd.ShapedArray((), F32, False)


# ----------------------------------------------------- canonicalisation, x64

@pytest.mark.parametrize("given, expected", [(F64, F32), (I64, I32), (U64, U32),
                                             (F32, F32), (F16, F16), (I8, I8), (B, B)])
def test_jit_canonicalises_64_bit_inputs(given, expected):
    f = spmd.jit(lambda x: x)
    out = f(np.ones(3, given))
    assert out.dtype == expected
    assert spmd.make_jaxpr(lambda x: x)(np.ones(3, given)).in_avals[0].dtype == expected
    assert np.asarray(out).dtype == expected


def test_float64_input_computes_in_float32():
    x = np.array([1.0 + 1e-10, 2.0])  # float64; the 1e-10 is lost in float32
    out = spmd.jit(lambda v: v - 1.0)(x)
    assert out.dtype == F32
    np.testing.assert_array_equal(np.asarray(out), np.float32([0.0, 1.0]))


def test_canonicalize_rejects_unsupported():
    # complex64/128 are supported; the extended-precision complex is not.
    with pytest.raises(spmd.errors.DTypeError, match="unsupported dtype complex"):
        dtypes.canonicalize(np.clongdouble)
    with pytest.raises(spmd.errors.DTypeError):
        spmd.jit(lambda x: x)(np.array(["a"]))


def test_x64_switch():
    f = spmd.jit(lambda x: x * 2.0)
    x = np.ones(2)
    assert f(x).dtype == F32
    try:
        spmd.config.update("enable_x64", True)
        assert dtypes.x64_enabled()
        out = f(x)  # the cache key includes the mode: this retraces
        assert out.dtype == F64
        assert spmd.jit(lambda v: v)(np.ones(2, I64)).dtype == I64
        assert dtypes.result_type((I32, False), (F32, True)) == (F64, True)
        assert (arr(F32) * 2.0).dtype == F32  # weak scalars still adapt
        assert snp.asarray(1.5).dtype == F64
        assert dtypes.default_int() == I64
    finally:
        spmd.config.update("enable_x64", False)
    assert not dtypes.x64_enabled()
    assert f(x).dtype == F32
    assert snp.asarray(1.5).dtype == F32


def test_unknown_config_option():
    with pytest.raises(spmd.errors.ArgumentError, match="enable_x64"):
        spmd.config.update("enable_x46", True)


def test_complex_promotion_lattice():
    """bool < int < float < complex (JAX's lattice); widths as in JAX."""
    C64, C128 = np.dtype(np.complex64), np.dtype(np.complex128)
    assert dtypes.result_type((F32, False), (C64, False)) == (C64, False)
    assert dtypes.result_type((I32, False), (C64, False)) == (C64, False)
    assert dtypes.result_type((C64, False), (F32, True)) == (C64, False)  # weak float adapts
    assert dtypes.result_type((F32, False), (C64, True)) == (C64, False)  # weak complex: c64
    assert dtypes.result_type((I32, False), (C64, True)) == (C64, True)
    assert dtypes.python_scalar_dtype(1j) == C64
    assert dtypes.canonicalize(C128) == C64  # narrowed without x64
    try:
        spmd.config.update("enable_x64", True)
        assert dtypes.result_type((F64, False), (C64, False)) == (C128, False)
        assert dtypes.result_type((F32, False), (C64, True)) == (C64, False)
        assert dtypes.python_scalar_dtype(1j) == C128
    finally:
        spmd.config.update("enable_x64", False)
