"""Elementwise functions and operators of spmd.numpy against numpy."""

import operator
import os
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import (  # noqa: E402
    BOOL, F16, F32, HYP, I32, MODES, check, mode, rand, rand_intlike,  # noqa: F401
    rand_nonzero, run, same, assert_array,
)

import spmd.numpy as snp  # noqa: E402
from spmd import lax  # noqa: E402

SHAPES = [(), (7,), (3, 4)]

# name -> (numpy oracle, input domain (low, high) or None for N(0, 1), rtol)
UNARY_FLOAT = {
    "exp": (np.exp, (-5, 5), 1e-5),
    "log": (np.log, (0.1, 10), 1e-5),
    "log1p": (np.log1p, (-0.9, 5), 1e-5),
    "expm1": (np.expm1, (-3, 3), 1e-5),
    "sqrt": (np.sqrt, (0, 10), 1e-5),
    "sin": (np.sin, (-6, 6), 1e-5),
    "cos": (np.cos, (-6, 6), 1e-5),
    "tan": (np.tan, (-1.3, 1.3), 1e-4),
    "tanh": (np.tanh, (-5, 5), 1e-5),
    "sinh": (np.sinh, (-5, 5), 1e-5),
    "cosh": (np.cosh, (-5, 5), 1e-5),
    "sign": (np.sign, None, 0),
    "floor": (np.floor, (-10, 10), 0),
    "ceil": (np.ceil, (-10, 10), 0),
    "round": (np.round, (-10, 10), 0),
    "square": (np.square, None, 1e-6),
    "abs": (np.abs, None, 0),
    "negative": (np.negative, None, 0),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY_FLOAT) + ["reciprocal", "rsqrt"])
def test_unary_float(mode, name, shape):
    if name == "reciprocal":
        x = rand_nonzero(shape, F32, seed=1)
        check(snp.reciprocal, np.reciprocal, x, mode=mode, dtype=F32)
        return
    if name == "rsqrt":
        x = rand(shape, F32, seed=1, low=0.1, high=10)
        check(lax.rsqrt, lambda a: 1 / np.sqrt(a), x, mode=mode, dtype=F32, rtol=1e-5)
        return
    ref, dom, rtol = UNARY_FLOAT[name]
    x = rand(shape, F32, seed=1, low=dom and dom[0], high=dom and dom[1])
    check(getattr(snp, name), ref, x, mode=mode, dtype=F32, rtol=rtol, atol=1e-6)


def test_sign_of_zero_and_round_half_to_even(mode):
    x = np.array([-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.5], np.float32)
    check(snp.round, np.round, x, mode=mode, dtype=F32, rtol=0, atol=0)
    check(snp.sign, np.sign, x, mode=mode, dtype=F32, rtol=0, atol=0)


# inexact functions promote integer inputs to float32
@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "tanh", "log1p"])
def test_unary_int_input_promotes_to_float32(mode, name):
    x = rand((5,), I32, seed=2, low=1, high=5)
    check(getattr(snp, name), getattr(np, name), x, mode=mode, dtype=F32, rtol=1e-5)


@pytest.mark.parametrize("name", ["abs", "sign", "square", "negative"])
def test_unary_int_keeps_int32(mode, name):
    x = rand((3, 4), I32, seed=3)
    check(getattr(snp, name), getattr(np, name), x, mode=mode, dtype=I32)


# ---------------------------------------------------------------------------
# binary functions


def _binary_inputs(name, dtypes, shapes, seed):
    (da, db), (sa, sb) = dtypes, shapes
    if name == "power":
        if np.dtype(da).kind == "f":
            a = rand(sa, da, seed, low=0.5, high=2.0)
        elif np.dtype(db).kind == "f":  # int base, float exponent: positive base
            a = rand(sa, da, seed, low=1, high=4)
        else:
            a = rand(sa, da, seed, low=-3, high=4)
        if np.dtype(db).kind == "f":
            b = rand(sb, db, seed + 1, low=-2.0, high=2.0)
        else:
            b = rand(sb, db, seed + 1, low=0, high=4)
        return a, b
    a = rand(sa, da, seed)
    b = rand_nonzero(sb, db, seed + 1) if name == "divide" else rand(sb, db, seed + 1)
    return a, b


BINARY_FUNCS = ["add", "subtract", "multiply", "divide", "power", "maximum",
                "minimum", "arctan2", "logaddexp"]
