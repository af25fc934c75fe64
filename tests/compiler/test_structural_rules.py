"""Structural primitives (concatenate, pad, slice, rev, broadcast_in_dim, reshape,
squeeze, transpose) and the numpy shape/creation/linalg front end built on them:
values against numpy (eager and jit), derivatives against finite differences,
vmap against a Python loop, and the errors."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import errors, lax
from spmd.test_util import check_grads

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def np_pad(x, value, config):
    """Reference lax.pad: interior padding, then (possibly negative) edge padding."""
    for d, (lo, hi, it) in enumerate(config):
        n = x.shape[d]
        size = n + max(n - 1, 0) * it
        shape = list(x.shape)
        shape[d] = size
        grown = np.full(shape, value, x.dtype)
        idx = [slice(None)] * x.ndim
        idx[d] = slice(0, size, it + 1)
        grown[tuple(idx)] = x
        x = grown
        if lo >= 0:
            x = np.concatenate([np.full(x.shape[:d] + (lo,) + x.shape[d + 1:], value, x.dtype),
                                x], axis=d)
        else:
            x = np.take(x, range(-lo, x.shape[d]), axis=d)
        if hi >= 0:
            x = np.concatenate([x, np.full(x.shape[:d] + (hi,) + x.shape[d + 1:], value,
                                           x.dtype)], axis=d)
        else:
            x = np.take(x, range(0, x.shape[d] + hi), axis=d)
    return x


# (label, spmd function, numpy reference, argument shapes)
CASES = [
    ("concatenate0", lambda x, y: lax.concatenate([x, y], 0),
     lambda x, y: np.concatenate([x, y], 0), [(2, 3), (4, 3)]),
    ("concatenate1", lambda x, y, z: lax.concatenate([x, y, z], 1),
     lambda x, y, z: np.concatenate([x, y, z], 1), [(2, 1), (2, 3), (2, 2)]),
    ("pad", lambda x, v: lax.pad(x, v, ((1, 2, 0), (0, 1, 1))),
     lambda x, v: np_pad(x, v, ((1, 2, 0), (0, 1, 1))), [(2, 3), ()]),
    ("pad_negative", lambda x, v: lax.pad(x, v, ((-1, 2, 1), (1, -2, 0))),
     lambda x, v: np_pad(x, v, ((-1, 2, 1), (1, -2, 0))), [(3, 4), ()]),
    ("slice", lambda x: lax.slice(x, (1, 0), (3, 4)), lambda x: x[1:3, 0:4], [(4, 5)]),
    ("slice_strided", lambda x: lax.slice(x, (0, 1, 0), (3, 5, 2), (2, 3, 1)),
     lambda x: x[0:3:2, 1:5:3, 0:2], [(3, 6, 2)]),
    ("slice_empty", lambda x: lax.slice(x, (2, 0), (2, 3)), lambda x: x[2:2, 0:3], [(4, 3)]),
    ("rev", lambda x: lax.rev(x, (0, 2)), lambda x: x[::-1, :, ::-1], [(2, 3, 4)]),
    ("broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (2, 3, 4), (0, 2)),
     lambda x: np.broadcast_to(x[:, None, :], (2, 3, 4)), [(2, 4)]),
    ("broadcast_in_dim_ones", lambda x: lax.broadcast_in_dim(x, (3, 4), (0, 1)),
     lambda x: np.broadcast_to(x, (3, 4)), [(1, 4)]),
    ("reshape", lambda x: lax.reshape(x, (4, 3)), lambda x: x.reshape(4, 3), [(2, 6)]),
    ("squeeze", lambda x: lax.squeeze(x, (0, 2)), lambda x: x.reshape(3, 2), [(1, 3, 1, 2)]),
    ("transpose", lambda x: lax.transpose(x, (2, 0, 1)), lambda x: x.transpose(2, 0, 1),
     [(2, 3, 4)]),
]
IDS = [c[0] for c in CASES]


def _args(shapes, dtype=np.float32):
    return [rand(*s, dtype=dtype) if s else np.asarray(rng.standard_normal(), dtype)
            for s in shapes]


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("label,f,ref,shapes", CASES, ids=IDS)
def test_values(mode, label, f, ref, shapes):
    args = _args(shapes)
    fn = f if mode == "eager" else spmd.jit(f)
    out = fn(*[snp.asarray(a) for a in args] if mode == "eager" else args)
    assert isinstance(out, spmd.Array)
    np.testing.assert_array_equal(np.asarray(out), ref(*args))


@pytest.mark.parametrize("label,f,ref,shapes", CASES, ids=IDS)
def test_values_int(label, f, ref, shapes):
    args = [(a * 10).astype(np.int32) for a in _args(shapes)]
    out = spmd.jit(f)(*args)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out), ref(*args))


@pytest.mark.parametrize("label,f,ref,shapes", CASES, ids=IDS)
def test_check_grads(label, f, ref, shapes):
    # A nonlinearity after the primitive makes the second-order check meaningful.
    check_grads(lambda *a: snp.sin(f(*a)), _args(shapes), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("label,f,ref,shapes", CASES, ids=IDS)
def test_grad_under_jit(label, f, ref, shapes):
    args = _args(shapes)
    g = spmd.jit(spmd.grad(lambda *a: snp.sum(snp.sin(f(*a))), argnums=tuple(range(len(args)))))
    eager = spmd.grad(lambda *a: snp.sum(snp.sin(f(*a))), argnums=tuple(range(len(args))))
    for a, b in zip(g(*args), eager(*args)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def _vmap_check(f, args, in_axes):
    """vmap(f) against a Python loop over the mapped argument's axis."""
    n = next(a.shape[d] for a, d in zip(args, in_axes) if d is not None)
    out = spmd.vmap(f, in_axes=in_axes)(*args)
    loop = [np.asarray(f(*[a if d is None else np.take(a, i, axis=d)
                           for a, d in zip(args, in_axes)])) for i in range(n)]
    np.testing.assert_allclose(np.asarray(out), np.stack(loop), rtol=1e-6, atol=1e-6)
    jitted = spmd.jit(spmd.vmap(f, in_axes=in_axes))(*args)
    np.testing.assert_allclose(np.asarray(jitted), np.stack(loop), rtol=1e-6, atol=1e-6)


