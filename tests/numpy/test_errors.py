"""User mistakes raise the specific exception types of ``spmd.errors``.

Every case is checked under ``spmd.jit`` (and eagerly where that is
meaningful), and every jit case checks that the failed call cached nothing:
the same jitted function then works on valid input, and fails again on the
bad input.
"""

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import F32, assert_array  # noqa: E402,F401

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import errors, lax  # noqa: E402,F401


def _fails_then_recovers(jf, bad_args, good_args, exc, expected_good=None, match=()):
    """``jf(*bad_args)`` raises ``exc`` (its message containing every string in
    ``match``); ``jf(*good_args)`` then works; ``jf(*bad_args)`` raises again."""
    with pytest.raises(exc) as info:
        jf(*bad_args)
    msg = str(info.value)
    for s in match:
        assert s in msg, f"{s!r} not in error message: {msg!r}"
    out = jf(*good_args)
    if expected_good is not None:
        np.testing.assert_allclose(np.asarray(out), expected_good, rtol=1e-6)
    with pytest.raises(exc):
        jf(*bad_args)
    return info.value


def test_exception_hierarchy():
    assert issubclass(errors.TracerBoolConversionError, errors.ConcretizationError)
    assert issubclass(errors.TracerIntegerConversionError, errors.ConcretizationError)
    assert issubclass(errors.ConcretizationError, TypeError)
    assert issubclass(errors.ShapeError, ValueError)
    assert issubclass(errors.IndexOutOfBoundsError, IndexError)
    assert issubclass(errors.DTypeError, TypeError)
    assert issubclass(errors.StaticArgumentError, ValueError)
    assert issubclass(errors.OutputTypeError, TypeError)
    for e in (errors.ConcretizationError, errors.ShapeError, errors.DTypeError,
              errors.IndexOutOfBoundsError, errors.StaticArgumentError,
              errors.OutputTypeError):
        assert issubclass(e, errors.SpmdError)


# ---------------------------------------------------------------------------
# Python control flow on traced values


def _check_bool_message(err):
    msg = str(err)
    assert "lax.cond" in msg or "lax.while_loop" in msg, msg
    assert "static_argnums" in msg, msg


def test_python_if_on_traced_value():
    def f(x, python_branch):
        if python_branch:
            if x.sum() > 0:
                return x
            return -x
        return snp.where(x.sum() > 0, x, -x)

    jf = spmd.jit(f, static_argnums=1)
    x = np.array([1.0, -3.0], np.float32)
    err = _fails_then_recovers(jf, (x, True), (x, False), errors.TracerBoolConversionError,
                               expected_good=-x)
    assert isinstance(err, errors.ConcretizationError) and isinstance(err, TypeError)
    _check_bool_message(err)


def test_bool_of_traced_value():
    jf = spmd.jit(lambda x, use_bool: bool(x[0]) if use_bool else x[0], static_argnums=1)
    x = np.array([2.0, 3.0], np.float32)
    err = _fails_then_recovers(jf, (x, True), (x, False), errors.TracerBoolConversionError,
                               expected_good=2.0)
    _check_bool_message(err)


def test_while_on_traced_value():
    def f(x):
        while x > 0:
            x = x - 1
        return x

    with pytest.raises(errors.TracerBoolConversionError) as info:
        spmd.jit(f)(np.float32(3.0))
    _check_bool_message(info.value)


def test_static_argument_branch_is_the_fix():
    def f(x, n):
        if n > 0:  # n is static: a plain Python value
            return x * n
        return x

    jf = spmd.jit(f, static_argnums=1)
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(np.asarray(jf(x, 3)), [3.0, 3.0])
    np.testing.assert_array_equal(np.asarray(jf(x, 0)), [1.0, 1.0])


def test_eager_values_are_concrete():
    x = snp.asarray(np.array([1.0, 2.0], np.float32))
    taken = "pos" if snp.sum(x) > 0 else "neg"
    assert taken == "pos"
    assert bool(x[0] == 1.0) is True
    assert int(snp.array(3)) == 3
    assert float(snp.array(2.5)) == 2.5
    assert [10, 20, 30][snp.array(1)] == 20  # __index__ on a concrete int array


