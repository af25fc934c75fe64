"""Shape manipulation of spmd.numpy against numpy."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _np_helpers import BOOL, F32, I32, check, mode, rand  # noqa: E402,F401

import spmd.numpy as snp  # noqa: E402

X234 = (2, 3, 4)

# (label, function of the module m and array x, input shape)
UNARY_SHAPE_OPS = [
    ("reshape", lambda m, x: m.reshape(x, (6, 4)), X234),
    ("reshape_minus1", lambda m, x: m.reshape(x, (-1,)), X234),
    ("reshape_minus1_mid", lambda m, x: m.reshape(x, (2, -1, 2)), X234),
    ("reshape_minus1_last", lambda m, x: m.reshape(x, (4, -1)), X234),
    ("reshape_int", lambda m, x: m.reshape(x, 24), X234),
    ("reshape_to_scalar", lambda m, x: m.reshape(x, ()), (1, 1)),
    ("reshape_from_scalar", lambda m, x: m.reshape(x, (1, 1, 1)), ()),
    ("transpose", lambda m, x: m.transpose(x), X234),
    ("transpose_axes", lambda m, x: m.transpose(x, (1, 0, 2)), X234),
    ("transpose_neg_axes", lambda m, x: m.transpose(x, (-1, 0, 1)), X234),
    ("transpose_2d", lambda m, x: m.transpose(x), (3, 5)),
    ("swapaxes", lambda m, x: m.swapaxes(x, 0, 2), X234),
    ("swapaxes_neg", lambda m, x: m.swapaxes(x, -1, 1), X234),
    ("moveaxis", lambda m, x: m.moveaxis(x, 0, -1), X234),
    ("moveaxis_neg", lambda m, x: m.moveaxis(x, -1, 0), X234),
    ("moveaxis_tuple", lambda m, x: m.moveaxis(x, (0, 1), (-1, -2)), X234),
    ("expand_dims_0", lambda m, x: m.expand_dims(x, 0), X234),
    ("expand_dims_last", lambda m, x: m.expand_dims(x, -1), X234),
    ("expand_dims_mid", lambda m, x: m.expand_dims(x, 2), X234),
    ("expand_dims_tuple", lambda m, x: m.expand_dims(x, (0, 2)), X234),
    ("expand_dims_scalar", lambda m, x: m.expand_dims(x, 0), ()),
    ("squeeze_all", lambda m, x: m.squeeze(x), (1, 3, 1, 2)),
    ("squeeze_axis", lambda m, x: m.squeeze(x, axis=2), (1, 3, 1, 2)),
    ("squeeze_neg_axis", lambda m, x: m.squeeze(x, axis=-2), (1, 3, 1, 2)),
    ("squeeze_tuple", lambda m, x: m.squeeze(x, axis=(0, 2)), (1, 3, 1, 2)),
    ("squeeze_to_scalar", lambda m, x: m.squeeze(x), (1, 1)),
    ("broadcast_to", lambda m, x: m.broadcast_to(x, (2, 3, 4)), (3, 1)),
    ("broadcast_to_vec", lambda m, x: m.broadcast_to(x, (3, 4)), (4,)),
    ("broadcast_to_scalar", lambda m, x: m.broadcast_to(x, (2, 2)), ()),
    ("broadcast_to_same", lambda m, x: m.broadcast_to(x, X234), X234),
    ("ravel", lambda m, x: m.ravel(x), X234),
    ("ravel_transposed", lambda m, x: m.ravel(m.transpose(x)), X234),
    ("ravel_scalar", lambda m, x: m.ravel(x), ()),
]


@pytest.mark.parametrize("dtype", [F32, I32, BOOL], ids=str)
@pytest.mark.parametrize("label,fn,shape", UNARY_SHAPE_OPS, ids=[c[0] for c in UNARY_SHAPE_OPS])
def test_unary_shape_ops(mode, label, fn, shape, dtype):
    x = rand(shape, dtype, 1)
    check(lambda a: fn(snp, a), lambda a: fn(np, a), x, mode=mode, dtype=dtype,
          rtol=0, atol=0, upcast=False)


JOIN_OPS = [
    ("concatenate_0", lambda m, xs: m.concatenate(xs), [(2, 3), (1, 3), (4, 3)]),
    ("concatenate_1", lambda m, xs: m.concatenate(xs, axis=1), [(2, 3), (2, 1), (2, 5)]),
    ("concatenate_neg", lambda m, xs: m.concatenate(xs, axis=-1), [(2, 2, 3), (2, 2, 1)]),
    ("concatenate_tuple", lambda m, xs: m.concatenate(tuple(xs), axis=0), [(3,), (2,)]),
    ("concatenate_one", lambda m, xs: m.concatenate(xs, axis=0), [(3, 2)]),
    ("stack_0", lambda m, xs: m.stack(xs), [(2, 3)] * 3),
    ("stack_1", lambda m, xs: m.stack(xs, axis=1), [(2, 3)] * 3),
    ("stack_neg", lambda m, xs: m.stack(xs, axis=-1), [(2, 3)] * 2),
    ("stack_scalars", lambda m, xs: m.stack(xs), [()] * 4),
]


@pytest.mark.parametrize("dtype", [F32, I32], ids=str)
@pytest.mark.parametrize("label,fn,shapes", JOIN_OPS, ids=[c[0] for c in JOIN_OPS])
def test_join_ops(mode, label, fn, shapes, dtype):
    xs = [rand(s, dtype, 10 + i) for i, s in enumerate(shapes)]
    check(lambda *a: fn(snp, list(a)), lambda *a: fn(np, list(a)), *xs,
          mode=mode, dtype=dtype, rtol=0, atol=0, upcast=False)


def test_concatenate_promotes_dtypes(mode):
    a, b = rand((2,), I32, 20), rand((3,), F32, 21)
    check(lambda x, y: snp.concatenate([x, y]), lambda x, y: np.concatenate([x, y]),
          a, b, mode=mode, dtype=F32, rtol=0, atol=0)


SPLITS = [
    ("sections", lambda m, x: m.split(x, 3), (6, 2)),
    ("sections_axis1", lambda m, x: m.split(x, 2, axis=1), (3, 4)),
    ("sections_neg_axis", lambda m, x: m.split(x, 2, axis=-1), (2, 3, 4)),
    ("indices", lambda m, x: m.split(x, [1, 4], axis=1), (2, 6)),
    ("indices_axis0", lambda m, x: m.split(x, [2], axis=0), (5, 2)),
    ("one_section", lambda m, x: m.split(x, 1), (3,)),
]


@pytest.mark.parametrize("label,fn,shape", SPLITS, ids=[c[0] for c in SPLITS])
def test_split(mode, label, fn, shape):
    x = rand(shape, F32, 30)
    out = check(lambda a: fn(snp, a), lambda a: fn(np, a), x, mode=mode, dtype=F32,
                rtol=0, atol=0)
    assert isinstance(out, (list, tuple))
