"""Reduction, scan and sort primitives (reduce_prod/and/or, argmax/argmin, cumsum,
cumprod, cummax, cummin, sort) and the numpy reductions built on them: values
against numpy (eager and jit), derivatives against finite differences (order 2,
forward and reverse), exact derivatives at zeros, vmap against a Python loop,
and the errors."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import errors, lax
from spmd.test_util import check_grads

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, low=None, high=None):
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "i":
        return rng.integers(-2 if low is None else low, 3 if high is None else high,
                            size=shape).astype(dtype)
    if low is not None:
        return rng.uniform(low, high, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def run(f, args, mode):
    if mode == "jit":
        return spmd.jit(f)(*args)
    return f(*[snp.asarray(a) for a in args])


def np_cum(fn, x, axis, reverse):
    if reverse:
        return np.flip(fn(np.flip(x, axis), axis=axis), axis)
    return fn(x, axis=axis)


def np_sort_multi(ops, dim, num_keys):
    """numpy reference for lax.sort: stable lexicographic order of the keys."""
    keys = [np.moveaxis(k, dim, -1) for k in ops[:num_keys]]
    moved = [np.moveaxis(o, dim, -1) for o in ops]
    out = [np.empty_like(o) for o in moved]
    for idx in np.ndindex(moved[0].shape[:-1]):
        perm = np.lexsort([k[idx] for k in reversed(keys)])  # lexsort: last key is major
        for o, r in zip(moved, out):
            r[idx] = o[idx][perm]
    return [np.moveaxis(r, -1, dim) for r in out]


CUM = {"cumsum": (lax.cumsum, np.cumsum), "cumprod": (lax.cumprod, np.cumprod),
       "cummax": (lax.cummax, np.maximum.accumulate),
       "cummin": (lax.cummin, np.minimum.accumulate)}


# ------------------------------------------------------------------ values

# (label, spmd function, numpy reference, arguments)
VALUE_CASES = [
    ("reduce_prod_1", lambda x: lax.reduce_prod(x, (1,)), lambda x: x.prod(1),
     [rand(3, 4, 2, low=0.5, high=1.5)]),
    ("reduce_prod_02", lambda x: lax.reduce_prod(x, (0, 2)), lambda x: x.prod((0, 2)),
     [rand(3, 4, 2, low=0.5, high=1.5)]),
    ("reduce_prod_int", lambda x: lax.reduce_prod(x, (0,)),
     lambda x: x.prod(0, dtype=np.int32), [rand(4, 3, dtype=np.int32)]),
    ("reduce_prod_empty", lambda x: lax.reduce_prod(x, (0,)), lambda x: x.prod(0),
     [np.zeros((0, 3), np.float32)]),
    ("reduce_and", lambda x: lax.reduce_and(x, (1,)), lambda x: x.all(1),
     [np.array([[True, True], [True, False], [False, False]])]),
    ("reduce_or", lambda x: lax.reduce_or(x, (0, 1)), lambda x: x.any((0, 1)),
     [rand(3, 4, dtype=np.bool_)]),
    ("reduce_or_empty", lambda x: lax.reduce_or(x, (0,)), lambda x: x.any(0),
     [np.zeros((0, 2), bool)]),
    ("argmax_ties", lambda x: lax.argmax(x, 1, np.int32), lambda x: x.argmax(1),
     [rand(4, 6, dtype=np.int32)]),
    ("argmin_ties", lambda x: lax.argmin(x, 0, np.int32), lambda x: x.argmin(0),
     [rand(6, 4, dtype=np.int32)]),
    ("argmax_nan", lambda x: lax.argmax(x, 0, np.int32), lambda x: x.argmax(0),
     [np.array([1.0, np.nan, 3.0, np.nan], np.float32)]),
    ("argmin_bool", lambda x: lax.argmin(x, -1, np.int32), lambda x: x.argmin(-1),
     [rand(3, 5, dtype=np.bool_)]),
    ("sort_1", lambda x: lax.sort(x, 1), lambda x: np.sort(x, 1), [rand(3, 7)]),
    ("sort_nan", lambda x: lax.sort(x, 0), np.sort,
     [np.array([2.0, np.nan, -1.0, np.inf, 0.0], np.float32)]),
    ("sort_key_val", lambda k, v: lax.sort_key_val(k, v, 0),
     lambda k, v: tuple(np_sort_multi([k, v], 0, 1)),
     [rand(8, 3, dtype=np.int32), rand(8, 3)]),
    ("sort_two_keys", lambda a, b, c: lax.sort((a, b, c), 1, num_keys=2),
     lambda a, b, c: tuple(np_sort_multi([a, b, c], 1, 2)),
     [rand(3, 9, dtype=np.int32, low=0, high=2), rand(3, 9, dtype=np.int32), rand(3, 9)]),
]
for _name, (_lax_fn, _np_fn) in CUM.items():
    for _axis, _reverse in [(0, False), (1, True), (-1, False)]:
        VALUE_CASES.append((
            f"{_name}_{_axis}_{_reverse}",
            (lambda f, a, r: lambda x: f(x, a, r))(_lax_fn, _axis, _reverse),
            (lambda f, a, r: lambda x: np_cum(f, x, a, r))(_np_fn, _axis, _reverse),
            [rand(3, 5, low=0.5, high=1.5) if _name == "cumprod" else rand(3, 5)]))
VALUE_CASES.append(("cummax_int", lambda x: lax.cummax(x, 0), lambda x: np.maximum.accumulate(x),
                    [rand(7, dtype=np.int32)]))
VALUE_CASES.append(("cumsum_int", lambda x: lax.cumsum(x, 0, reverse=True),
                    lambda x: np_cum(lambda v, axis: np.cumsum(v, axis, dtype=np.int32), x, 0,
                                     True), [rand(7, 2, dtype=np.int32)]))


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("label,f,ref,args", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_values(mode, label, f, ref, args):
    out = run(f, args, mode)
    want = ref(*args)
    outs, wants = (out, want) if isinstance(want, tuple) else ((out,), (want,))
    for o, w in zip(outs, wants):
        o = np.asarray(o)
        assert o.shape == w.shape, label
        if w.dtype.kind == "f":
            assert o.dtype == w.dtype
            np.testing.assert_allclose(o, w, rtol=2e-6, atol=1e-6)
        else:
            assert o.dtype.kind == w.dtype.kind
            np.testing.assert_array_equal(o, w)


# ------------------------------------------------------------- derivatives

GRAD_CASES = [
    ("reduce_prod_1", lambda x: lax.reduce_prod(x, (1,)), (3, 5)),
    ("reduce_prod_all", lambda x: lax.reduce_prod(x, (0, 1, 2)), (2, 3, 2)),
    ("reduce_prod_02", lambda x: lax.reduce_prod(x, (0, 2)), (3, 2, 3)),
    ("sort", lambda x: lax.sort(x, 0), (6, 2)),
    ("sort_values", lambda x, y: lax.sort((x, y), 1)[1], [(3, 5), (3, 5)]),
    ("sort_both", lambda x, y: lax.sort((x, y), 1, num_keys=2), [(2, 4), (2, 4)]),
]
for _name, (_lax_fn, _np_fn) in CUM.items():
    for _axis, _reverse in [(0, False), (1, True), (1, False)]:
        GRAD_CASES.append((f"{_name}_{_axis}_{_reverse}",
                           (lambda f, a, r: lambda x: f(x, a, r))(_lax_fn, _axis, _reverse),
                           (3, 5)))


@pytest.mark.parametrize("label,f,shapes", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_check_grads(label, f, shapes):
    shapes = shapes if isinstance(shapes, list) else [shapes]
    # Away from 0 (products stay well conditioned), distinct values (no ties).
    args = [np.sign(rand(*s)) * rand(*s, low=0.5, high=1.5) for s in shapes]
    check_grads(f, args, order=2, modes=("fwd", "rev"))


def _prod_jacobian(x):
    """d prod(x) / dx_i = product of the others (exact, zeros included)."""
    return np.array([np.prod(np.delete(x, i)) for i in range(x.size)])


@pytest.mark.parametrize("x", [[2.0, 0.0, 3.0, 4.0], [0.0, 5.0, 0.0, 2.0], [1.5, -2.0, 3.0],
                               [0.0], [7.0, 0.0, 0.0, 0.0, 1.0]])
def test_prod_derivatives_at_zeros(x):
    x = np.array(x, np.float64)
    f = lambda v: lax.reduce_prod(v, (0,))  # noqa: E731
    np.testing.assert_allclose(spmd.grad(f)(x), _prod_jacobian(x), rtol=1e-12)
    np.testing.assert_allclose(spmd.jacfwd(f)(x), _prod_jacobian(x), rtol=1e-12)
    # Second derivatives: the product of all but i and j, also exact at zeros.
    n = x.size
    hess = np.array([[0.0 if i == j else np.prod(np.delete(x, [i, j])) for j in range(n)]
                     for i in range(n)])
    np.testing.assert_allclose(spmd.hessian(f)(x), hess, rtol=1e-12)


def test_cumprod_derivatives_at_zeros():
    def jacobian(x):
        jac = np.zeros((x.size, x.size))
        for i in range(x.size):
            jac[i, :i + 1] = _prod_jacobian(x[:i + 1])
        return jac

    x = np.array([2.0, 0.0, 3.0, 0.0, 5.0])
    np.testing.assert_allclose(spmd.jacfwd(lambda v: lax.cumprod(v, 0))(x), jacobian(x))
    # Reversed: the scan of the reversed array, reversed.
    np.testing.assert_allclose(spmd.jacrev(lambda v: lax.cumprod(v, 0, reverse=True))(x),
                               jacobian(x[::-1])[::-1, ::-1])


def test_cummax_tangent_follows_the_running_maximum():
    x = np.array([1.0, 3.0, 2.0, 5.0, 4.0])
    want = np.zeros((5, 5))
    for i, j in enumerate([0, 1, 1, 3, 3]):
        want[i, j] = 1.0
    np.testing.assert_allclose(spmd.jacfwd(lambda v: lax.cummax(v, 0))(x), want)
    np.testing.assert_allclose(spmd.jacrev(lambda v: lax.cummin(-v, 0))(x), -want)


def test_sort_tangents_follow_the_permutation():
    x = np.array([3.0, 1.0, 2.0, 1.0])  # a tie: stable order keeps index 1 before 3
    perm = np.argsort(x, kind="stable")
    want = np.eye(4)[perm]
    np.testing.assert_allclose(spmd.jacfwd(lambda v: lax.sort(v, 0))(x), want)
    np.testing.assert_allclose(spmd.jacrev(lambda v: lax.sort(v, 0))(x), want)


@pytest.mark.parametrize("f", [lambda x: lax.argmax(x, 1, np.int32),
                               lambda x: lax.argmin(x, 0, np.int32),
                               lambda x: lax.reduce_and(x > 0, (1,)),
                               lambda x: lax.reduce_or(x > 0, (0, 1))],
                         ids=["argmax", "argmin", "reduce_and", "reduce_or"])
def test_zero_derivative_primitives(f):
    x = rand(3, 4)
    out, t = spmd.jvp(f, (x,), (rand(3, 4),))
    assert np.asarray(t).shape == np.asarray(out).shape
    assert np.asarray(t).dtype.names == ("float0",) or not np.any(np.asarray(t))
    # Reverse mode through an index: the index itself contributes nothing.
    g = spmd.grad(lambda v: snp.sum(v * f(v).astype(np.float32).sum()))(x)
    np.testing.assert_allclose(g, np.full_like(x, np.asarray(f(x)).astype(np.float32).sum()))


def test_numpy_front_end_grads():
    x = np.sign(rand(3, 4)) * rand(3, 4, low=0.5, high=1.5)
    for f in (lambda v: snp.var(v, axis=1), lambda v: snp.std(v, axis=0, ddof=1),
              lambda v: snp.prod(v, axis=(0, 1)), lambda v: snp.mean(v),
              lambda v: snp.cumprod(v, axis=1), lambda v: snp.sort(v, axis=0),
              lambda v: snp.sort(v, axis=None, descending=True), lambda v: snp.ptp(v, 1)):
        check_grads(f, (x,), order=2, modes=("fwd", "rev"))


# -------------------------------------------------------------------- vmap

VMAP_CASES = [
    ("reduce_prod", lambda x: lax.reduce_prod(x, (1,)), np.float32),
    ("reduce_and", lambda x: lax.reduce_and(x, (0,)), np.bool_),
    ("reduce_or", lambda x: lax.reduce_or(x, (1,)), np.bool_),
    ("argmax", lambda x: lax.argmax(x, 1, np.int32), np.int32),
    ("argmin", lambda x: lax.argmin(x, 0, np.int32), np.int32),
    ("sort", lambda x: lax.sort(x, 1), np.float32),
    ("argsort", lambda x: snp.argsort(x, axis=0), np.int32),
    ("var", lambda x: snp.var(x, axis=1), np.float32),
] + [(f"{n}_{r}", (lambda f, r: lambda x: f(x, 1, r))(f, r), np.float32)
     for n, (f, _) in CUM.items() for r in (False, True)]


@pytest.mark.parametrize("in_axis", [0, 1])
@pytest.mark.parametrize("label,f,dtype", VMAP_CASES, ids=[c[0] for c in VMAP_CASES])
def test_vmap_against_loop(label, f, dtype, in_axis):
    x = rand(4, 3, 5, dtype=dtype)
    out = spmd.vmap(f, in_axes=in_axis)(x)
    want = np.stack([np.asarray(f(np.take(x, i, axis=in_axis))) for i in range(x.shape[in_axis])])
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 1), (1, 0), (0, 0)])
def test_vmap_multi_operand_sort(in_axes):
    # Batch of 4 examples, each sorting 5 int keys (with ties) and carrying values.
    def make(d, dtype):
        if d is None:
            return rand(5, dtype=dtype)
        return rand(4, 5, dtype=dtype) if d == 0 else rand(5, 4, dtype=dtype)

    k, v = make(in_axes[0], np.int32), make(in_axes[1], np.float32)
    f = lambda a, b: lax.sort((a, b), 0, num_keys=1)  # noqa: E731
    out = spmd.vmap(f, in_axes=in_axes)(k, v)
    for i in range(4):
        ki = k if in_axes[0] is None else np.take(k, i, axis=in_axes[0])
        vi = v if in_axes[1] is None else np.take(v, i, axis=in_axes[1])
        for o, w in zip(out, np_sort_multi([ki, vi], 0, 1)):
            np.testing.assert_array_equal(np.asarray(o)[i], w)


def test_vmap_of_grads():
    x = rand(4, 6)
    for f in (lambda v: lax.sort(v, 0)[-1] * lax.reduce_prod(v, (0,)),
              lambda v: lax.cummax(v, 0).sum() + lax.cumprod(v, 0, True).sum()):
        out = spmd.vmap(spmd.grad(f))(x)
        want = np.stack([np.asarray(spmd.grad(f)(r)) for r in x])
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5)


# ---------------------------------------------------------- front end

@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_var_is_numerically_sane(mode):
    # A large offset: a one-pass E[x^2] - E[x]^2 would lose every digit in float32.
    x = (1e4 + rand(1000)).astype(np.float32)
    got = run(lambda a: snp.var(a), (x,), mode)
    np.testing.assert_allclose(got, np.var(x.astype(np.float64)), rtol=1e-3)
    got = run(lambda a: snp.std(a, ddof=1), (x,), mode)
    np.testing.assert_allclose(got, np.std(x.astype(np.float64), ddof=1), rtol=1e-3)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_front_end_dtypes_and_options(mode):
    xi = rand(3, 4, dtype=np.int8)
    xb = rand(3, 4, dtype=np.bool_)
    xf = rand(3, 4)
    cases = [
        (lambda a: snp.prod(a, axis=1), xi, np.int32, xi.prod(1, dtype=np.int32)),
        (lambda a: snp.cumsum(a), xb, np.int32, np.cumsum(xb, dtype=np.int32)),
        (lambda a: snp.cumprod(a, axis=0), xi, np.int32, np.cumprod(xi, 0, dtype=np.int32)),
        (lambda a: snp.var(a, axis=0, ddof=1), xi, np.float32, np.var(xi, 0, ddof=1)),
        (lambda a: snp.argmax(a, keepdims=True), xf, np.int32,
         np.argmax(xf, keepdims=True)),
        (lambda a: snp.argmin(a, axis=-1, keepdims=True), xf, np.int32,
         np.argmin(xf, -1, keepdims=True)),
        (lambda a: snp.any(a, axis=0), xf > 1, np.bool_, np.any(xf > 1, 0)),
        (lambda a: snp.all(a, axis=(0, 1), keepdims=True), xf, np.bool_,
         np.all(xf, (0, 1), keepdims=True)),
        (lambda a: snp.ptp(a, axis=1), xi, np.int8, np.ptp(xi, 1)),
        (lambda a: snp.sort(a, axis=None), xf, np.float32, np.sort(xf, None)),
        (lambda a: snp.sort(a, axis=0, descending=True), xi, np.int8, -np.sort(-xi, 0)),
        (lambda a: snp.argsort(a, axis=1, descending=True), xi, np.int32,
         np.argsort(-xi.astype(np.int32), 1, kind="stable")),
        (lambda a: snp.argsort(a, axis=None), xi, np.int32, np.argsort(xi, None, kind="stable")),
        (lambda a: a.argmax(axis=0), xf, np.int32, xf.argmax(0)),
        (lambda a: a.cumsum(axis=1), xi, np.int32, xi.cumsum(1, dtype=np.int32)),
    ]
    for f, x, dt, want in cases:
        got = np.asarray(run(f, (x,), mode))
        assert got.dtype == dt, (got.dtype, dt)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_errors():
    with pytest.raises(errors.ArgumentError, match="empty"):
        snp.argmax(np.zeros((0, 3), np.float32), axis=0)
    with pytest.raises(errors.ArgumentError, match="empty"):
        lax.argmin(np.zeros((2, 0), np.float32), 1, np.int32)
    with pytest.raises(errors.DTypeError, match="reduce_and"):
        lax.reduce_and(np.ones(3, np.float32), (0,))
    with pytest.raises(errors.DTypeError, match="reduce_prod"):
        lax.reduce_prod(np.ones(3, bool), (0,))
    with pytest.raises(errors.ShapeError, match="0-d"):
        lax.sort(np.float32(1.0))
    with pytest.raises(errors.ShapeError, match="one shape"):
        lax.sort((np.ones(3, np.float32), np.ones(4, np.float32)), 0)
    with pytest.raises(errors.ArgumentError, match="num_keys"):
        lax.sort((np.ones(3, np.float32),), 0, num_keys=2)
    with pytest.raises(errors.ArgumentError, match="axis"):
        lax.cumsum(np.ones((2, 3), np.float32), 2)
    with pytest.raises(errors.ArgumentError):
        snp.var(np.ones((2, 3)), axis=2)
    with pytest.raises(errors.ArgumentError, match="out="):
        snp.sum(np.ones(3), out=np.ones(()))
