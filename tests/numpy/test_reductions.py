"""Reductions, scans and sorting of spmd.numpy against numpy."""

import os
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import (  # noqa: E402
    BOOL, F32, HYP, I32, MODES, assert_array, check, mode, rand, run,  # noqa: F401
)

import spmd.numpy as snp  # noqa: E402

RTOL = 1e-4
ATOL = 1e-5

# reduction -> {input dtype: result dtype} (JAX: ints sum in int32, mean/var of
# ints are float32, bools sum to int32)
REDUCTIONS = {
    "sum": {F32: F32, I32: I32, BOOL: I32},
    "mean": {F32: F32, I32: F32, BOOL: F32},
    "prod": {F32: F32, I32: I32},
    "max": {F32: F32, I32: I32},
    "min": {F32: F32, I32: I32},
    "var": {F32: F32, I32: F32},
    "std": {F32: F32, I32: F32},
    "any": {BOOL: BOOL, F32: BOOL},
    "all": {BOOL: BOOL, F32: BOOL},
}


def _red_input(name, dtype, shape, seed):
    if dtype == F32:
        if name in ("sum", "mean"):
            return rand(shape, F32, seed, 0.5, 1.5)
        if name == "prod":
            return rand(shape, F32, seed, 0.8, 1.25)
        if name in ("any", "all"):  # floats with some zeros (and some all-nonzero rows)
            x = rand(shape, F32, seed)
            x[np.abs(x) < 0.3] = 0.0
            return x
        return rand(shape, F32, seed)
    if dtype == I32:
        return rand(shape, I32, seed, -2, 3) if name == "prod" else rand(shape, I32, seed)
    x = rand(shape, BOOL, seed)
    if name == "all" and x.ndim and x.size:  # make all() true somewhere
        x[..., 0] = True
        x[0] = True
    if name == "any" and x.ndim and x.size:
        x[-1] = False
    return x


CASES = [(n, d) for n, table in REDUCTIONS.items() for d in table]
AXES = [None, 1, -1, -3, (0, 2), (-1, 0), ()]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=repr)
@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_reductions(mode, name, dtype, axis, keepdims):
    x = _red_input(name, dtype, (2, 3, 4), seed=17)
    want = REDUCTIONS[name][dtype]
    check(lambda a: getattr(snp, name)(a, axis=axis, keepdims=keepdims),
          lambda a: getattr(np, name)(a, axis=axis, keepdims=keepdims),
          x, mode=mode, dtype=want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["sum", "max", "mean", "any"])
def test_reduction_of_scalar_and_vector(mode, name):
    dtype = BOOL if name == "any" else F32
    want = REDUCTIONS[name][dtype]
    for shape in [(), (5,)]:
        x = _red_input(name, dtype, shape, 3)
        check(lambda a: getattr(snp, name)(a), getattr(np, name), x,
              mode=mode, dtype=want, rtol=RTOL, atol=ATOL)


def test_var_std_constant_axis_is_zero(mode):
    # a length-1 axis or a constant array has variance exactly ~0, never NaN
    x = np.full((3, 1), 1.2345, np.float32)
    for name in ("var", "std"):
        check(lambda a: getattr(snp, name)(a, axis=1), lambda a: getattr(np, name)(a, axis=1),
              x, mode=mode, dtype=F32, rtol=0, atol=1e-5)
        check(lambda a: getattr(snp, name)(a), lambda a: getattr(np, name)(a),
              x, mode=mode, dtype=F32, rtol=0, atol=1e-5)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", [F32, I32], ids=str)
def test_argmax_argmin(mode, name, dtype, axis):
    # int inputs from a small range have ties: the first occurrence wins
    x = rand((3, 4, 5), dtype, 7, -2, 3) if dtype == I32 else rand((3, 4, 5), F32, 7)
    check(lambda a: getattr(snp, name)(a, axis=axis),
          lambda a: getattr(np, name)(a, axis=axis), x, mode=mode, dtype=I32)


