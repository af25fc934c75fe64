"""Methods and attributes of spmd arrays (eager results and tracers)."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import BOOL, F32, I32, check, mode, rand, run  # noqa: E402,F401

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402

# (label, method call valid on both numpy arrays and spmd arrays, input dtype,
#  input shape, expected dtype)
METHODS = [
    ("T_2d", lambda x: x.T, F32, (3, 4), F32),
    ("T_3d", lambda x: x.T, F32, (2, 3, 4), F32),
    ("T_1d", lambda x: x.T, I32, (5,), I32),
    ("reshape_varargs", lambda x: x.reshape(4, -1), F32, (2, 3, 4), F32),
    ("reshape_tuple", lambda x: x.reshape((6, 4)), F32, (2, 3, 4), F32),
    ("sum", lambda x: x.sum(), F32, (2, 3, 4), F32),
    ("sum_axis", lambda x: x.sum(axis=0), I32, (2, 3, 4), I32),
    ("sum_keepdims", lambda x: x.sum(axis=(0, -1), keepdims=True), F32, (2, 3, 4), F32),
    ("mean", lambda x: x.mean(), F32, (2, 3, 4), F32),
    ("mean_axis", lambda x: x.mean(axis=-1), I32, (2, 3, 4), F32),
    ("max", lambda x: x.max(), F32, (2, 3, 4), F32),
    ("max_axis_keepdims", lambda x: x.max(axis=1, keepdims=True), I32, (2, 3, 4), I32),
    ("min", lambda x: x.min(), I32, (2, 3, 4), I32),
    ("min_axis", lambda x: x.min(axis=-2), F32, (2, 3, 4), F32),
    ("astype_i32", lambda x: x.astype(np.int32), F32, (3, 4), I32),
    ("astype_f32", lambda x: x.astype(np.float32), I32, (3, 4), F32),
    ("astype_bool", lambda x: x.astype(bool), I32, (3, 4), BOOL),
    ("astype_str", lambda x: x.astype("float32"), I32, (3, 4), F32),
    ("transpose", lambda x: x.transpose(), F32, (2, 3, 4), F32),
    ("transpose_varargs", lambda x: x.transpose(1, 0, 2), F32, (2, 3, 4), F32),
    ("transpose_tuple", lambda x: x.transpose((2, 0, 1)), F32, (2, 3, 4), F32),
    ("squeeze", lambda x: x.squeeze(), F32, (1, 3, 1), F32),
    ("squeeze_axis", lambda x: x.squeeze(axis=0), F32, (1, 3, 1), F32),
    ("ravel", lambda x: x.ravel(), I32, (2, 3, 4), I32),
    ("argmax", lambda x: x.argmax(), F32, (2, 3, 4), I32),
    ("argmax_axis", lambda x: x.argmax(axis=1), F32, (2, 3, 4), I32),
    ("argmax_neg_axis", lambda x: x.argmax(axis=-1), I32, (2, 3, 4), I32),
    ("any", lambda x: x.any(), BOOL, (2, 3, 4), BOOL),
    ("any_axis", lambda x: x.any(axis=1), BOOL, (2, 3, 4), BOOL),
    ("all", lambda x: x.all(), BOOL, (2, 3, 4), BOOL),
    ("all_axis", lambda x: x.all(axis=(0, 2)), BOOL, (2, 3, 4), BOOL),
    ("cumsum", lambda x: x.cumsum(), F32, (2, 3, 4), F32),
    ("cumsum_axis", lambda x: x.cumsum(axis=1), I32, (2, 3, 4), I32),
    ("chained", lambda x: x.T.reshape(-1).sum(), F32, (2, 3), F32),
]


@pytest.mark.parametrize("label,fn,dtype,shape,want", METHODS, ids=[c[0] for c in METHODS])
def test_methods(mode, label, fn, dtype, shape, want):
    x = rand(shape, dtype, 1)
    if dtype == F32:
        x = x * np.float32(10)
    check(fn, fn, x, mode=mode, dtype=want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (0, 3)], ids=str)
def test_static_attributes_eager(shape):
    x = snp.asarray(rand(shape, F32, 2))
    assert x.shape == shape and isinstance(x.shape, tuple)
    assert x.ndim == len(shape) and isinstance(x.ndim, int)
    assert x.size == int(np.prod(shape)) and isinstance(x.size, int)
    assert x.dtype == np.float32
    if shape:
        assert len(x) == shape[0]


def test_len_of_scalar_raises():
    with pytest.raises(TypeError):
        len(snp.asarray(np.float32(1.0)))


def test_static_attributes_under_jit():
    seen = {}

    def f(x):
        # shape, dtype, ndim, size and len are static Python values under jit
        seen.update(shape=x.shape, dtype=x.dtype, ndim=x.ndim, size=x.size, len=len(x))
        assert isinstance(x.shape, tuple) and all(isinstance(d, int) for d in x.shape)
        if x.shape[0] > 2:  # a Python branch on a static value is fine
            return x * x.ndim + len(x)
        return x.sum() / x.size

    x = rand((3, 4), F32, 3)
    out = spmd.jit(f)(x)
    assert seen == dict(shape=(3, 4), dtype=np.dtype(np.float32), ndim=2, size=12, len=3)
    np.testing.assert_allclose(np.asarray(out), x * 2 + 3, rtol=1e-6)
    assert out.dtype == np.float32
    out2 = spmd.jit(f)(x[:2])
    assert out2.shape == () and out2.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out2), x[:2].mean(), rtol=1e-5)


def test_methods_return_spmd_arrays():
    x = snp.ones((2, 3))
    for y in (x.T, x.sum(), x.reshape(3, 2), x.astype(np.int32), x.ravel(), x.cumsum()):
        assert isinstance(y, spmd.Array)
    out = run(lambda a: a.T, (np.ones((2, 3), np.float32),), "jit")
    assert isinstance(out, spmd.Array) and out.shape == (3, 2)
