"""Every elementwise primitive: derivatives (order 2, fwd and rev) against finite
differences, and vmap against a Python loop."""

import numpy as np
import pytest

import spmd
from spmd import lax
from spmd.test_util import check_grads

rng = np.random.default_rng(1)
POS = lambda shape: rng.uniform(0.5, 2.0, shape)          # noqa: E731
ANY = lambda shape: rng.uniform(-1.5, 1.5, shape)         # noqa: E731
SMALL = lambda shape: rng.uniform(-0.8, 0.8, shape)       # noqa: E731

UNARY = [
    (lax.neg, ANY), (lax.exp, ANY), (lax.log, POS), (lax.log1p, POS), (lax.expm1, ANY),
    (lax.tanh, ANY), (lax.logistic, ANY), (lax.sin, ANY), (lax.cos, ANY), (lax.tan, SMALL),
    (lax.sinh, ANY), (lax.cosh, ANY), (lax.asin, SMALL), (lax.acos, SMALL), (lax.atan, ANY),
    (lax.sqrt, POS), (lax.rsqrt, POS), (lax.abs, POS), (lambda x: lax.integer_pow(x, 3), ANY),
    (lambda x: lax.integer_pow(x, 2), ANY), (lambda x: lax.integer_pow(x, -2), POS),
]
BINARY = [
    (lax.add, ANY, ANY), (lax.sub, ANY, ANY), (lax.mul, ANY, ANY), (lax.div, ANY, POS),
    (lax.pow, POS, ANY), (lax.atan2, ANY, POS), (lax.max, ANY, ANY), (lax.min, ANY, ANY),
    (lax.rem, POS, POS),
]


def _name(f):
    return getattr(f, "__name__", "lambda")


@pytest.mark.parametrize("f,gen", UNARY, ids=[_name(f) for f, _ in UNARY])
def test_unary_grads_and_vmap(f, gen):
    x = gen((3, 2))
    check_grads(f, (x,), order=2, modes=("fwd", "rev"), atol=1e-4, rtol=1e-3)
    xs = x.astype(np.float32)
    got = spmd.vmap(f, in_axes=1)(xs)
    want = np.stack([np.asarray(f(xs[:, i])) for i in range(xs.shape[1])])
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("f,gx,gy", BINARY, ids=[_name(f) for f, _, _ in BINARY])
def test_binary_grads_and_vmap(f, gx, gy):
    x, y = gx((3, 2)), gy((3, 2))
    if f is lax.rem:  # keep away from the jumps of fmod
        x, y = 1.0 + 0.3 * x, 4.0 + y
    check_grads(f, (x, y), order=2, modes=("fwd", "rev"), atol=1e-4, rtol=1e-3)
    xs, ys = x.astype(np.float32), y.astype(np.float32)
    cases = [((0, 0), xs, ys), ((1, 1), xs, ys), ((0, None), xs, ys[0]), ((None, 1), xs[:, 0], ys)]
    for axes, a, b in cases:
        got = spmd.vmap(f, in_axes=axes)(a, b)
        n = (a if axes[0] is not None else b).shape[axes[0] if axes[0] is not None else axes[1]]
        rows = [np.asarray(f(a if axes[0] is None else np.take(a, i, axis=axes[0]),
                             b if axes[1] is None else np.take(b, i, axis=axes[1])))
                for i in range(n)]
        np.testing.assert_allclose(got, np.stack(rows), rtol=1e-6)


def test_select_and_convert_grads():
    p = rng.uniform(size=(3, 2)) > 0.5
    check_grads(lambda a, b: lax.select(p, a, b), (ANY((3, 2)), ANY((3, 2))), order=2)
    check_grads(lambda a: lax.convert_element_type(a, np.float32), (ANY((3,)),), order=1,
                atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("jit", [False, True])
def test_vmap_of_select_with_a_batched_scalar_predicate_and_scalar_cases(jit):
    # The predicate is batched, the cases are unbatched scalars: the cases need the
    # batch axis too (select_n's predicate must have the output's shape).
    p = np.array([True, False, True])
    cases = [(lambda q: spmd.numpy.where(q, 1.0, 2.0), [1.0, 2.0, 1.0]),
             (lambda q: lax.select(q, np.float32(1), np.float32(2)), [1.0, 2.0, 1.0]),
             (lambda q: lax.select_n(q.astype(np.int32), np.float32(1), np.float32(2)),
              [2.0, 1.0, 2.0])]
    for f, want in cases:
        g = spmd.vmap(f)
        np.testing.assert_array_equal(np.asarray((spmd.jit(g) if jit else g)(p)), want)
    # and its derivative in the unbatched case
    dy = spmd.vmap(spmd.grad(lambda x, y: spmd.numpy.where(x > 0, y, 2.0), argnums=1),
                   in_axes=(0, None))(np.array([1.0, -1.0]), 3.0)
    np.testing.assert_array_equal(np.asarray(dy), [1.0, 0.0])