# (dtype a, dtype b) -> result dtype, for functions that follow type promotion
PROMOTE = {(F32, F32): F32, (I32, I32): I32, (I32, F32): F32, (F32, I32): F32,
           (BOOL, I32): I32}
INEXACT = {"divide", "arctan2", "logaddexp"}


@pytest.mark.parametrize("dtypes", list(PROMOTE), ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("name", BINARY_FUNCS)
def test_binary_functions(mode, name, dtypes):
    if name in ("arctan2", "logaddexp", "power") and BOOL in dtypes:
        pytest.skip("not meaningful for bool")
    shapes = ((3, 1, 4), (5, 4))
    a, b = _binary_inputs(name, dtypes, shapes, seed=4)
    want = F32 if name in INEXACT else PROMOTE[dtypes]
    check(getattr(snp, name), getattr(np, name), a, b, mode=mode, dtype=want,
          rtol=1e-5, atol=1e-6)


def test_binary_with_numpy_scalar_and_array_shapes(mode):
    # scalar-shaped array with a 2-D array, and (4,) with (3, 4)
    a, b = rand((), F32, 5), rand((3, 4), F32, 6)
    check(snp.add, np.add, a, b, mode=mode, dtype=F32)
    check(snp.multiply, np.multiply, rand((4,), F32, 7), b, mode=mode, dtype=F32)


def test_clip(mode):
    x = rand((3, 5), F32, 8, low=-2, high=2)
    check(lambda a: snp.clip(a, -0.5, 0.75), lambda a: np.clip(a, -0.5, 0.75),
          x, mode=mode, dtype=F32)
    xi = rand((3, 5), I32, 9)
    check(lambda a: snp.clip(a, -2, 3), lambda a: np.clip(a, -2, 3), xi, mode=mode, dtype=I32)
    lo, hi = rand((5,), F32, 10, -1, 0), rand((3, 1), F32, 11, 0, 1)
    check(snp.clip, np.clip, x, lo, hi, mode=mode, dtype=F32)


def test_where(mode):
    c = rand((3, 1, 4), BOOL, 12)
    a, b = rand((5, 4), F32, 13), rand((4,), F32, 14)
    check(snp.where, np.where, c, a, b, mode=mode, dtype=F32)
    # int and float branches promote to float32
    ai = rand((5, 4), I32, 15)
    check(snp.where, np.where, c, ai, b, mode=mode, dtype=F32)
    # weakly typed Python scalar branch
    x = rand((3, 4), F32, 16)
    check(lambda v: snp.where(v > 0, v, 0.0), lambda v: np.where(v > 0, v, 0.0),
          x, mode=mode, dtype=F32)
    xi = rand((3, 4), I32, 17)
    check(lambda v: snp.where(v > 0, v, -1), lambda v: np.where(v > 0, v, -1),
          xi, mode=mode, dtype=I32)


# ---------------------------------------------------------------------------
# operators: array-op-array

ARITH_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
    "pow": operator.pow,
}
CMP_OPS = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "eq": operator.eq, "ne": operator.ne,
}
BIT_OPS = {"and": operator.and_, "or": operator.or_, "xor": operator.xor}


def _op_inputs(name, dtype, seed):
    sa, sb = (3, 1, 4), (5, 4)
    if name in ("floordiv", "mod"):
        if dtype.kind == "f":
            return (rand_intlike(sa, dtype, seed),
                    rand_intlike(sb, dtype, seed + 1, -5, 6, nonzero=True))
        return rand(sa, dtype, seed, -10, 11), rand_nonzero(sb, dtype, seed + 1)
    if name == "truediv":
        return rand(sa, dtype, seed), rand_nonzero(sb, dtype, seed + 1)
    if name == "pow":
        if dtype.kind == "f":
            return rand(sa, dtype, seed, 0.5, 2.0), rand(sb, dtype, seed + 1, -2, 2)
        return rand(sa, dtype, seed, -3, 4), rand(sb, dtype, seed + 1, 0, 4)
    return rand(sa, dtype, seed), rand(sb, dtype, seed + 1)


@pytest.mark.parametrize("dtype", [F32, I32], ids=str)
@pytest.mark.parametrize("name", sorted(ARITH_OPS))
def test_arith_operators(mode, name, dtype):
    a, b = _op_inputs(name, dtype, seed=20)
    want = F32 if name == "truediv" else dtype
    same(ARITH_OPS[name], a, b, mode=mode, dtype=want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [F32, I32, BOOL], ids=str)