def _batched(shapes, in_axes, size=5):
    out = []
    for s, d in zip(shapes, in_axes):
        if d is None:
            out.append(rand(*s) if s else np.asarray(rng.standard_normal(), np.float32))
        else:
            out.append(rand(*(s[:d] + (size,) + s[d:])))
    return out


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("label,f,ref,shapes", CASES, ids=IDS)
def test_vmap_all_batched(label, f, ref, shapes, axis):
    in_axes = tuple(axis if len(s) >= axis else 0 for s in shapes)
    _vmap_check(f, _batched(shapes, in_axes), in_axes)


MIXED = [
    ("concatenate", CASES[1][1], [(2, 1), (2, 3), (2, 2)], [(0, None, 1), (None, 1, None)]),
    ("pad", CASES[2][1], [(2, 3), ()], [(0, None), (None, 0), (1, 0)]),
    ("pad_negative", CASES[3][1], [(3, 4), ()], [(1, None), (None, 0)]),
]


@pytest.mark.parametrize("label,f,shapes,axes_list", MIXED, ids=[m[0] for m in MIXED])
def test_vmap_mixed_batched_and_unbatched(label, f, shapes, axes_list):
    for in_axes in axes_list:
        _vmap_check(f, _batched(shapes, in_axes), in_axes)


