"""Array creation functions of spmd.numpy against numpy (32-bit defaults)."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import (  # noqa: E402
    BOOL, F16, F32, I32, assert_array, check, mode, rand, run,  # noqa: F401
)

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402

# (label, spmd thunk, numpy oracle thunk, expected dtype)
NULLARY = [
    ("zeros_int_shape", lambda m: m.zeros(3), F32),
    ("zeros_tuple", lambda m: m.zeros((2, 3)), F32),
    ("zeros_scalar_shape", lambda m: m.zeros(()), F32),
    ("zeros_i32", lambda m: m.zeros((2, 3), dtype=np.int32), I32),
    ("zeros_bool", lambda m: m.zeros((4,), dtype=bool), BOOL),
    ("ones", lambda m: m.ones((3, 1, 2)), F32),
    ("ones_i32", lambda m: m.ones(4, dtype=np.int32), I32),
    ("ones_f16", lambda m: m.ones((2,), dtype=np.float16), F16),
    ("full_float", lambda m: m.full((2, 3), 1.5), F32),
    ("full_int", lambda m: m.full((2, 3), 7), I32),
    ("full_bool", lambda m: m.full((2,), True), BOOL),
    ("full_dtype", lambda m: m.full((3,), 2.0, dtype=np.int32), I32),
    ("full_array_fill", lambda m: m.full((2, 3), m.asarray([1.0, 2.0, 3.0], dtype=np.float32)), F32),
    ("arange_stop", lambda m: m.arange(5), I32),
    ("arange_start_stop_step", lambda m: m.arange(2, 11, 3), I32),
    ("arange_negative_step", lambda m: m.arange(10, 0, -2), I32),
    ("arange_negative_start", lambda m: m.arange(-3, 3), I32),
    ("arange_float_stop", lambda m: m.arange(5.0), F32),
    ("arange_float_step", lambda m: m.arange(0, 1, 0.25), F32),
    ("arange_dtype", lambda m: m.arange(4, dtype=np.float32), F32),
    ("arange_empty", lambda m: m.arange(0), I32),
    ("linspace", lambda m: m.linspace(0, 1, 5), F32),
    ("linspace_neg", lambda m: m.linspace(-2.0, 3.0, 11), F32),
    ("linspace_no_endpoint", lambda m: m.linspace(-1, 1, 7, endpoint=False), F32),
    ("linspace_default_num", lambda m: m.linspace(0.0, 10.0), F32),
    ("linspace_one", lambda m: m.linspace(2, 3, 1), F32),
    ("eye", lambda m: m.eye(3), F32),
    ("eye_rect", lambda m: m.eye(2, 4), F32),
    ("eye_k_pos", lambda m: m.eye(4, k=1), F32),
    ("eye_k_neg", lambda m: m.eye(3, 5, k=-1), F32),
    ("eye_int", lambda m: m.eye(3, dtype=np.int32), I32),
    ("array_int_list", lambda m: m.array([[1, 2], [3, 4]]), I32),
    ("array_float_list", lambda m: m.array([1.0, 2.0]), F32),
    ("array_mixed_list", lambda m: m.array([1, 2.5, 3]), F32),
    ("array_bool_list", lambda m: m.array([True, False, True]), BOOL),
    ("array_scalar", lambda m: m.array(3.5), F32),
    ("array_int_scalar", lambda m: m.array(3), I32),
    ("array_dtype", lambda m: m.array([1, 2, 3], dtype=np.float32), F32),
    ("array_f64_input", lambda m: m.array(np.linspace(0, 1, 4)), F32),
    ("array_i64_input", lambda m: m.array(np.arange(4, dtype=np.int64)), I32),
    ("array_to_f16", lambda m: m.array([0.5, 1.5], dtype=np.float16), F16),
    ("asarray_list", lambda m: m.asarray([[1.0, 2.0, 3.0]]), F32),
    ("asarray_f64_input", lambda m: m.asarray(np.ones((2, 2))), F32),
    ("asarray_dtype", lambda m: m.asarray([1.7, -2.7], dtype=np.int32), I32),
]


@pytest.mark.parametrize("label,make,want", NULLARY, ids=[c[0] for c in NULLARY])
def test_creation(mode, label, make, want):
    expected = make(np)
    if mode == "eager":
        out = make(snp)
    else:
        out = spmd.jit(lambda: make(snp))()
    assert_array(out, expected, want, rtol=1e-5, atol=1e-6)


def test_eager_results_are_spmd_arrays_with_attributes():
    out = snp.zeros((2, 3))
    assert isinstance(out, spmd.Array)
    assert out.shape == (2, 3) and out.ndim == 2 and out.size == 6
    assert out.dtype == np.float32
    assert len(out) == 2
    assert isinstance(snp.sin(np.ones(3)), spmd.Array)


def test_array_of_spmd_arrays(mode):
    x = rand((3,), F32, 1)
    check(lambda a: snp.array(a), lambda a: np.array(a), x, mode=mode, dtype=F32)
    check(lambda a: snp.asarray(a), lambda a: np.asarray(a), x, mode=mode, dtype=F32)
    check(lambda a: snp.array(a, dtype=np.int32), lambda a: np.array(a).astype(np.int32),
          x * 3, mode=mode, dtype=I32)
    # a list of (traced) arrays stacks them, as in jax.numpy.array
    check(lambda a: snp.array([a, 2 * a]), lambda a: np.array([a, 2 * a]),
          x, mode=mode, dtype=F32)


LIKE = [
    ("zeros_like", lambda m, x: m.zeros_like(x)),
    ("ones_like", lambda m, x: m.ones_like(x)),
    ("full_like_int_fill", lambda m, x: m.full_like(x, 2)),
    ("full_like_float_fill", lambda m, x: m.full_like(x, 2.5)),
    ("zeros_like_dtype", lambda m, x: m.zeros_like(x, dtype=np.int32)),
    ("ones_like_dtype", lambda m, x: m.ones_like(x, dtype=bool)),
    ("full_like_dtype", lambda m, x: m.full_like(x, 3, dtype=np.float32)),
]


@pytest.mark.parametrize("dtype", [F32, I32, BOOL], ids=str)
@pytest.mark.parametrize("label,make", LIKE, ids=[c[0] for c in LIKE])
def test_like_functions(mode, label, make, dtype):
    x = rand((2, 3, 1), dtype, 2)
    out = run(lambda a: make(snp, a), (x,), mode)
    expected = make(np, x)
    # the result has x's dtype unless a dtype is given; a float fill into an
    # int array is cast to the array's dtype (as in numpy and JAX)
    assert_array(out, expected, expected.dtype, rtol=0, atol=0)


def test_zeros_like_ignores_values(mode):
    x = np.full((4,), np.nan, np.float32)
    check(snp.zeros_like, np.zeros_like, x, mode=mode, dtype=F32, rtol=0, atol=0)
