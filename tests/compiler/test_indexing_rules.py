"""Indexing primitives (dynamic_slice, dynamic_update_slice, gather, scatter) and the
numpy front end over them: values against numpy eagerly and under jit, out-of-bounds
behaviour, errors, derivatives (check_grads) and vmap against a Python loop."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.errors import ConcretizationError, DTypeError, IndexOutOfBoundsError, ShapeError
from spmd.test_util import check_grads

MODES = ("eager", "jit")
RNG = np.random.default_rng(0)
X3 = RNG.standard_normal((4, 3, 5)).astype(np.float32)
MASK_4 = np.array([True, False, True, True])
MASK_35 = RNG.random((3, 5)) < 0.5


def run(fn, args, mode):
    if mode == "eager":
        return fn(*[snp.asarray(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in args])
    return spmd.jit(fn)(*args)


def same(got, want, dtype=None):
    assert isinstance(got, spmd.Array), type(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == (want.dtype if dtype is None else dtype), (got.dtype, want.dtype)
    np.testing.assert_array_equal(np.asarray(got), want)


# --------------------------------------------------------------- getitem: static

STATIC = [
    1, -1, (1, 2), (-4, -3, -5), slice(1, 3), (slice(None), slice(None, None, 2)),
    slice(None, None, -1), (slice(3, 0, -2), slice(None), slice(-1, None, -3)),
    slice(10, None), slice(-10, 2), slice(2, -10, -1), slice(5, 1),
    None, (None, Ellipsis, None), (Ellipsis, 1), (1, Ellipsis), (Ellipsis,), (),
    (slice(None), None, 1), (None, 1, None, slice(1, None)),
    np.array([0, 2]), np.array([0, -1, 1, 0]), np.array([3, 1]), np.array([], np.intp), np.array([[0, 1], [3, 2]]),
    (slice(None), np.array([1, 0, 1])), (np.array([0, 2, 3]), np.array([1, 1, 0])),
    (np.array([3, 0]), slice(1, None)), (slice(None), np.array([2, 0]), np.array([4, 1])),
    (np.array([1, 2]), slice(None), np.array([0, 4])),          # not adjacent: B first
    (1, slice(None), np.array([0, 4, 2])),                      # int + array, not adjacent
    (slice(None), 1, np.array([0, 4, 2])),                      # int + array, adjacent
    (np.array([1, 2]), None, np.array([0, 1])),                 # None separates
    (slice(None), np.array([0, 1]), Ellipsis, np.array([0, 1])),  # Ellipsis separates
    (np.array([[0], [3]]), slice(None, None, -1), np.array([1, 2, 0])),
    (Ellipsis, np.array([4, 4]), None),
    np.int32(2), np.array(1), (np.int64(-1), slice(None)),
    MASK_4, (slice(None), MASK_35), (MASK_4, 2), (MASK_4, slice(None), np.array([0, 4, 1])),
    True, False, (True, 1), (slice(None), False),
    (slice(1, 3), slice(None, None, -2), np.array([[4], [0]])),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("idx", STATIC, ids=[repr(i) for i in STATIC])
def test_getitem_static(mode, idx):
    same(run(lambda x: x[idx], (X3,), mode), X3[idx])


@pytest.mark.parametrize("mode", MODES)
def test_getitem_concrete_spmd_index_and_mask(mode):
    same(run(lambda x: x[snp.asarray(MASK_4)], (X3,), mode), X3[MASK_4])
    same(run(lambda x: x[:, snp.asarray(np.array([2, -1]))], (X3,), mode), X3[:, [2, -1]])
    same(run(lambda x: x[snp.asarray(np.int32(3))], (X3,), mode), X3[3])


def test_getitem_int_dtype_and_0d():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    same(snp.asarray(x)[1, ::-2], x[1, ::-2])
    s = snp.asarray(np.float32(3.0))
    same(s[()], np.float32(3.0))
    same(s[None], np.array([3.0], np.float32))
    same(s[...], np.float32(3.0))


# --------------------------------------------------------------- getitem: traced

TRACED = [  # (index builder from the traced index i, index value)
    (lambda i: i, np.int32(2)),
    (lambda i: i, np.int32(-1)),
    (lambda i: (slice(None), i), np.int32(2)),
    (lambda i: (i, slice(None, None, -1), 1), np.int32(-3)),
    (lambda i: (Ellipsis, i), np.int32(0)),
    (lambda i: i, np.array([3, -1, 0])),
    (lambda i: (slice(None), i), np.array([[2, 0], [1, 1]])),
    (lambda i: (i, slice(1, None), i), np.array([1, 2])),
    (lambda i: (slice(None), 1, i), np.array([0, -5])),
    (lambda i: (i, np.array([0, 2])), np.array([1, 3])),
    (lambda i: (i, None, np.int32(2)), np.array([1, 3])),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", range(len(TRACED)))
def test_getitem_traced(mode, k):
    build, i = TRACED[k]
    same(run(lambda x, j: x[build(j)], (X3, i), mode), X3[build(i)])


def test_getitem_traced_out_of_bounds_clamps():
    x = np.arange(5, dtype=np.float32)
    f = spmd.jit(lambda a, i: a[i])
    same(f(x, np.int32(7)), np.float32(4))      # dynamic_slice clamps
    same(f(x, np.int32(-9)), np.float32(0))
    same(f(x, np.array([7, -9, 2])), np.array([4, 0, 2], np.float32))  # gather clamps


def test_getitem_program_uses_slice_and_dynamic_slice():
    txt = str(spmd.make_jaxpr(lambda x, i: x[1:3, i])(X3, np.int32(1)))
    assert "slice" in txt and "dynamic_slice" in txt and "gather" not in txt
    txt = str(spmd.make_jaxpr(lambda x, i: x[:, i])(X3, np.array([0, 1])))
    assert "gather" in txt


# --------------------------------------------------------------- getitem: errors

def test_static_out_of_bounds_int_raises():
    x = snp.asarray(X3)
    with pytest.raises(IndexOutOfBoundsError, match=r"index 5 .*axis 1 with size 3"):
        x[0, 5]
    with pytest.raises(IndexOutOfBoundsError, match=r"index -5 .*axis 0 with size 4"):
        x[-5]
    with pytest.raises(IndexError):  # still an IndexError for numpy-style code
        spmd.jit(lambda a: a[:, :, 9])(X3)
    with pytest.raises(IndexOutOfBoundsError, match="too many indices"):
        x[0, 0, 0, 0]


def test_bad_index_errors():
    x = snp.asarray(X3)
    with pytest.raises(ConcretizationError, match="snp.where"):
        spmd.jit(lambda a, m: a[m])(X3, MASK_4)
    with pytest.raises(DTypeError):
        x[1.5]
    with pytest.raises(DTypeError):
        x[np.array([0.0, 1.0])]
    with pytest.raises(ConcretizationError, match="dynamic_slice"):
        spmd.jit(lambda a, i: a[i:])(X3, np.int32(1))
    with pytest.raises(ValueError, match="single ellipsis"):
        x[..., 0, ...]
    with pytest.raises(IndexError, match="boolean index"):
        x[np.array([True, False])]
    with pytest.raises(ShapeError, match="broadcast"):
        x[np.array([0, 1]), np.array([0, 1, 2])]
    with pytest.raises(ValueError, match="step cannot be zero"):
        x[::0]


# ------------------------------------------------------------- primitives directly

def test_dynamic_slice_and_update_clamp():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    i32 = np.int32
    same(lax.dynamic_slice(x, [i32(3), i32(-2)], [2, 3]), x[2:4, 0:3])
    same(lax.dynamic_slice(x, [i32(1), i32(1)], [0, 5]), x[1:1, 0:5])
    u = -np.ones((2, 2), np.float32)
    want = x.copy()
    want[2:4, 3:5] = u
    same(lax.dynamic_update_slice(x, u, [i32(9), i32(4)]), want)
    f = spmd.jit(lambda a, b, s: lax.dynamic_update_slice(a, b, [s, s]))
    want = x.copy()
    want[0:2, 0:2] = u
    same(f(x, u, i32(-4)), want)


def test_gather_modes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    i = np.array([[5, -1], [2, 0]])
    same(lax.gather(x, [i], (1,)), np.moveaxis(x[:, np.clip(i, 0, 3)], 0, -1))
    got = np.asarray(lax.gather(x, [i, i], (0, 1), "fill", -7.0))
    ok = (i >= 0) & (i < 3)
    np.testing.assert_array_equal(got, np.where(ok, x[np.clip(i, 0, 2), np.clip(i, 0, 3)], -7))


UFUNCS = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


@pytest.mark.parametrize("mode", ["set", "add", "mul", "min", "max"])
@pytest.mark.parametrize("jit", [False, True])
def test_scatter_modes_vs_ufunc_at(mode, jit):
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    i = np.array([4, 0, 4, 9, -1, 2, 4]) if mode != "set" else np.array([4, 0, 9, -1, 2])
    u = RNG.uniform(0.5, 2, (len(i), 3)).astype(np.float32)
    f = lambda a, b: lax.scatter(a, b, [i], (0,), mode)  # noqa: E731
    got = (spmd.jit(f) if jit else f)(x, u)
    keep = (i >= 0) & (i < 5)  # out-of-bounds updates are dropped
    want = x.copy()
    if mode == "set":
        want[i[keep]] = u[keep]
    else:
        UFUNCS[mode].at(want, i[keep], u[keep])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert got.dtype == np.float32


def test_scatter_multi_axis_and_int_dtype():
    x = np.zeros((3, 4, 2), np.int32)
    i, j = np.array([[0, 2], [2, 2]]), np.array([[1, 3], [3, 3]])
    u = np.arange(8, dtype=np.int32).reshape(2, 2, 2)
    want = x.copy()
    np.add.at(want, (i, j), u)
    same(lax.scatter(x, u, [i, j], (0, 1), "add"), want)
    want = np.zeros((3, 2, 4), np.int32)
    np.maximum.at(np.moveaxis(want, 2, 0), (j, i), u)
    same(lax.scatter(np.zeros((3, 2, 4), np.int32), u, [j, i], (2, 0), "max"), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.int32])
@pytest.mark.parametrize("axes", [(0,), (1,), (0, 2)])
def test_many_updates_are_summed_per_target_as_ufunc_at(dtype, axes):
    """Past indexing_kernels.SORTED_ADD_MIN updates, scatter-add sums each target's updates
    before adding them (an embedding's gradient): np.add.at's result within float
    rounding (exactly for ints), out-of-bounds updates dropped, the same bits on every
    call, under jit and eagerly."""
    from spmd.compiler.ops import indexing_kernels

    rng = np.random.default_rng(7)
    shape = (6, 5, 4)
    n = 4 * indexing_kernels.SORTED_ADD_MIN
    idx = [rng.integers(-2, shape[a] + 2, n) for a in axes]  # repeats and out of bounds
    rest = tuple(s for d, s in enumerate(shape) if d not in axes)
    u = (rng.standard_normal((n,) + rest) * 8).astype(dtype)
    x = (rng.standard_normal(shape) * 8).astype(dtype)
    f = lambda a, b: lax.scatter(a, b, idx, axes, "add")  # noqa: E731
    keep = np.logical_and.reduce([(i >= 0) & (i < shape[a]) for i, a in zip(idx, axes)])
    want = x.copy()
    np.add.at(np.moveaxis(want, axes, tuple(range(len(axes)))),
              tuple(i[keep] for i in idx), u[keep])
    for got in (f(x, u), spmd.jit(f)(x, u)):
        if np.dtype(dtype).kind == "i":
            np.testing.assert_array_equal(np.asarray(got), want)
        else:
            np.testing.assert_allclose(np.asarray(got), want,
                                       rtol=1e-5 if dtype != np.float64 else 1e-12, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(f(x, u)), np.asarray(f(x, u)))


def test_primitive_shape_errors():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ShapeError):
        lax.scatter(x, np.zeros((2, 3), np.float32), [np.array([0, 1])], (0,), "add")
    with pytest.raises(DTypeError):
        lax.scatter(x, np.zeros((2, 4), np.int32), [np.array([0, 1])], (0,), "add")
    with pytest.raises(DTypeError):
        lax.gather(x, [np.array([0.0])], (0,))
    with pytest.raises(ShapeError):
        lax.dynamic_slice(x, [np.int32(0), np.int32(0)], [4, 4])
    with pytest.raises(DTypeError):
        lax.dynamic_slice(x, [np.float32(0), np.int32(0)], [1, 1])


# ----------------------------------------------------------------- .at updates

_OPS = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}


def _np_update(method, x, idx, v, repeated=False):
    y = x.copy()
    if method == "set":
        y[idx] = v
    elif repeated:  # accumulate at repeated positions
        _OPS[method].at(y, idx, v)
    else:
        y[idx] = _OPS[method](y[idx], v)
    return y


AT = [  # (index, value shape) on x of shape (4, 3, 5); "rep" marks repeated positions
    (1, ()), ((-1, 2), (5,)), (slice(None, None, 2), (3, 5)), ((Ellipsis, slice(3, 0, -1)), ()),
    ((None, 1, slice(1, 3)), (1, 1, 2, 5)), ((slice(None), None, 0), (4, 1, 5)),
    (np.array([2, 0]), (2, 3, 5)), ((slice(None), np.array([2, 0, 1])), (3, 5)),
    ((np.array([1, 3]), slice(None), np.array([0, 4])), (2, 3)),
    ((slice(1, None), 2, np.array([[0], [4]])), (3, 2, 1)),
    (MASK_4, ()), ((slice(None), MASK_35), (4, 1)),
    ((np.array([0, 3, 0, 0]), "rep"), (4, 3, 5)),
    ((np.array([1, 1, 3]), np.array([2, 2, 0]), "rep"), (3, 5)),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ["set", "add", "multiply", "min", "max"])
@pytest.mark.parametrize("k", range(len(AT)))
def test_at_methods(mode, method, k):
    idx, vshape = AT[k]
    repeated = isinstance(idx, tuple) and isinstance(idx[-1], str)
    if repeated:
        if method == "set":
            pytest.skip("set at repeated positions has no defined order")
        idx = idx[:-1] if len(idx) > 2 else idx[0]
    v = RNG.uniform(0.5, 2, vshape).astype(np.float32)
    got = run(lambda x, b: getattr(x.at[idx], method)(b), (X3, v), mode)
    np.testing.assert_allclose(np.asarray(got), _np_update(method, X3, idx, v, repeated),
                               rtol=1e-6)
    assert got.dtype == np.float32 and got.shape == X3.shape


@pytest.mark.parametrize("mode", MODES)
def test_at_traced_index_and_out_of_bounds(mode):
    x = np.arange(6, dtype=np.float32)
    i = np.array([5, 9, -1, -8, 5])  # 9 and -8 are out of bounds: dropped
    got = run(lambda a, j: a.at[j].add(1.0), (x, i), mode)
    np.testing.assert_array_equal(np.asarray(got), [0, 1, 2, 3, 4, 8])  # -1 is 5
    if mode == "jit":  # a traced scalar out of bounds: dropped
        got = run(lambda a, j: a.at[j].set(-1.0), (x, np.int32(7)), mode)
        np.testing.assert_array_equal(np.asarray(got), x)
    else:  # a concrete one is a static index: an error, as in numpy
        with pytest.raises(IndexOutOfBoundsError):
            run(lambda a, j: a.at[j].set(-1.0), (x, np.int32(7)), mode)
    got = run(lambda a, j: a.at[j].set(-1.0), (x, np.int32(-2)), mode)
    np.testing.assert_array_equal(np.asarray(got), [0, 1, 2, 3, -1, 5])
    got = run(lambda a, j: a.at[j].set(-1.0, mode="clip"), (x, np.array([9])), mode)
    np.testing.assert_array_equal(np.asarray(got), [0, 1, 2, 3, 4, -1])
    got = run(lambda a: a.at[np.array([9, 1])].get(mode="fill", fill_value=-3.0), (x,), mode)
    np.testing.assert_array_equal(np.asarray(got), [-3, 1])
    got = run(lambda a: a.at[np.array([9, 1])].get(), (x,), mode)
    np.testing.assert_array_equal(np.asarray(got), [5, 1])


def test_at_casts_values_and_checks_shapes():
    x = snp.asarray(np.zeros((2, 3), np.int32))
    y = x.at[0].set(np.array([1.7, 2.2, -3.9], np.float32))
    same(y, np.array([[1, 2, -3], [0, 0, 0]], np.int32))
    same(snp.asarray(np.float32(1)).at[()].add(2), np.float32(3))
    with pytest.raises(ShapeError, match="indexed shape"):
        x.at[0].set(np.ones(2, np.int32))
    with pytest.raises(IndexOutOfBoundsError):
        x.at[2].set(1)


def test_at_static_window_uses_dynamic_update_slice():
    txt = str(spmd.make_jaxpr(lambda x: x.at[1:3, 0].add(1.0))(X3))
    assert "dynamic_update_slice" in txt and "scatter" not in txt
    txt = str(spmd.make_jaxpr(lambda x: x.at[::2].add(1.0))(X3))
    assert "scatter" in txt


# ------------------------------------------------------------ take, take_along_axis

@pytest.mark.parametrize("mode", MODES)
def test_take(mode):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for axis, idx in [(None, np.array([23, 0, -1])), (1, np.array([[2, 0], [1, -3]])),
                      (-1, np.int32(3)), (0, np.array([1, 1, 0]))]:
        same(run(lambda x, i: snp.take(x, i, axis=axis), (a, idx), mode),
             np.take(a, idx, axis=axis))
    got = run(lambda x: snp.take(x, np.array([5, -5, 1]), axis=1), (a[0],), mode)
    np.testing.assert_array_equal(np.asarray(got)[:, 2], a[0][:, 1])
    assert np.isnan(np.asarray(got)[:, :2]).all()  # JAX's default mode="fill": NaN
    same(run(lambda x: snp.take(x, np.array([5, -4]), axis=1, mode="clip"), (a[0],), mode),
         np.take(a[0], [3, 0], axis=1))
    same(run(lambda x: snp.take(x, np.array([5, -5]), axis=1, mode="wrap"), (a[0],), mode),
         np.take(a[0], [5, -5], axis=1, mode="wrap"))
    got = snp.take(np.arange(3, dtype=np.int32), np.array([3]))
    same(got, np.array([np.iinfo(np.int32).min], np.int32))


@pytest.mark.parametrize("mode", MODES)
def test_take_along_axis(mode):
    a = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    for axis, ishape in [(0, (2, 4, 5)), (1, (3, 6, 5)), (-1, (3, 4, 2)), (1, (1, 3, 5)),
                         (2, (3, 1, 7))]:
        n = a.shape[axis]
        idx = RNG.integers(-n, n, ishape)
        same(run(lambda x, i: snp.take_along_axis(x, i, axis=axis), (a, idx), mode),
             np.take_along_axis(a, np.where(idx < 0, idx + n, idx), axis=axis))
    idx = np.array([59, 0, -1])
    same(run(lambda x: snp.take_along_axis(x, idx, axis=None), (a,), mode),
         np.take_along_axis(a.ravel(), np.array([59, 0, 59]), axis=None))
    with pytest.raises(ShapeError):
        snp.take_along_axis(a, np.zeros((3, 4), np.int32), axis=1)


# ----------------------------------------------------------------- derivatives

X = RNG.standard_normal((4, 5))
U = RNG.standard_normal((6, 5))
I_REP = np.array([3, 0, 3, 9, -1, 3])     # repeated and out-of-bounds positions
I_UNIQ = np.array([3, 0, 2, 9, -1, 1])
S = np.int32


GRAD_FUNS = {
    "gather": (lambda x: lax.gather(x, [I_REP], (0,)), (X,)),
    "gather_fill": (lambda x: lax.gather(x, [I_REP, I_REP], (0, 1), "fill", 2.0), (X,)),
    "gather_axis1": (lambda x: lax.gather(x, [np.array([[4, 0], [2, 4]])], (1,)), (X,)),
    "dynamic_slice": (lambda x: lax.dynamic_slice(x, [S(3), S(-1)], [2, 3]), (X,)),
    "dynamic_update_slice": (
        lambda x, u: lax.dynamic_update_slice(x, u[:2, :3], [S(1), S(4)]), (X, U)),
    "scatter_add": (lambda x, u: lax.scatter(x, u, [I_REP], (0,), "add"), (X, U)),
    "scatter_set": (lambda x, u: lax.scatter(x, u, [I_UNIQ], (0,), "set"), (X, U)),
    "scatter_mul": (lambda x, u: lax.scatter(x, u, [I_REP], (0,), "mul"), (X, U)),
    "scatter_min": (lambda x, u: lax.scatter(x, u, [I_REP], (0,), "min"), (X, U)),
    "scatter_max": (lambda x, u: lax.scatter(x, u, [I_REP], (0,), "max"), (X, U)),
    "getitem": (lambda x: x[1:, ::-2][np.array([2, 0, 0]), 1:] * x[-1, 2], (X,)),
    "at_add": (lambda x, u: snp.asarray(x).at[:, np.array([4, 4, 0])].add(u[:4, :3] ** 2), (X, U)),
    "take_along_axis": (lambda x: snp.take_along_axis(x, np.array([[1], [4], [0], [4]]), 1),
                        (X,)),
}


@pytest.mark.parametrize("name", list(GRAD_FUNS))
def test_check_grads(name):
    f, args = GRAD_FUNS[name]
    check_grads(f, args, order=2, modes=("fwd", "rev"))


def test_scatter_mul_grad_with_zero_updates():
    u = U.copy()
    u[0, 1] = 0.0  # the only zero at its position: exact to second order
    u[2, 3] = u[5, 3] = 0.0  # two zeros at one position: first order exact
    f = lambda x, u: lax.scatter(x, u, [I_REP], (0,), "mul")  # noqa: E731
    check_grads(f, (X, u), order=1)
    u2 = U.copy()
    u2[0, 1] = 0.0
    check_grads(f, (X, u2), order=2)


def test_scatter_extremum_ties_share_the_tangent():
    x = np.array([1.0, 5.0])
    u = np.array([5.0, 5.0])
    _, t = spmd.jvp(lambda x, u: lax.scatter(x, u, [np.array([1, 1])], (0,), "max"),
                    (x, u), (np.array([0.0, 3.0]), np.array([6.0, 0.0])))
    np.testing.assert_allclose(np.asarray(t), [0.0, 3.0])  # mean of 3, 6, 0


# ----------------------------------------------------------------------- vmap

NB = 3
XB = RNG.standard_normal((NB, 4, 5)).astype(np.float32)
UB = RNG.standard_normal((NB, 2, 5)).astype(np.float32)
IB = RNG.integers(-1, 6, (NB, 2)).astype(np.int32)
SB = RNG.integers(-4, 4, (NB,)).astype(np.int32)  # in bounds for both axes

VMAP_FUNS = {  # f(x, u, i, s) with x (4, 5), u (2, 5), i (2,), s ()
    "gather": lambda x, u, i, s: lax.gather(x, [i, i[::-1]], (1, 0)),
    "gather_fill": lambda x, u, i, s: lax.gather(x, [i], (0,), "fill", -1.0),
    "dynamic_slice": lambda x, u, i, s: lax.dynamic_slice(x, [s, i[0]], [2, 3]),
    "dynamic_update_slice": lambda x, u, i, s: lax.dynamic_update_slice(x, u, [i[1], s]),
    "scatter_add": lambda x, u, i, s: lax.scatter(x, u, [i], (0,), "add"),
    "scatter_max": lambda x, u, i, s: lax.scatter(x, u, [i], (0,), "max"),
    "scatter_set_axis1": lambda x, u, i, s: lax.scatter(x.T, u, [i], (1,), "set"),
    "getitem": lambda x, u, i, s: snp.asarray(x)[s, i] + snp.asarray(x)[1:3, s].sum(),
    "at_mul": lambda x, u, i, s: snp.asarray(x).at[i, s].multiply(u[:, 0]),
}

# which of (x, u, i, s) are batched
BATCHINGS = {"x": (1, 1, 0, 0), "idx": (0, 0, 1, 1), "both": (1, 1, 1, 1),
             "x_only_idx_only": (1, 0, 1, 0)}


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("which", list(BATCHINGS))
@pytest.mark.parametrize("name", list(VMAP_FUNS))
def test_vmap_vs_loop(name, which, axis):
    f = VMAP_FUNS[name]
    full = (XB, UB, IB, SB)
    flags = BATCHINGS[which]
    args, in_axes = [], []
    for a, b in zip(full, flags):
        if not b:
            args.append(a[0])
            in_axes.append(None)
        else:
            ax = min(axis, a.ndim - 1)
            args.append(np.moveaxis(a, 0, ax))
            in_axes.append(ax)
    got = spmd.vmap(f, in_axes=tuple(in_axes))(*args)
    want = np.stack([np.asarray(f(*[a[k] if b else a[0] for a, b in zip(full, flags)]))
                     for k in range(NB)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    got = spmd.jit(spmd.vmap(f, in_axes=tuple(in_axes)))(*args)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_grad_of_vmap_of_gather():
    f = lambda x, i: lax.gather(x, [i], (0,)).sum()  # noqa: E731
    g = spmd.grad(lambda x: spmd.vmap(f, in_axes=(0, 0))(x, IB).sum())(XB)
    want = np.zeros_like(XB)
    for k in range(NB):
        np.add.at(want[k], np.clip(IB[k], 0, 3), 1.0)
    np.testing.assert_allclose(np.asarray(g), want)


def test_dynamic_slices_of_a_batch_of_one_are_slices():
    # A batch of one with its own start: a dynamic (update) slice, not a gather of windows.
    import spmd
    from spmd import lax

    x = np.arange(24.0, dtype=np.float32).reshape(4, 6)
    sl = spmd.vmap(lambda x, i: lax.dynamic_slice(x, (i, 1), (2, 3)))
    for i in (0, 1, 2, 3, -1):
        c = min(max(i, 0), 2)
        np.testing.assert_array_equal(np.asarray(sl(x[None], np.array([i], np.int32)))[0],
                                      x[c:c + 2, 1:4])
    assert "gather" not in str(spmd.make_jaxpr(sl)(x[None], np.array([1], np.int32)))
    unbatched = spmd.vmap(lambda i: lax.dynamic_slice(x, (i, 0), (1, 6)))
    np.testing.assert_array_equal(np.asarray(unbatched(np.array([2], np.int32)))[0], x[2:3])
    up = spmd.vmap(lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 2)))
    got = np.asarray(up(x[None], -np.ones((1, 1, 3), np.float32), np.array([3], np.int32)))[0]
    want = x.copy()
    want[3, 2:5] = -1
    np.testing.assert_array_equal(got, want)
    assert "scatter" not in str(spmd.make_jaxpr(up)(x[None], -np.ones((1, 1, 3), np.float32),
                                                    np.array([3], np.int32)))