@pytest.mark.parametrize("mode", MODES)
@HYP
@given(
    data=st.data(),
    name=st.sampled_from(sorted(REDUCTIONS)),
    keepdims=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_reductions_random_axes_property(mode, data, name, keepdims, seed):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4),
                      label="shape")
    ndim = len(shape)
    axis_st = [st.none(), hnp.valid_tuple_axes(ndim)]
    if ndim:
        axis_st.append(st.integers(-ndim, ndim - 1))
    axis = data.draw(st.one_of(*axis_st), label="axis")
    dtype = data.draw(st.sampled_from(sorted(REDUCTIONS[name], key=str)), label="dtype")
    x = _red_input(name, dtype, shape, seed)
    out = run(lambda a: getattr(snp, name)(a, axis=axis, keepdims=keepdims), (x,), mode)
    xr = x.astype(np.float64) if x.dtype.kind == "f" else x
    expected = getattr(np, name)(xr, axis=axis, keepdims=keepdims)
    assert_array(out, expected, REDUCTIONS[name][dtype], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", MODES)
@HYP
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4),
    data=st.data(),
    name=st.sampled_from(["argmax", "argmin"]),
    seed=st.integers(0, 2**16),
)
def test_argmax_random_axes_property(mode, shape, data, name, seed):
    ndim = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1)), label="axis")
    x = rand(shape, I32, seed, -2, 3)
    out = run(lambda a: getattr(snp, name)(a, axis=axis), (x,), mode)
    assert_array(out, getattr(np, name)(x, axis=axis), I32)


# ---------------------------------------------------------------------------
# cumsum


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype,want", [(F32, F32), (I32, I32), (BOOL, I32)], ids=str)
def test_cumsum(mode, dtype, want, axis):
    x = rand((3, 4, 2), dtype, 9)
    check(lambda a: snp.cumsum(a, axis=axis), lambda a: np.cumsum(a, axis=axis),
          x, mode=mode, dtype=want, rtol=RTOL, atol=ATOL)


def test_cumsum_1d_default(mode):
    x = rand((10,), F32, 10)
    check(snp.cumsum, np.cumsum, x, mode=mode, dtype=F32, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------
# sort / argsort


@pytest.mark.parametrize("axis", ["default", 0, -1, 1])
@pytest.mark.parametrize("dtype", [F32, I32], ids=str)
def test_sort(mode, dtype, axis):
    x = rand((4, 5, 3), dtype, 11, -3, 4) if dtype == I32 else rand((4, 5, 3), dtype, 11)
    if axis == "default":
        check(snp.sort, np.sort, x, mode=mode, dtype=dtype, rtol=0, atol=0)
    else:
        check(lambda a: snp.sort(a, axis=axis), lambda a: np.sort(a, axis=axis),
              x, mode=mode, dtype=dtype, rtol=0, atol=0)


@pytest.mark.parametrize("axis", ["default", 0, -1, 1])
@pytest.mark.parametrize("dtype", [F32, I32], ids=str)
def test_argsort(mode, dtype, axis):
    # jax.numpy.argsort is stable: ties keep their original order
    x = rand((4, 5, 3), dtype, 12, -3, 4) if dtype == I32 else rand((4, 5, 3), dtype, 12)
    if axis == "default":
        check(snp.argsort, lambda a: np.argsort(a, kind="stable"), x, mode=mode, dtype=I32)
    else:
        check(lambda a: snp.argsort(a, axis=axis),
              lambda a: np.argsort(a, axis=axis, kind="stable"), x, mode=mode, dtype=I32)


def test_sort_1d(mode):
    x = rand((17,), F32, 13)
    check(snp.sort, np.sort, x, mode=mode, dtype=F32, rtol=0, atol=0)
    check(snp.argsort, np.argsort, x, mode=mode, dtype=I32)


# ---------------------------------------------------------------------------
# NaN handling follows numpy (and JAX): NaN propagates through max/min,
# argmax/argmin point at the first NaN, sort puts NaNs last.


def test_nan_handling(mode):
    x = np.array([[1.0, np.nan, 3.0, -1.0], [2.0, 0.5, 4.0, 1.0]], np.float32)
    for name in ("max", "min", "sum", "mean"):
        check(lambda a: getattr(snp, name)(a, axis=1), lambda a: getattr(np, name)(a, axis=1),
              x, mode=mode, dtype=F32, rtol=1e-6)
    for name in ("argmax", "argmin"):
        check(lambda a: getattr(snp, name)(a, axis=1), lambda a: getattr(np, name)(a, axis=1),
              x, mode=mode, dtype=I32)
    check(snp.sort, np.sort, x, mode=mode, dtype=F32, rtol=0, atol=0)
    check(lambda a: snp.maximum(a, 2.0), lambda a: np.maximum(a, 2.0), x, mode=mode, dtype=F32)
