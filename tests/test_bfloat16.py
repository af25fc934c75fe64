"""bfloat16 and the 8-bit floats (float8_e4m3fn, float8_e5m2), as JAX has them.

Every reference is computed with numpy in float32 and rounded through ml_dtypes'
casts (round to nearest, ties to even): an elementwise op rounds its own result
(``(a * 3) + 1`` rounds after ``*`` and after ``+``), a reduction or a product
accumulates in float32 and rounds once.  Where JAX is installed, its eager results
(which round per op too) are compared as well.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.errors import DTypeError

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
NARROW = [BF16, E4M3, E5M2]
IDS = ["bf16", "e4m3fn", "e5m2"]
F32 = np.float32


def rnd(x, dtype):
    """``x`` (float32 values) rounded to ``dtype``, ties to even."""
    return np.asarray(x, F32).astype(dtype)


def f32(x):
    return np.asarray(x).astype(F32)


def values(dtype, n=64, seed=0, scale=4.0):
    """Values of ``dtype`` (exactly representable), both signs, finite after the ops
    below in every narrow type (e4m3fn's largest is 448, e5m2's 57344)."""
    rng = np.random.default_rng(seed)
    return rnd(rng.uniform(-scale, scale, n), dtype)


def same(got, want):
    """Bit-equal results, the dtype included (elementwise ops and exact sums only)."""
    got, want = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


# ------------------------------------------------------------ arrays in and out

@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_jit_and_eager_take_and_return_narrow_arrays(dtype):
    x = values(dtype)
    want = rnd(f32(rnd(f32(x) * 3, dtype)) + 1, dtype)  # rounded after * and after +
    same(spmd.jit(lambda a: a * 3 + 1)(x), want)
    same(snp.asarray(x) * 3 + 1, want)
    assert spmd.jit(lambda a: a)(x).dtype == dtype


def test_each_op_rounds_its_own_result():
    # Values where rounding once at the end differs from rounding after each op:
    # the test would not tell the two apart otherwise.
    x = values(BF16, n=256, seed=3)
    per_op = rnd(f32(rnd(f32(x) * 3, BF16)) + 1, BF16)
    once = rnd(f32(x) * 3 + 1, BF16)
    assert (f32(per_op) != f32(once)).any()
    same(spmd.jit(lambda a: a * 3 + 1)(x), per_op)


def test_scalar_types_are_dtypes_and_constructors():
    assert np.dtype(snp.bfloat16) == BF16
    assert np.dtype(snp.float8_e4m3fn) == E4M3 and np.dtype(snp.float8_e5m2) == E5M2
    assert snp.zeros(3, snp.bfloat16).dtype == BF16
    assert snp.bfloat16([1.0, 2.5]).dtype == BF16
    assert spmd.jit(lambda a: snp.float8_e5m2(a))(np.ones(2, F32)).dtype == E5M2
    assert snp.finfo(snp.bfloat16).eps == 2.0 ** -7
    assert float(snp.finfo(snp.float8_e4m3fn).max) == 448.0


def test_an_unsupported_ml_dtype_is_refused_by_name_with_the_fix():
    x = np.ones(2, ml_dtypes.float8_e4m3fnuz)
    with pytest.raises(DTypeError, match=r"float8_e4m3fnuz.*astype\(np.float32\)"):
        spmd.jit(lambda a: a + 1)(x)


# ------------------------------------------------------------------- promotion

@pytest.mark.parametrize("a,b,want", [
    (BF16, np.float16, np.float32),
    (BF16, np.float32, np.float32),
    (BF16, np.int32, BF16),
    (BF16, np.uint8, BF16),
    (BF16, np.bool_, BF16),
    (E4M3, np.int32, E4M3),
    (E5M2, np.bool_, E5M2),
    (E4M3, E4M3, E4M3),
])
def test_promotion_follows_jax_lattice(a, b, want):
    assert snp.promote_types(a, b) == np.dtype(want)
    x, y = np.ones(2, a), np.ones(2, b)
    assert spmd.jit(lambda u, v: u + v)(x, y).dtype == np.dtype(want)


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_python_scalars_are_weak(dtype):
    x = np.ones(2, dtype)
    for scalar in (1.5, 2, True):
        out = spmd.jit(lambda a: a * scalar)(x)
        assert out.dtype == dtype
        assert not spmd.typeof(snp.asarray(x) * scalar).weak_type


@pytest.mark.parametrize("a,b", [(E4M3, E5M2), (E4M3, BF16), (E5M2, np.float32),
                                 (E4M3, np.float16), (E5M2, np.complex64)])
def test_float8_does_not_promote_with_other_floats(a, b):
    with pytest.raises(DTypeError, match=r"no implicit promotion.*astype"):
        snp.promote_types(a, b)
    with pytest.raises(DTypeError, match=str(np.dtype(a))):
        spmd.jit(lambda u, v: u + v)(np.ones(2, a), np.ones(2, b))


def test_float8_with_a_complex_scalar_is_refused():
    with pytest.raises(DTypeError, match="complex scalar"):
        snp.asarray(np.ones(2, E4M3)) * 1j


# ------------------------------------------------------------------- astype

@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_astype_rounds_to_nearest_even_both_ways(dtype):
    rng = np.random.default_rng(1)
    x = rng.uniform(-8, 8, 256).astype(F32)
    if dtype == BF16:  # ties: 1 + 2**-8 is halfway between 1 and 1 + 2**-7
        x[:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0]
    want = x.astype(dtype)
    same(spmd.jit(lambda a: a.astype(dtype))(x), want)
    same(snp.asarray(x).astype(dtype), want)
    same(spmd.jit(lambda a: a.astype(F32))(want), want.astype(F32))
    if dtype == BF16:
        np.testing.assert_array_equal(f32(want[:4]), [1.0, 1 + 2 ** -6, -1.0, 3.0])


# ---------------------------------------------------------------- elementwise

def _pos(x):
    return rnd(np.abs(f32(x)) + 0.5, BF16)


def _unit(x):
    return rnd(f32(x) / 5, BF16)


# name: (spmd's op, the float32 reference, the operands' domain)
UNARY = {
    "exp": (snp.exp, np.exp, None), "tanh": (snp.tanh, np.tanh, None),
    "sin": (snp.sin, np.sin, None), "sqrt": (snp.sqrt, np.sqrt, _pos),
    "rsqrt": (lax.rsqrt, lambda a: 1 / np.sqrt(a), _pos),
    "logistic": (lax.logistic, lambda a: 1 / (1 + np.exp(-a)), None),
    "erf_inv": (lax.erf_inv, lambda a: __import__("scipy.special").special.erfinv(a), _unit),
    "pow_neg": (lambda a: a ** -3, lambda a: 1 / (a * a * a), _pos),
    "div": (lambda a: a / 3, lambda a: a / F32(3), None),
    "neg_abs": (lambda a: -snp.abs(a), lambda a: -np.abs(a), None),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_elementwise_ops_compute_in_float32_and_round_once(name):
    ours, ref, domain = UNARY[name]
    x = values(BF16, n=512, seed=5, scale=3.0)
    x = domain(x) if domain else x
    want = rnd(ref(f32(x)), BF16)
    got = spmd.jit(ours)(x)
    assert got.dtype == BF16
    got = f32(got)
    # Transcendental float32 functions may differ by a float32 ulp between libms,
    # which moves a bfloat16 rounding by one bfloat16 ulp at most; rounding after
    # each of several numpy calls would be further off, and more often.
    ulp = np.maximum(f32(rnd(np.abs(f32(want)) * 2 ** -7, BF16)), 2 ** -133)
    assert np.all(np.abs(got - f32(want)) <= ulp), name
    assert np.mean(got == f32(want)) > 0.95, name


# ---------------------------------------------------------------- reductions

def test_sum_accumulates_in_float32_and_rounds_once():
    x = np.ones(1000, BF16)  # bfloat16 accumulation would stop at 256
    same(spmd.jit(lambda a: a.sum())(x), rnd(1000.0, BF16))
    same(snp.sum(x), rnd(1000.0, BF16))
    y = values(BF16, n=(4096), seed=7).reshape(64, 64)
    for axis in (None, 0, 1):
        want = rnd(f32(y).sum(axis=axis, dtype=np.float64), BF16)
        got = spmd.jit(lambda a: snp.sum(a, axis=axis))(y)
        assert got.dtype == BF16
        # float32 accumulation in another order may differ in float32's last bits,
        # a bfloat16 ulp at most after the one rounding.
        np.testing.assert_allclose(f32(got), f32(want), rtol=2 ** -7, atol=2 ** -7)


def test_mean_and_cumsum_accumulate_in_float32():
    x = np.ones(1000, BF16)
    same(spmd.jit(snp.mean)(x), rnd(1.0, BF16))
    same(spmd.jit(lambda a: snp.mean(a * 3))(x), rnd(3.0, BF16))
    same(spmd.jit(snp.cumsum)(x), rnd(np.arange(1, 1001), BF16))
    same(snp.cumsum(x), rnd(np.arange(1, 1001), BF16))
    same(snp.mean(x), rnd(1.0, BF16))


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_max_min_argmax_are_exact(dtype):
    x = values(dtype, n=100, seed=9)
    same(spmd.jit(snp.max)(x), np.max(x))
    same(spmd.jit(snp.min)(x), np.min(x))
    assert int(spmd.jit(snp.argmax)(x)) == int(np.argmax(f32(x)))


# ------------------------------------------------------------------- products

def test_products_compute_in_float32_and_round_once():
    a = values(BF16, n=64 * 48, seed=11).reshape(64, 48)
    b = values(BF16, n=48 * 32, seed=12).reshape(48, 32)
    want = rnd(f32(a).astype(np.float64) @ f32(b), BF16)
    for f in (lambda u, v: u @ v, snp.dot, lambda u, v: snp.einsum("ij,jk->ik", u, v),
              lambda u, v: snp.matmul(u[None], v[None])[0]):
        got = spmd.jit(f)(a, b)
        assert got.dtype == BF16
        np.testing.assert_allclose(f32(got), f32(want), rtol=2 ** -7, atol=2 ** -7)
    ones = np.ones((1, 1000), BF16)
    same(spmd.jit(lambda u: u @ u.T)(ones), rnd([[1000.0]], BF16))


def test_preferred_element_type_float32_is_the_unrounded_product():
    a = values(BF16, n=64, seed=13).reshape(8, 8)
    b = values(BF16, n=64, seed=14).reshape(8, 8)
    got = spmd.jit(lambda u, v: snp.einsum("ij,jk->ik", u, v,
                                           preferred_element_type=F32))(a, b)
    assert got.dtype == np.float32
    # Products of bfloat16 values are exact in float32; sums of 8 such terms are
    # within float32 rounding of the float64 sum.
    np.testing.assert_allclose(got, f32(a).astype(np.float64) @ f32(b), rtol=1e-6)
    assert not np.array_equal(got, f32(rnd(got, BF16)))  # really not rounded


# --------------------------------------------------------------------- JAX

def test_matches_jax_eager():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    x = values(BF16, n=256, seed=21)
    ours = spmd.jit(lambda a: snp.tanh(a * 3 + 1) / 2)(x)
    theirs = jnp.tanh(jnp.asarray(x) * 3 + 1) / 2  # eager: rounds per op, as spmd
    np.testing.assert_allclose(f32(ours), f32(np.asarray(theirs)), rtol=2 ** -7, atol=0)
    assert jnp.promote_types(jnp.bfloat16, jnp.float16) == snp.promote_types(BF16, np.float16)
    ours_sum = spmd.jit(snp.sum)(np.ones(1000, BF16))
    assert f32(ours_sum) == f32(np.asarray(jax.jit(jnp.sum)(jnp.ones(1000, jnp.bfloat16))))


# ------------------------------------------------- collectives, simulated devices

def _blocks(dtype, seed=31):
    """8 devices' blocks of (2, 3), with values whose float32 sum rounds differently
    from a bfloat16 running sum (checked in the psum test)."""
    return values(dtype, n=8 * 2 * 3, seed=seed, scale=3.0).reshape(16, 3)


def _shmap(fn, out_specs, mesh=None):
    mesh = mesh or spmd.make_mesh((8,), ("i",))
    return spmd.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=out_specs)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_psum_sums_in_float32_and_rounds_once(jit):
    x = _blocks(BF16)
    parts = f32(x).reshape(8, 2, 3)
    want = rnd(parts.astype(np.float64).sum(0), BF16)
    running = parts[0].astype(BF16)
    for p in parts[1:]:  # what adding in bfloat16 device by device would give
        running = rnd(f32(running) + p, BF16)
    assert (f32(running) != f32(want)).any()
    f = _shmap(lambda b: lax.psum(b, "i"), P())
    got = (spmd.jit(f) if jit else f)(x)
    same(got, want)


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_data_movement_collectives_keep_the_bits(dtype):
    x = _blocks(dtype)
    gathered = _shmap(lambda b: lax.all_gather(b, "i", tiled=True, to="invarying"), P())(x)
    same(gathered, x)
    perm = [(i, (i + 1) % 8) for i in range(8)]
    shifted = spmd.jit(_shmap(lambda b: lax.ppermute(b, "i", perm), P("i")))(x)
    same(shifted, np.roll(x.reshape(8, 2, 3), 1, axis=0).reshape(16, 3))
    x8 = values(dtype, n=8 * 8, seed=3).reshape(64, 1)
    want = x8.reshape(8, 8, 1).transpose(1, 0, 2).reshape(64, 1)
    same(spmd.shard_map(lambda b: lax.all_to_all(b, "i", 0, 0, tiled=True),
                        mesh=spmd.make_mesh((8,), ("i",)), in_specs=P("i"),
                        out_specs=P("i"))(x8), want)


def test_pmean_is_the_rounded_sum_divided_and_rounded():
    x = _blocks(BF16)
    s = rnd(f32(x).reshape(8, 2, 3).astype(np.float64).sum(0), BF16)
    same(_shmap(lambda b: lax.pmean(b, "i"), P())(x), rnd(f32(s) / 8, BF16))


# ------------------------------------------------------------------ autodiff

def test_grad_through_bfloat16_gives_bfloat16_cotangents():
    x = values(BF16, n=16, seed=41)

    def loss(a):
        return snp.sum(snp.tanh(a) * a)

    g = spmd.jit(spmd.grad(loss))(x)
    assert g.dtype == BF16
    # d/da tanh(a) a = tanh(a) + a (1 - tanh(a)^2): each op rounds to bfloat16 (a few
    # ulps of 2**-8 in all).
    t = np.tanh(f32(x))
    np.testing.assert_allclose(f32(g), t + f32(x) * (1 - t * t), rtol=2 ** -5, atol=2 ** -5)


def test_grad_of_a_float32_loss_of_bfloat16_weights():
    w = values(BF16, n=8 * 4, seed=43).reshape(8, 4)
    x = values(BF16, n=4 * 8, seed=44).reshape(4, 8)

    def loss(w):
        y = (x @ w).astype(F32)
        return snp.mean(y * y)

    g = spmd.grad(loss)(w)
    assert g.dtype == BF16
    y = f32(rnd(f32(x) @ f32(w), BF16))
    want = f32(x).T @ (2 * y / y.size)
    np.testing.assert_allclose(f32(g), want, rtol=2 ** -6, atol=2 ** -8)


# ------------------------------------------------------------- random numbers

def test_random_samplers_draw_bfloat16():
    from spmd import random as sr

    key = sr.key(0)
    u = sr.uniform(key, (20000,), snp.bfloat16)
    assert u.dtype == BF16
    u = f32(u)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    assert np.all(u * 2 ** 8 == np.round(u * 2 ** 8))  # bfloat16's 8 significant bits
    n = sr.normal(key, (20000,), snp.bfloat16)
    assert n.dtype == BF16
    assert abs(f32(n).mean()) < 0.03 and abs(f32(n).std() - 1) < 0.03
    for name in ("exponential", "laplace", "logistic", "gumbel"):
        v = getattr(sr, name)(key, (1000,), snp.bfloat16)
        assert v.dtype == BF16 and np.all(np.isfinite(f32(v))), name
    e = sr.uniform(key, (1000,), snp.float8_e4m3fn)
    assert e.dtype == E4M3 and 0 <= f32(e).min() and f32(e).max() < 1


def test_float8_samplers_other_than_uniform_are_refused():
    from spmd import random as sr

    with pytest.raises(DTypeError, match=r"float8_e4m3fn.*astype"):
        sr.normal(sr.key(0), (4,), snp.float8_e4m3fn)


# ---------------------------------------------------------------- checkpoints

# tensorstore's zarr3 stores bfloat16, float8_e4m3fn and float8_e5m2 under those names.
def test_checkpoint_round_trip_keeps_bfloat16_bits(tmp_path):
    pytest.importorskip("tensorstore")
    from spmd import checkpointing as ckpt

    mesh = spmd.make_mesh((8,), ("d",))
    w = values(BF16, n=64, seed=51).reshape(8, 8)
    f8 = {k: rnd(np.linspace(-3, 3, 8, dtype=np.float32), t) for k, t in
          (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", E5M2))}
    tree = {"w": spmd.device_put(w, spmd.NamedSharding(mesh, P("d"))),
            "s": values(BF16, n=1, seed=52)[0], **f8}
    target = {"w": spmd.NamedSharding(mesh, P(None, "d")), "s": np.zeros((), BF16),
              **{k: np.zeros_like(v) for k, v in f8.items()}}
    ckpt.save(str(tmp_path), tree, step=1)
    out = ckpt.restore(str(tmp_path), target)
    same(out["w"], w)
    same(out["s"], tree["s"])
    for k, v in f8.items():
        same(out[k], v)


def test_scalings_of_float8_e5m2_are_not_folded():
    # float8_e5m2 is of numpy kind "f"; folding (x * 0.75) * 0.25 into x * 0.1875 would
    # change results where x * 0.75 * 0.25 is subnormal (below 2**-14).
    x = rnd(2.0 ** -np.linspace(8, 14, 200), E5M2)
    per_op = rnd(f32(rnd(f32(x) * F32(0.75), E5M2)) * F32(0.25), E5M2)
    assert (f32(per_op) != f32(rnd(f32(x) * F32(0.1875), E5M2))).any()
    same(spmd.jit(lambda a: (a * 0.75) * 0.25)(x), per_op)


def test_var_computes_in_float32_and_rounds_once():
    x = values(BF16, n=4096, seed=61).reshape(64, 64)
    for axis in (None, 1):
        want = rnd(f32(x).astype(np.float64).var(axis=axis), BF16)
        got = spmd.jit(lambda a: snp.var(a, axis=axis))(x)
        assert got.dtype == BF16
        np.testing.assert_allclose(f32(got), f32(want), rtol=2 ** -7, atol=0)
    # bfloat16 steps would lose the small spread around a large mean entirely.
    y = rnd(256 + np.arange(8) * 2.0, BF16)
    same(spmd.jit(snp.var)(y), rnd(np.var(f32(y)), BF16))


# ------------------------------------------------------------------- placing

def test_sharded_arrays_of_narrow_floats_are_made_and_read_back():
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    sharding = spmd.NamedSharding(mesh, P("a", "b"))
    for dtype in NARROW:
        x = values(dtype, n=64, seed=71).reshape(8, 8)
        made = spmd.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
        assert made.dtype == dtype
        same(made, x)
        same(spmd.device_put(x, sharding), x)
        same(spmd.make_array_from_process_local_data(sharding, x), x)
        same(spmd.jit(lambda a: a * 2, out_shardings=sharding)(made), rnd(f32(x) * 2, dtype))


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_narrow_floats_are_floating_for_issubdtype(dtype):
    # numpy puts ml_dtypes' types right under np.generic; JAX (and code that picks
    # the floating leaves of a tree) counts them as floating.
    for check in (snp.issubdtype, spmd.dtypes.issubdtype):
        assert check(dtype, snp.floating) and check(dtype, np.inexact)
        assert check(dtype, np.number) and check(dtype, dtype)
        assert not check(dtype, np.integer) and not check(dtype, np.complexfloating)
    assert spmd.dtypes.bfloat16 == BF16


def test_untyped_shard_map_gradient_of_a_replicated_output():
    # check_vma=False, out_specs=P(): the cotangent is divided among the copies, for
    # bfloat16 as for float32 (numpy does not count bfloat16 as inexact).
    mesh = spmd.make_mesh((8,), ("i",))
    f = spmd.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P(), out_specs=P(),
                       check_vma=False)
    for dtype in (F32, BF16):
        g = spmd.grad(lambda v: snp.sum(f(v).astype(F32)))(np.ones(4, dtype))
        assert g.dtype == dtype
        np.testing.assert_array_equal(f32(g), [2.0] * 4)


def test_grouped_pmax_of_bfloat16():
    mesh = spmd.make_mesh((8,), ("i",))
    g = spmd.shard_map(lambda x: lax.pmax(x, "i", axis_index_groups=[[0, 1, 2, 3],
                                                                      [4, 5, 6, 7]]),
                       mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    x = rnd(np.arange(8.0) - 2.5, BF16)
    same(g(x), rnd([0.5] * 4 + [4.5] * 4, BF16))


# ------------------------------------------------- jit and eager, op by op

def _ops():
    import spmd.nn as nn

    return {
        "is_finite": snp.isfinite, "abs": snp.abs, "floor": snp.floor, "sign": snp.sign,
        "round": snp.round, "log1p": lambda a: snp.log1p(snp.abs(a)), "expm1": snp.expm1,
        "erf": lax.erf, "lgamma": lambda a: lax.lgamma(snp.abs(a) + 0.5),
        "pow": lambda a: snp.abs(a) ** a, "rem": lambda a: a % 0.7,
        "atan2": lambda a: snp.arctan2(a, a + 1), "clip": lambda a: snp.clip(a, -1, 1),
        "where": lambda a: snp.where(a > 0, a, 0.0), "sort": snp.sort,
        "argsort": snp.argsort, "cumprod": snp.cumprod, "prod": snp.prod,
        "softmax": nn.softmax, "log_softmax": nn.log_softmax, "gelu": nn.gelu,
        "relu": nn.relu, "std": snp.std, "norm": snp.linalg.norm,
        "select_n": lambda a: lax.select_n((a > 0).astype(np.int32) + (a > 1), a, a * 2,
                                           a * 3),
        "take": lambda a: a[np.array([3, 0, 1])], "scatter": lambda a: a.at[0].add(1.0),
        "convolve": lambda a: snp.convolve(a, a[:3]),
        "attention": lambda a: nn.dot_product_attention(*(a.reshape(1, 4, 2, 8),) * 3),
    }


@pytest.mark.parametrize("name", sorted(_ops()))
def test_jit_and_eager_agree_on_bfloat16(name):
    f = _ops()[name]
    x = values(BF16, n=64, seed=81, scale=2.0)
    jitted, eager = spmd.jit(f)(x), f(snp.asarray(x))
    assert jitted.dtype == eager.dtype
    assert jitted.dtype in (BF16, np.dtype(bool), np.dtype(np.int32)), jitted.dtype
    np.testing.assert_array_equal(np.asarray(jitted).astype(F32),
                                  np.asarray(eager).astype(F32))


@pytest.mark.parametrize("dtype", NARROW, ids=IDS)
def test_complex_of_narrow_parts_is_refused_with_the_fix(dtype):
    x = np.ones(2, dtype)
    with pytest.raises(DTypeError, match=r"float32 or float64.*astype"):
        spmd.jit(lambda a: lax.complex(a, a))(x)