@pytest.mark.parametrize("name", sorted(CMP_OPS))
def test_comparison_operators(mode, name, dtype):
    a, b = rand((3, 1, 4), dtype, 21), rand((5, 4), dtype, 22)
    if dtype != BOOL:  # make sure some pairs are equal
        b[0] = a[0, 0]
    same(CMP_OPS[name], a, b, mode=mode, dtype=BOOL)


def test_mixed_dtype_comparison(mode):
    a, b = rand((4,), I32, 23), rand((3, 4), F32, 24)
    same(operator.lt, a, b, mode=mode, dtype=BOOL)
    same(operator.eq, a, a.astype(np.float32), mode=mode, dtype=BOOL)


@pytest.mark.parametrize("dtype", [I32, BOOL], ids=str)
@pytest.mark.parametrize("name", sorted(BIT_OPS))
def test_bitwise_operators(mode, name, dtype):
    a, b = rand((3, 1, 4), dtype, 25, -20, 20), rand((5, 4), dtype, 26, -20, 20)
    same(BIT_OPS[name], a, b, mode=mode, dtype=dtype)


UNARY_OPS = {
    "neg": (operator.neg, [F32, I32]),
    "abs": (abs, [F32, I32]),
    "invert": (operator.invert, [I32, BOOL]),
    "pos": (operator.pos, [F32, I32]),
}


@pytest.mark.parametrize("name,dtype", [(n, d) for n, (_, ds) in UNARY_OPS.items() for d in ds],
                         ids=lambda v: str(v))
def test_unary_operators(mode, name, dtype):
    x = rand((3, 4), dtype, 27, -20, 20)
    same(UNARY_OPS[name][0], x, mode=mode, dtype=dtype)


def test_mixed_dtype_operators(mode):
    i, f, b = rand((3, 4), I32, 28), rand((4,), F32, 29), rand((3, 4), BOOL, 30)
    same(operator.add, i, f, mode=mode, dtype=F32)
    same(operator.mul, f, i, mode=mode, dtype=F32)
    same(operator.add, b, i, mode=mode, dtype=I32)
    same(operator.mul, i, b, mode=mode, dtype=I32)
    same(operator.truediv, i, rand_nonzero((3, 4), I32, 31), mode=mode, dtype=F32)


# ---------------------------------------------------------------------------
# operators with Python scalars, both orders (reflected operators)