def test_vmap_of_grad_of_pad_and_slice():
    def loss(x, v):
        y = lax.pad(x, v, ((1, 1, 1),))
        return snp.sum(snp.sin(lax.slice(y, (1,), (6,), (2,))) * y[:3])

    xs, vs = rand(4, 3), rand(4)
    g = spmd.vmap(spmd.grad(loss, argnums=(0, 1)))(xs, vs)
    for i in range(4):
        gi = spmd.grad(loss, argnums=(0, 1))(xs[i], vs[i])
        np.testing.assert_allclose(np.asarray(g[0][i]), np.asarray(gi[0]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(g[1][i]), np.asarray(gi[1]), rtol=1e-6)


def test_transpose_rules_are_the_expected_primitives():
    x = rand(4, 6)
    names = lambda f: {e.primitive.name for e in spmd.make_jaxpr(
        spmd.grad(lambda a: snp.sum(snp.sin(f(a)))))(x).eqns}
    assert "pad" in names(lambda a: lax.slice(a, (1, 2), (3, 6)))
    assert "slice" in names(lambda a: lax.pad(a, np.float32(0), ((1, 1, 1), (0, 0, 0))))
    assert "slice" in names(lambda a: lax.concatenate([a, a * 2], 1))


def test_program_prints_params():
    text = str(spmd.make_jaxpr(lambda a: lax.slice(lax.rev(a, (0,)), (1, 0), (3, 6), (1, 2)))(
        rand(4, 6)))
    assert "rev[dimensions=(0,)]" in text and "strides=(1, 2)" in text


# ------------------------------------------------------------------- errors

def test_primitive_errors():
    f32, i32 = rand(2, 3), np.ones((2, 3), np.int32)
    with pytest.raises(errors.DTypeError, match="dtypes"):
        lax.concatenate([f32, i32], 0)
    with pytest.raises(errors.ShapeError, match=r"\(2, 3\).*\(3, 3\)|except in dimension 1"):
        lax.concatenate([f32, rand(3, 3)], 1)
    with pytest.raises(errors.ShapeError, match="sliced from 1 to 5"):
        lax.slice(f32, (1, 0), (5, 3))
    with pytest.raises(errors.ArgumentError, match="strides"):
        lax.slice(f32, (0, 0), (2, 3), (0, 1))
    with pytest.raises(errors.ShapeError, match="removes more"):
        lax.pad(f32, np.float32(0), ((-3, 0, 0), (0, 0, 0)))
    with pytest.raises(errors.ShapeError, match="scalar"):
        lax.pad(f32, np.zeros(2, np.float32), ((1, 0, 0), (0, 0, 0)))
    with pytest.raises(errors.ArgumentError, match="dimensions"):
        lax.rev(f32, (2,))


# ------------------------------------------------------------- front end

FRONT = [
    ("concatenate_none", lambda m, x, y: m.concatenate([x, y], axis=None), [(2, 3), (4,)]),
    ("hstack", lambda m, x, y: m.hstack([x, y]), [(2, 3), (2, 1)]),
    ("hstack_1d", lambda m, x, y: m.hstack([x, y]), [(3,), (2,)]),
    ("vstack", lambda m, x, y: m.vstack([x, y]), [(3,), (2, 3)]),
    ("dstack", lambda m, x, y: m.dstack([x, y]), [(2, 3), (2, 3)]),
    ("column_stack", lambda m, x, y: m.column_stack([x, y]), [(3,), (3, 2)]),
    ("split_clamped", lambda m, x: m.split(x, [2, 9], axis=0), [(5, 2)]),
    ("split_unsorted", lambda m, x: m.split(x, [3, 1]), [(5,)]),
    ("split_negative", lambda m, x: m.split(x, [-2]), [(5,)]),
    ("array_split", lambda m, x: m.array_split(x, 3, axis=1), [(2, 7)]),
    ("array_split_more", lambda m, x: m.array_split(x, 4), [(3,)]),
    ("hsplit", lambda m, x: m.hsplit(x, 2), [(2, 4)]),
    ("vsplit", lambda m, x: m.vsplit(x, [1]), [(3, 4)]),
    ("flip_all", lambda m, x: m.flip(x), [(2, 3)]),
    ("flip_axis", lambda m, x: m.flip(x, -1), [(2, 3)]),
    ("flip_tuple", lambda m, x: m.flip(x, (0, 2)), [(2, 3, 2)]),
    ("fliplr", lambda m, x: m.fliplr(x), [(2, 3)]),
    ("flipud", lambda m, x: m.flipud(x), [(2, 3)]),
    ("tile_int", lambda m, x: m.tile(x, 3), [(2, 3)]),
    ("tile_tuple", lambda m, x: m.tile(x, (2, 1, 2)), [(2, 3)]),
    ("tile_short_reps", lambda m, x: m.tile(x, (2,)), [(2, 3, 1)]),
    ("repeat_flat", lambda m, x: m.repeat(x, 2), [(2, 3)]),
    ("repeat_axis", lambda m, x: m.repeat(x, 3, axis=1), [(2, 3)]),
    ("repeat_seq", lambda m, x: m.repeat(x, [1, 0, 2], axis=1), [(2, 3)]),
    ("roll", lambda m, x: m.roll(x, 2), [(2, 3)]),
    ("roll_axis", lambda m, x: m.roll(x, -1, axis=1), [(2, 3)]),
    ("roll_axes", lambda m, x: m.roll(x, (1, 2), axis=(0, 1)), [(2, 3)]),
    ("pad_int", lambda m, x: m.pad(x, 1), [(2, 3)]),
    ("pad_pairs", lambda m, x: m.pad(x, ((1, 0), (2, 3)), constant_values=4.0), [(2, 3)]),
    ("pad_pair", lambda m, x: m.pad(x, (0, 2)), [(2, 3)]),
    ("atleast_1d", lambda m, x: m.atleast_1d(x), [()]),
    ("atleast_2d", lambda m, x: m.atleast_2d(x), [(3,)]),
    ("atleast_3d", lambda m, x: m.atleast_3d(x), [(2, 3)]),
    ("moveaxis_multi", lambda m, x: m.moveaxis(x, (0, 2), (2, 0)), [(2, 3, 4)]),
    ("swapaxes", lambda m, x: m.swapaxes(x, 0, -1), [(2, 3, 4)]),
    ("einsum_trace", lambda m, x: m.einsum("ii->", x), [(3, 3)]),
    ("einsum_diag", lambda m, x: m.einsum("ii->i", x), [(3, 3)]),
    ("einsum_diag_mixed", lambda m, x, y: m.einsum("iij,j->i", x, y), [(3, 3, 2), (2,)]),
    ("einsum_ellipsis_broadcast", lambda m, x, y: m.einsum("...ij,...jk", x, y),
     [(2, 1, 2, 3), (4, 3, 2)]),
    ("einsum_ellipsis_implicit", lambda m, x: m.einsum("i...->...", x), [(2, 3, 4)]),
    ("einsum_batch_outer", lambda m, x, y: m.einsum("bi,bj->bij", x, y), [(2, 3), (2, 4)]),
    ("einsum_sum_early", lambda m, x, y: m.einsum("ijk,kl->l", x, y), [(2, 3, 4), (4, 5)]),
    ("einsum_four", lambda m, a, b, c, d: m.einsum("ab,bc,cd,de->ae", a, b, c, d),
     [(2, 3), (3, 4), (4, 5), (5, 2)]),
    ("inner", lambda m, x, y: m.inner(x, y), [(2, 3), (4, 3)]),
    ("inner_scalar", lambda m, x, y: m.inner(x, y), [(), (4, 3)]),
    ("vdot", lambda m, x, y: m.vdot(x, y), [(2, 3), (3, 2)]),
    ("dot_nd", lambda m, x, y: m.dot(x, y), [(2, 3, 4), (3, 4, 5)]),
    ("tensordot_neg", lambda m, x, y: m.tensordot(x, y, axes=(-1, 0)), [(2, 3), (3, 4)]),
]


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("label,f,shapes", FRONT, ids=[c[0] for c in FRONT])
def test_front_end(mode, label, f, shapes):
    args = _args(shapes)
    fn = (lambda *a: f(snp, *a)) if mode == "eager" else spmd.jit(lambda *a: f(snp, *a))
    out = fn(*args)
    ref = f(np, *[a.astype(np.float64) for a in args])
    outs, refs = (out, ref) if isinstance(ref, list) else ([out], [ref])
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert isinstance(o, spmd.Array) and o.dtype == np.float32
        assert o.shape == r.shape, (o.shape, r.shape)
        np.testing.assert_allclose(np.asarray(o), r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("label,f,shapes", [c for c in FRONT if "split" not in c[0]],
                         ids=[c[0] for c in FRONT if "split" not in c[0]])
def test_front_end_grads(label, f, shapes):
    check_grads(lambda *a: snp.sin(f(snp, *a)), _args(shapes), order=1, modes=("fwd", "rev"))


def test_split_grads():
    check_grads(lambda x: [snp.sin(p) for p in snp.split(x, [1, 3], axis=1)], [rand(2, 5)],
                order=2, modes=("fwd", "rev"))


CREATION = [
    ("identity", lambda m: m.identity(3)),
    ("identity_int", lambda m: m.identity(2, dtype=np.int32)),
    ("tri", lambda m: m.tri(3)),
    ("tri_rect_k", lambda m: m.tri(3, 5, k=1)),
    ("tri_neg_k", lambda m: m.tri(4, 2, k=-1, dtype=np.int32)),
    ("eye_zero", lambda m: m.eye(0)),
    ("empty", lambda m: (m.zeros if m is np else m.empty)((2, 3))),  # spmd's empty is zeros
    ("linspace_retstep", lambda m: m.linspace(0, 2, 5, retstep=True)[0]),
    ("linspace_int", lambda m: m.linspace(0, 10, 4, dtype=np.int32)),
    ("linspace_zero", lambda m: m.linspace(0, 1, 0)),
    ("arange_float_bounds", lambda m: m.arange(0.5, 3.0, 0.5)),
    ("arange_neg_float", lambda m: m.arange(3, -1.5, -0.75)),
    ("arange_start_stop", lambda m: m.arange(3, 7)),
    ("full_like_shape", lambda m: m.full_like(np.ones(3, np.float32), 2.0, shape=(2, 2))),
    ("empty_like", lambda m: (m.zeros_like if m is np else m.empty_like)(
        np.ones((2, 1), np.int32))),
]


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("label,make", CREATION, ids=[c[0] for c in CREATION])
def test_creation(mode, label, make):
    out = make(snp) if mode == "eager" else spmd.jit(lambda: make(snp))()
    ref = make(np)
    want = ref.dtype if ref.dtype.kind in "iub" else np.dtype(np.float32)
    assert out.dtype == (np.int32 if want.kind == "i" else want) and out.shape == ref.shape
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-6)


def test_linspace_traced_bounds():
    f = spmd.jit(lambda a, b: snp.linspace(a, b, 7, axis=-1))
    a, b = rand(3), rand(3)
    np.testing.assert_allclose(np.asarray(f(a, b)), np.linspace(a, b, 7, axis=-1), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_array_equal(np.asarray(f(a, b))[:, -1], b)  # the endpoint is exact
    check_grads(lambda a, b: snp.linspace(a, b, 4, endpoint=False), [a, b], order=1)


def test_like_functions_keep_weak_type():
    assert spmd.jit(lambda x: snp.zeros_like(x)).lower(1.0).program is not None
    assert snp.zeros_like(2.0).weak_type
    assert not snp.zeros_like(2.0, dtype=np.float32).weak_type


def test_front_end_errors():
    x = rand(2, 3)
    with pytest.raises(errors.ShapeError, match=r"axis 1 .*size 3"):
        snp.squeeze(x, 1)
    with pytest.raises(errors.ShapeError, match=r"\(2, 3\).*\(3, 3\)"):
        snp.broadcast_to(x, (3, 3))
    with pytest.raises(errors.ShapeError, match=r"\(2, 3\).*\(3, 4\)"):
        snp.concatenate([x, rand(3, 4)])
    with pytest.raises(errors.ShapeError, match="zero-dimensional"):
        snp.concatenate([np.float32(1), np.float32(2)])
    with pytest.raises(errors.ShapeError, match="equal division"):
        snp.split(x, 2, axis=1)
    with pytest.raises(errors.ArgumentError):
        snp.moveaxis(x, (0, 1), 0)
    with pytest.raises(errors.ArgumentError, match="axis"):
        snp.flip(x, 2)
    with pytest.raises(errors.ShapeError, match="einsum"):
        snp.einsum("ij,jk", x, rand(4, 2))
    with pytest.raises(errors.ArgumentError, match="operands"):
        snp.einsum("ij,jk", x)
    with pytest.raises(errors.ShapeError, match="tensordot"):
        snp.tensordot(x, x, axes=1)
    with pytest.raises(NotImplementedError, match="mode"):
        snp.pad(x, 1, mode="reflect")


@pytest.mark.parametrize("shape,dims,in_shape", [
    ((1, 3, 1, 4), (1, 3), (3, 4)),    # unit axes inserted only: a view
    ((1, 16, 5), (1, 2), (16, 5)),     # a replicated value's device axis in shard_map
    ((2, 3, 4), (1, 2), (3, 4)),       # a real broadcast
    ((3, 2, 4), (0, 2), (3, 1)),       # a size-1 operand axis broadcast
    ((3, 4), (0, 1), (3, 4)),          # the identity
])
def test_broadcast_in_dim_code_inserts_unit_axes_as_a_view(shape, dims, in_shape):
    """Generated code for ``broadcast_in_dim``: where it only inserts unit axes, an
    index with ``None`` there (a view, without ``broadcast_to``'s cost); else
    ``broadcast_to``.  Values against numpy either way."""
    x = rand(*in_shape)
    f = spmd.jit(lambda x: lax.broadcast_in_dim(x, shape, dims))
    out, src = f(x), f.lower(x).compile().source
    expanded = [1] * len(shape)
    for d, n in zip(dims, in_shape):
        expanded[d] = n
    np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(x.reshape(expanded), shape))
    only_units = all(shape[d] == 1 for d in range(len(shape)) if d not in dims) and \
        tuple(in_shape) == tuple(shape[d] for d in dims)  # (the identity: no code)
    assert ("broadcast_to" not in src) is only_units, src