@pytest.mark.parametrize("conv", ["int", "float", "index"])
def test_int_float_of_traced_value(conv):
    def f(x, convert):
        if convert:
            if conv == "int":
                return x * int(x)
            if conv == "float":
                return x * float(x)
            return x * [1, 2, 3][x]
        return x * 2

    jf = spmd.jit(f, static_argnums=1)
    x = np.int32(1)
    err = _fails_then_recovers(jf, (x, True), (x, False), errors.TracerIntegerConversionError,
                               expected_good=2)
    assert isinstance(err, errors.ConcretizationError) and isinstance(err, TypeError)
    assert str(err)


# spmd.errors.ConcretizationError: "raised ... by functions that need a static
# value (a shape, an axis)"; the fix (a static argument) then works
STATIC_NEEDED = [
    ("arange", lambda x, n: snp.arange(n) + x[0]),
    ("zeros_shape", lambda x, n: snp.zeros(n) + x[0]),
    ("reshape_shape", lambda x, n: snp.reshape(x, (n, -1))),
    ("sum_axis", lambda x, n: snp.sum(x.reshape(1, 2, 3), axis=n)),
    ("eye_k", lambda x, n: snp.eye(3, k=n) * x[0]),
]


@pytest.mark.parametrize("label,fn", STATIC_NEEDED, ids=[c[0] for c in STATIC_NEEDED])
def test_traced_value_where_static_needed(label, fn):
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(errors.ConcretizationError):
        spmd.jit(fn)(x, 2)
    expected = np.asarray(fn(x, 2))  # eager result: concrete values are fine
    out = spmd.jit(fn, static_argnums=1)(x, 2)
    np.testing.assert_allclose(np.asarray(out), expected)


# ---------------------------------------------------------------------------
# shape errors


def test_binary_op_shape_mismatch_eager():
    with pytest.raises(errors.ShapeError) as info:
        snp.ones((2, 3)) + snp.ones((4,))
    assert "(2, 3)" in str(info.value) and "(4,)" in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(errors.ShapeError):
        snp.add(np.ones((2, 3)), np.ones((4,)))


def test_binary_op_shape_mismatch_jit():
    jf = spmd.jit(lambda a, b: a + b)
    _fails_then_recovers(jf, (np.ones((2, 3), np.float32), np.ones((4,), np.float32)),
                         (np.ones((2, 3), np.float32), np.ones((3,), np.float32)),
                         errors.ShapeError, expected_good=np.full((2, 3), 2.0),
                         match=("(2, 3)", "(4,)"))


def test_binary_op_shape_mismatch_inside_jit_body():
    def f(x):
        return x + snp.ones((4,))

    jf = spmd.jit(f)
    _fails_then_recovers(jf, (np.ones((2, 3), np.float32),), (np.ones((2, 4), np.float32),),
                         errors.ShapeError, expected_good=np.full((2, 4), 2.0),
                         match=("(2, 3)", "(4,)"))


def test_dot_shape_mismatch():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    with pytest.raises(errors.ShapeError) as info:
        snp.dot(a, b)
    assert "(2, 3)" in str(info.value) and "(4, 5)" in str(info.value)
    jf = spmd.jit(snp.dot)
    _fails_then_recovers(jf, (a, b), (a, np.ones((3, 5), np.float32)), errors.ShapeError,
                         expected_good=np.full((2, 5), 3.0), match=("(2, 3)", "(4, 5)"))


def test_matmul_shape_mismatch():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    with pytest.raises(errors.ShapeError):
        snp.asarray(a) @ snp.asarray(b)
    with pytest.raises(errors.ShapeError):
        spmd.jit(snp.matmul)(a, b)


def test_reshape_size_mismatch():
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(errors.ShapeError):
        snp.reshape(x, (4,))
    with pytest.raises(errors.ShapeError):
        snp.asarray(x).reshape(4, -1)
    jf = spmd.jit(lambda a: snp.reshape(a, (4,)))
    _fails_then_recovers(jf, (x,), (np.arange(4, dtype=np.float32),), errors.ShapeError,
                         expected_good=np.arange(4))