# (label, fn, dtype of the array, input kind, expected dtype)
SCALAR_CASES = [
    ("x+2", lambda x: x + 2, F32, "n", F32),
    ("2+x", lambda x: 2 + x, F32, "n", F32),
    ("x-1.5", lambda x: x - 1.5, F32, "n", F32),
    ("1.5-x", lambda x: 1.5 - x, F32, "n", F32),
    ("x*2.0", lambda x: x * 2.0, F32, "n", F32),
    ("3*x", lambda x: 3 * x, F32, "n", F32),
    ("x/2", lambda x: x / 2, F32, "n", F32),
    ("2.0/x", lambda x: 2.0 / x, F32, "nz", F32),
    ("x//2", lambda x: x // 2, F32, "intlike", F32),
    ("7.0//x", lambda x: 7.0 // x, F32, "intlike_nz", F32),
    ("x%3", lambda x: x % 3, F32, "intlike", F32),
    ("7%x", lambda x: 7 % x, F32, "intlike_nz", F32),
    ("x**2", lambda x: x ** 2, F32, "n", F32),
    ("x**0.5", lambda x: x ** 0.5, F32, "pos", F32),
    ("2**x", lambda x: 2 ** x, F32, "n", F32),
    ("x<0.5", lambda x: x < 0.5, F32, "n", BOOL),
    ("0.5<x", lambda x: 0.5 < x, F32, "n", BOOL),
    ("x>=0", lambda x: x >= 0, F32, "n", BOOL),
    ("1<=x", lambda x: 1 <= x, I32, "i", BOOL),
    ("x==1", lambda x: x == 1, I32, "i", BOOL),
    ("x!=1", lambda x: x != 1, I32, "i", BOOL),
    ("i+1", lambda x: x + 1, I32, "i", I32),
    ("1+i", lambda x: 1 + x, I32, "i", I32),
    ("i-1", lambda x: x - 1, I32, "i", I32),
    ("10-i", lambda x: 10 - x, I32, "i", I32),
    ("i*3", lambda x: x * 3, I32, "i", I32),
    ("i+1.5", lambda x: x + 1.5, I32, "i", F32),
    ("1.5*i", lambda x: 1.5 * x, I32, "i", F32),
    ("i/2", lambda x: x / 2, I32, "i", F32),
    ("2/i", lambda x: 2 / x, I32, "inz", F32),
    ("i//2", lambda x: x // 2, I32, "i", I32),
    ("7//i", lambda x: 7 // x, I32, "inz", I32),
    ("i%3", lambda x: x % 3, I32, "i", I32),
    ("-7%i", lambda x: -7 % x, I32, "inz", I32),
    ("i**2", lambda x: x ** 2, I32, "i", I32),
    ("2**i", lambda x: 2 ** x, I32, "inonneg", I32),
    ("i&3", lambda x: x & 3, I32, "i", I32),
    ("5^i", lambda x: 5 ^ x, I32, "i", I32),
    ("3|i", lambda x: 3 | x, I32, "i", I32),
    ("b&True", lambda x: x & True, BOOL, "b", BOOL),
    ("True|b", lambda x: True | x, BOOL, "b", BOOL),
    ("False^b", lambda x: False ^ x, BOOL, "b", BOOL),
    ("h+1.0", lambda x: x + 1.0, F16, "n", F16),
    ("2*h", lambda x: 2 * x, F16, "n", F16),
    ("h/3.0", lambda x: x / 3.0, F16, "n", F16),
]


def _scalar_input(kind, dtype):
    shape = (3, 4)
    return {
        "n": lambda: rand(shape, dtype, 40),
        "nz": lambda: rand_nonzero(shape, dtype, 41),
        "pos": lambda: rand(shape, dtype, 42, 0.1, 5.0),
        "intlike": lambda: rand_intlike(shape, dtype, 43),
        "intlike_nz": lambda: rand_intlike(shape, dtype, 44, -6, 7, nonzero=True),
        "i": lambda: rand(shape, dtype, 45, -10, 11),
        "inz": lambda: rand_nonzero(shape, dtype, 46),
        "inonneg": lambda: rand(shape, dtype, 47, 0, 10),
        "b": lambda: rand(shape, dtype, 48),
    }[kind]()


@pytest.mark.parametrize("label,fn,dtype,kind,want", SCALAR_CASES,
                         ids=[c[0] for c in SCALAR_CASES])
def test_operators_with_python_scalars(mode, label, fn, dtype, kind, want):
    x = _scalar_input(kind, dtype)
    # float16 inputs: compute the oracle in float16's own precision is not
    # needed; assert_array widens the tolerance for float16 results.
    same(fn, x, mode=mode, dtype=want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# property test: broadcasting of binary ops


BCAST_OPS = {
    "add": (operator.add, None), "sub": (operator.sub, None),
    "mul": (operator.mul, None), "truediv": (operator.truediv, F32),
    "maximum": (snp.maximum, None), "minimum": (snp.minimum, None),
    "lt": (operator.lt, BOOL), "eq": (operator.eq, BOOL),
}
BCAST_NP = {"maximum": np.maximum, "minimum": np.minimum}
BCAST_DTYPES = [(F32, F32), (I32, I32), (F32, I32), (I32, F32), (BOOL, I32)]


@pytest.mark.parametrize("mode", MODES)
@HYP
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4,
                                             min_side=0, max_side=4),
    op=st.sampled_from(sorted(BCAST_OPS)),
    dtypes=st.sampled_from(BCAST_DTYPES),
    seed=st.integers(0, 2**16),
)
def test_binary_broadcasting_property(mode, shapes, op, dtypes, seed):
    (sa, sb), out_shape = shapes.input_shapes, shapes.result_shape
    a = rand(sa, dtypes[0], seed)
    b = rand_nonzero(sb, dtypes[1], seed + 1) if op == "truediv" else rand(sb, dtypes[1], seed + 1)
    fn, fixed = BCAST_OPS[op]
    want = fixed or PROMOTE[dtypes]
    out = run(fn, (a, b), mode)
    ref = BCAST_NP.get(op, fn)
    expected = ref(a.astype(np.float64) if a.dtype.kind == "f" else a,
                   b.astype(np.float64) if b.dtype.kind == "f" else b)
    assert tuple(out.shape) == out_shape
    assert_array(out, expected, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@HYP
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3,
                                             min_side=1, max_side=4),
    seed=st.integers(0, 2**16),
)
def test_where_broadcasting_property(mode, shapes, seed):
    sc, sa, sb = shapes.input_shapes
    c, a, b = rand(sc, BOOL, seed), rand(sa, F32, seed + 1), rand(sb, I32, seed + 2)
    out = run(snp.where, (c, a, b), mode)
    assert_array(out, np.where(c, a, b), F32)


# ---------------------------------------------------------------------------
# IEEE special values and integer wrap-around (no Python exceptions, as numpy/JAX)


def test_ieee_special_values(mode):
    x = np.array([0.0, -1.0, 1.0, np.inf, -np.inf, np.nan], np.float32)
    with np.errstate(all="ignore"):
        cases = [
            (snp.log, np.log), (snp.sqrt, np.sqrt), (lambda a: 1.0 / a, lambda a: 1.0 / a),
            (lambda a: a / 0.0, lambda a: a / 0.0), (snp.exp, np.exp),
            (lambda a: snp.maximum(a, 0.5), lambda a: np.maximum(a, 0.5)),
            (lambda a: snp.minimum(a, 0.5), lambda a: np.minimum(a, 0.5)),
            (lambda a: a * 0.0, lambda a: a * 0.0),
            (lambda a: a == a, lambda a: a == a),
        ]
        for fn, ref in cases:
            out = run(fn, (x,), mode)
            want = BOOL if out.dtype == BOOL else F32
            assert_array(out, ref(x.astype(np.float64)), want, rtol=1e-6, atol=0)


def test_int32_arithmetic_wraps_around(mode):
    x = np.array([2**31 - 1, -(2**31), 7], np.int32)
    with np.errstate(all="ignore"):
        for fn in (lambda a: a + 1, lambda a: a - 1, lambda a: a * 2, lambda a: -a):
            same(fn, x, mode=mode, dtype=I32, upcast=False)


def test_logaddexp_infinities(mode):
    # numpy and JAX: logaddexp(-inf, -inf) = -inf, logaddexp(inf, inf) = inf
    a = np.array([-np.inf, np.inf, 0.0, -np.inf, 1000.0], np.float32)
    b = np.array([-np.inf, np.inf, -np.inf, 1.0, 1000.0], np.float32)
    check(snp.logaddexp, np.logaddexp, a, b, mode=mode, dtype=F32, rtol=1e-6, atol=0)


def test_integer_power_is_exact(mode):
    # int32 ** int32 is computed in integers (JAX: repeated squaring), so
    # results above 2**24 are exact and overflow wraps like numpy's int32
    base = np.array([3, -3, 7, 2, 3, -1, 0], np.int32)
    exp = np.array([19, 19, 11, 30, 25, 7, 0], np.int32)
    with np.errstate(all="ignore"):
        check(snp.power, np.power, base, exp, mode=mode, dtype=I32)
        same(lambda a, b: a ** b, base, exp, mode=mode, dtype=I32)
        same(lambda a: a ** 19, base[:2], mode=mode, dtype=I32)


def test_float_floor_divide_and_mod_match_divmod(mode):
    # numpy and JAX compute float // from the remainder (divmod), not as
    # floor(x / y): 1.0 // 0.1 is 9.0 in float32, and x == (x // y) * y + x % y
    x = np.array([1.0, -1.0, 7.0, 0.3, 5.0, -5.5], np.float32)
    y = np.array([0.1, 0.1, 0.7, 0.1, -0.3, 0.25], np.float32)
    check(snp.floor_divide, np.floor_divide, x, y, mode=mode, dtype=F32, rtol=0, atol=0,
          upcast=False)
    same(lambda a, b: a // b, x, y, mode=mode, dtype=F32, rtol=0, atol=0, upcast=False)
    check(snp.mod, np.mod, x, y, mode=mode, dtype=F32, rtol=0, atol=0, upcast=False)


def test_reciprocal_of_int_promotes_to_float(mode):
    # jax.numpy.reciprocal promotes integers to float (numpy keeps ints)
    x = np.array([1, 2, -4, 5], np.int32)
    check(snp.reciprocal, lambda a: 1.0 / a, x, mode=mode, dtype=F32)