def test_concatenate_shape_mismatch():
    a, b = np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)
    with pytest.raises(errors.ShapeError):
        snp.concatenate([a, b], axis=0)
    with pytest.raises(errors.ShapeError):
        snp.concatenate([a, np.ones((3,), np.float32)])  # rank mismatch
    jf = spmd.jit(lambda x, y: snp.concatenate([x, y], axis=0))
    _fails_then_recovers(jf, (a, b), (a, np.zeros((1, 3), np.float32)), errors.ShapeError,
                         expected_good=np.concatenate([a, np.zeros((1, 3))]))


def test_axis_out_of_range():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError) as info:
        snp.sum(x, axis=2)
    assert isinstance(info.value, errors.SpmdError)
    with pytest.raises(ValueError):
        spmd.jit(lambda a: snp.sum(a, axis=-3))(x)


# ---------------------------------------------------------------------------
# indexing


def test_static_index_out_of_bounds_eager():
    x = snp.arange(3)
    with pytest.raises(errors.IndexOutOfBoundsError) as info:
        x[5]
    assert isinstance(info.value, IndexError)
    assert "5" in str(info.value) and "3" in str(info.value)
    with pytest.raises(errors.IndexOutOfBoundsError) as info:
        x[-4]
    assert "-4" in str(info.value)


def test_static_index_out_of_bounds_jit():
    jf = spmd.jit(lambda x: x[5])
    err = _fails_then_recovers(jf, (np.zeros(3, np.float32),),
                               (np.arange(6, dtype=np.float32),),
                               errors.IndexOutOfBoundsError, expected_good=5.0)
    assert re.search(r"\b5\b", str(err)) and re.search(r"\b3\b", str(err)), str(err)


def test_static_index_out_of_bounds_second_axis():
    jf = spmd.jit(lambda x: x[1, 7])
    err = _fails_then_recovers(jf, (np.zeros((2, 5), np.float32),),
                               (np.ones((2, 8), np.float32),),
                               errors.IndexOutOfBoundsError, expected_good=1.0)
    assert re.search(r"\b7\b", str(err)) and re.search(r"\b5\b", str(err)), str(err)


# ---------------------------------------------------------------------------
# jit arguments and outputs


def test_unhashable_static_argument():
    def f(scales, x):
        return x * sum(scales)

    jf = spmd.jit(f, static_argnums=0)
    x = np.ones(2, np.float32)
    err = _fails_then_recovers(jf, ([1.0, 2.0], x), ((1.0, 2.0), x),
                               errors.StaticArgumentError, expected_good=[3.0, 3.0])
    assert isinstance(err, ValueError)
    msg = str(err)
    assert "scales" in msg or re.search(r"\b0\b", msg), msg  # names the argument
    assert "hashable" in msg.lower(), msg


def test_non_array_output():
    def f(x, bad):
        return "abc" if bad else x * 2

    jf = spmd.jit(f, static_argnums=1)
    x = np.ones(2, np.float32)
    err = _fails_then_recovers(jf, (x, True), (x, False), errors.OutputTypeError,
                               expected_good=[2.0, 2.0])
    assert isinstance(err, TypeError)
    assert "str" in str(err) or "abc" in str(err), str(err)


def test_non_array_output_inside_pytree():
    jf = spmd.jit(lambda x: {"a": x, "b": (x, object())})
    with pytest.raises(errors.OutputTypeError):
        jf(np.ones(2, np.float32))


# ---------------------------------------------------------------------------
# dtypes


def test_unsupported_dtype_in_creation():
    with pytest.raises(errors.DTypeError) as info:
        snp.zeros(3, dtype=np.clongdouble)  # extended precision: unsupported
    assert isinstance(info.value, TypeError)

    def f(x, bad):
        return x + snp.zeros(3, dtype=np.clongdouble if bad else np.float32)

    jf = spmd.jit(f, static_argnums=1)
    x = np.ones(3, np.float32)
    _fails_then_recovers(jf, (x, True), (x, False), errors.DTypeError, expected_good=x)


@pytest.mark.parametrize("bad", [np.array(["a"]), np.array([object()], dtype=object)],
                         ids=["str", "object"])
def test_unsupported_input_dtype(bad):
    with pytest.raises(errors.DTypeError):
        snp.asarray(bad)
    jf = spmd.jit(lambda x: x)
    _fails_then_recovers(jf, (bad,), (np.ones(1, np.float32),), errors.DTypeError,
                         expected_good=[1.0])
