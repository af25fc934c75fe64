"""Unreduced and reduced values in shard_map bodies (spmd.compiler.core.manual_types, the
collectives' rules, shard_map's boundary): values against numpy on global arrays,
gradients against numpy's, the collectives each transpose makes read from printed
programs, and each bad use an error naming the fix."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.core.manual_types import ManualTypeError, UnreducedRuleError
from spmd.shard.maps.args import ShardMapError, UnreducedSpecError
from spmd.shard.arrays.spec import ShardingError
from spmd.sharding import AxisType, NamedSharding, P

# Every program here is partitioned as a whole: a fallback (computed whole, with a
# warning) would hide a typing gap.
pytestmark = pytest.mark.filterwarnings("error:a jitted call on placed arrays")


@pytest.fixture
def mesh():
    m = spmd.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))
    with spmd.sharding.use_mesh(m):
        yield m


@pytest.fixture
def mesh2():
    m = spmd.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    with spmd.sharding.use_mesh(m):
        yield m


def put(a, spec):
    return spmd.device_put(np.asarray(a, np.float32), spec)


def text(f, *args) -> str:
    return str(spmd.make_jaxpr(f)(*args))


# ------------------------------------------------------------------ specs

def test_spec_reduced_is_part_of_spec_and_sharding(mesh):
    a, b = P(None, reduced={"x"}), P(None, unreduced={"x"})
    assert a != P() and b != P() and a != b and hash(a) != hash(P(None))
    assert repr(a) == "PartitionSpec(None, reduced={'x'})"
    assert pickle.loads(pickle.dumps(a)) == a
    # A cache keyed on shardings must tell them apart.
    assert len({NamedSharding(mesh, s) for s in (P(), a, b)}) == 3
    assert NamedSharding(mesh, P(reduced={"x"})) == NamedSharding(mesh, a)
    with pytest.raises(ShardingError, match="both"):
        P("x", reduced={"x"})
    with pytest.raises(ShardingError, match="both unreduced and reduced"):
        P(unreduced={"x"}, reduced={"x"})


def test_unreduced_array_holds_its_value_as_summands(mesh):
    v = np.arange(4.0, dtype=np.float32)
    arr = put(v, P(unreduced={"x"}))
    np.testing.assert_array_equal(np.asarray(arr), v)
    shards = [np.asarray(s.data) for s in arr.addressable_shards]
    np.testing.assert_array_equal(sum(shards), v)
    np.testing.assert_array_equal(shards[1], 0)
    assert not arr.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(spmd.sharding.reshard(arr, P())), v)


# ------------------------------------------------------------ forward values

def test_pcast_to_unreduced_sums_the_blocks(mesh):
    x = np.arange(8.0, dtype=np.float32)

    @spmd.jit
    @spmd.shard_map(out_specs=P(unreduced={"x"}))
    def f(b):
        out = lax.pcast(b, "x", to="unreduced")
        assert spmd.typeof(out).mat.unreduced == {"x"}
        assert spmd.typeof(out).mat.varying == frozenset()
        return out

    out = f(put(x, P("x")))
    assert out.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    np.testing.assert_array_equal(np.asarray(out), x[:4] + x[4:])
    g = spmd.jit(spmd.grad(lambda a: f(a).sum()))(put(x, P("x")))
    assert g.sharding == NamedSharding(mesh, P("x"))
    np.testing.assert_array_equal(np.asarray(g), np.ones(8))


def test_unreduced_input_reduce_scattered(mesh):
    x = np.arange(8.0, dtype=np.float32)

    @spmd.shard_map(out_specs=P("x"))
    def f(b):
        assert spmd.typeof(b).mat.unreduced == {"x"}
        out = lax.psum_scatter(b, "x", tiled=True)
        assert spmd.typeof(out).mat.varying == {"x"}
        return out

    arr = spmd.sharding.reshard(put(x, P()), P(unreduced={"x"}))
    np.testing.assert_array_equal(np.asarray(f(arr)), x)
    g = spmd.grad(lambda a: f(a).sum())(arr)
    assert g.sharding == NamedSharding(mesh, P(None, reduced={"x"}))
    np.testing.assert_array_equal(np.asarray(g), np.ones(8))


def test_fsdp_gather_reduced_and_reduce_scatter_gradient(mesh2):
    """FSDP: the weight gathered to='reduced'; its gradient arrives as summands and is
    reduce-scattered where the gather was, with no all-reduce anywhere."""
    x_np = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    w_np = np.arange(12.0, dtype=np.float32).reshape(2, 6)

    @spmd.shard_map(in_specs=P("y", None), out_specs=P(None, None, reduced={"y"}))
    def gather(a):
        out = lax.all_gather(a, "y", tiled=True, to="reduced")
        assert spmd.typeof(out).mat.reduced == {"y"}
        return out

    def loss(x, w):
        return snp.sin(snp.einsum("td,df->tf", x, gather(w))).sum()

    x, w = put(x_np, P("y", None)), put(w_np, P("y", None))
    gx, gw = spmd.jit(spmd.grad(loss, argnums=(0, 1)))(x, w)
    assert gw.sharding == NamedSharding(mesh2, P("y", None))
    ct = np.cos(x_np @ w_np)
    np.testing.assert_allclose(np.asarray(gw), x_np.T @ ct, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gx), ct @ w_np.T, rtol=1e-5)
    prog = text(spmd.grad(lambda w: loss(x, w)), w)
    assert "psum_scatter" in prog and "all_gather" in prog


def test_einsum_unreduced_out_sharding_then_psum(mesh):
    a_np = np.arange(8.0, dtype=np.float32).reshape(2, 4)
    b_np = np.arange(24.0, dtype=np.float32).reshape(4, 6)

    @spmd.shard_map(in_specs=P(unreduced={"x"}), out_specs=P())
    def reduce(z):
        out = lax.psum(z, "x")
        assert spmd.typeof(out).mat.unreduced == frozenset()
        return out

    @spmd.jit
    def f(a, b):
        return reduce(snp.einsum("ab,bc->ac", a, b, out_sharding=P(unreduced={"x"}))).sum()

    a, b = put(a_np, P(None, "x")), put(b_np, P("x", None))
    np.testing.assert_allclose(float(f(a, b)), (a_np @ b_np).sum())
    ga, gb = spmd.jit(spmd.grad(f, argnums=(0, 1)))(a, b)
    np.testing.assert_allclose(np.asarray(ga), np.ones((2, 6)) @ b_np.T)
    np.testing.assert_allclose(np.asarray(gb), a_np.T @ np.ones((2, 6)))


# ------------------------------------------------------- reduced inputs' cotangents

@pytest.mark.parametrize("op", [lax.mul, lax.add])
def test_reduced_input_cotangent_left_unreduced(mesh, op):
    x_np, y_np = np.arange(16.0, dtype=np.float32), np.arange(8.0, dtype=np.float32)

    @spmd.jit
    @spmd.shard_map(out_specs=P())
    def f(x, y):
        return lax.psum(op(x, y), "x")

    def g(x, y):
        return f(x, y).sum()

    x, y = put(x_np, P("x")), put(y_np, P(None, reduced={"x"}))
    np.testing.assert_array_equal(np.asarray(f(x, y)), op(x_np[:8], y_np) + op(x_np[8:], y_np))
    gx, gy = spmd.jit(spmd.grad(g, argnums=(0, 1)))(x, y)
    assert gy.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    ex, ey = spmd.jit(spmd.grad(g, argnums=(0, 1)))(x, put(y_np, P()))
    np.testing.assert_array_equal(np.asarray(gx), np.asarray(ex))
    np.testing.assert_array_equal(np.asarray(gy), np.asarray(ey))
    # The reduced input's cotangent is not all-reduced in the body.
    body = text(spmd.grad(g, argnums=1), x, y)
    assert "pcast" in body and "psum[" not in body.split("pcast")[-1]


def test_reduced_pvary_transposes_to_summands(mesh):
    v = np.arange(8.0, dtype=np.float32)

    @spmd.jit
    @spmd.shard_map(out_specs=P("x"))
    def f(x):
        return lax.pcast(x, "x", to="varying")

    arr = put(v, P(None, reduced={"x"}))
    np.testing.assert_array_equal(np.asarray(f(arr)), np.concatenate([v, v]))
    g = spmd.jit(spmd.grad(lambda a: f(a).sum()))(arr)
    assert g.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    np.testing.assert_array_equal(np.asarray(g), 2 * np.ones(8))


def test_check_vma_false_reduced_and_unreduced(mesh):
    v = np.arange(8.0, dtype=np.float32)

    @spmd.jit
    @spmd.shard_map(in_specs=P(unreduced={"x"}), out_specs=P("x"), check_vma=False)
    def f(x):
        return lax.psum_scatter(x, "x", tiled=True)

    arr = put(v, P(unreduced={"x"}))
    np.testing.assert_array_equal(np.asarray(f(arr)), v)
    g = spmd.jit(spmd.grad(lambda a: f(a).sum()))(arr)
    assert g.sharding == NamedSharding(mesh, P(None, reduced={"x"}))
    np.testing.assert_array_equal(np.asarray(g), np.ones(8))


def test_same_function_unreduced_and_replicated_inputs(mesh):
    """One jitted function called on a value placed replicated and the same value as
    summands: its plans are told apart (psum of a replicated block doubles it)."""
    v = np.arange(4.0, dtype=np.float32)
    f = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "x"), mesh=mesh, out_specs=P()))
    np.testing.assert_array_equal(np.asarray(f(put(v, P()))), 2 * v)
    np.testing.assert_array_equal(np.asarray(f(put(v, P(unreduced={"x"})))), v)
    np.testing.assert_array_equal(np.asarray(f(put(v, P()))), 2 * v)
    outs = {}

    def run(k, spec):  # (a thread has no mesh in context: a NamedSharding)
        outs[k] = np.asarray(f(put(v, NamedSharding(mesh, spec))))

    threads = [threading.Thread(target=run, args=(k, P() if k % 2 else P(unreduced={"x"})))
               for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outs) == 6
    for k, o in outs.items():
        np.testing.assert_array_equal(o, 2 * v if k % 2 else v)


def test_closure_inside_jit_keeps_reduced_types(mesh):
    v = np.arange(8.0, dtype=np.float32)

    @spmd.shard_map(out_specs=P(reduced={"x"}))
    def f(x):
        return spmd.jit(lambda a: snp.sin(a) * 2.0)(x)

    arr = put(v, P(reduced={"x"}))
    assert spmd.jit(f)(arr).sharding == NamedSharding(mesh, P(reduced={"x"}))
    g = spmd.jit(spmd.grad(lambda a: f(a).sum()))(arr)
    assert g.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    np.testing.assert_allclose(np.asarray(g), 2 * np.cos(v), rtol=1e-6)


# ------------------------------------------------------------------- errors

def test_nonlinear_op_on_unreduced_is_refused(mesh):
    f = spmd.shard_map(lambda b: snp.sin(lax.pcast(b, "x", to="unreduced")),
                       out_specs=P(unreduced={"x"}))
    with pytest.raises(UnreducedRuleError, match="unreduced rule for sin is not implemented"):
        f(put(np.arange(8.0), P("x")))
    assert issubclass(UnreducedRuleError, NotImplementedError)


def test_unreduced_plus_invariant_is_refused(mesh):
    f = spmd.shard_map(lambda b, c: lax.pcast(b, "x", to="unreduced") + c,
                       in_specs=(P("x"), P()), out_specs=P(unreduced={"x"}))
    with pytest.raises(ManualTypeError, match="same axes"):
        spmd.jit(f)(put(np.arange(8.0), P("x")), put(np.ones(4), P()))


def test_pcast_from_the_wrong_type(mesh):
    def body(b):
        return lax.pcast(b, "x", to="reduced")

    with pytest.raises(ValueError,
                       match="can only accept axis_name which the operand is invariant"):
        spmd.jit(spmd.shard_map(body, out_specs=P("x")))(put(np.arange(8.0), P("x")))


def test_out_specs_must_match_unreduced(mesh):
    with pytest.raises(ShardMapError, match="says the output is unreduced"):
        spmd.jit(spmd.shard_map(lambda b: b, out_specs=P(unreduced={"x"})))(
            put(np.arange(8.0), P("x")))
    with pytest.raises(ShardMapError, match="does not say unreduced"):
        spmd.jit(spmd.shard_map(lambda b: lax.pcast(b, "x", to="unreduced"),
                                out_specs=P("x")))(put(np.arange(8.0), P("x")))


def test_marked_specs_need_explicit_full_manual_mesh():
    auto = spmd.make_mesh((2, 1), ("x", "y"))
    with pytest.raises(ShardMapError, match="all of type `Explicit`"):
        spmd.shard_map(lambda x: x, mesh=auto, in_specs=P(unreduced={"x"}),
                       out_specs=P())(np.arange(8.0))
    with pytest.raises(UnreducedSpecError, match="full manual mode"):
        spmd.shard_map(lambda x: x, mesh=auto, in_specs=P(unreduced={"x"}),
                       out_specs=P(), axis_names={"x"})(np.arange(8.0))


def test_empty_mesh_is_refused():
    with pytest.raises(ShardMapError, match="non-empty mesh"):
        spmd.shard_map(lambda x: x, mesh=spmd.make_mesh((), ()), in_specs=P(),
                       out_specs=P())(np.arange(8.0))


def test_vmap_of_a_body_with_unreduced_specs(mesh):
    v = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    f = spmd.shard_map(lambda b: lax.psum(b, "x"), in_specs=P(unreduced={"x"}),
                       out_specs=P())
    out = spmd.jit(spmd.vmap(f))(put(v, P(None, unreduced={"x"})))
    np.testing.assert_array_equal(np.asarray(out), v)


def test_jvp_and_checkpoint_carry_the_types(mesh):
    v = np.arange(4.0, dtype=np.float32)
    w = put(v, P(reduced={"x"}))

    @spmd.shard_map(in_specs=P(reduced={"x"}), out_specs=P("x"))
    def f(a):
        return snp.sin(lax.pcast(a, "x", to="varying"))

    for fn in (spmd.jvp, spmd.jit(spmd.jvp, static_argnums=0)):
        _, t = fn(f, (w,), (np.ones(4, np.float32),))
        np.testing.assert_allclose(np.asarray(t), np.cos(np.concatenate([v, v])), rtol=1e-6)

    @spmd.shard_map(in_specs=P(reduced={"x"}), out_specs=P(reduced={"x"}))
    def g(a):
        return spmd.checkpoint(lambda b: snp.sin(b) * 2.0)(a)

    gw = spmd.jit(spmd.grad(lambda a: snp.sum(g(a))))(w)
    assert gw.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    np.testing.assert_allclose(np.asarray(gw), 2 * np.cos(v), rtol=1e-6)


def test_scan_with_reduced_operands_and_residuals(mesh):
    """A reduced value closed over by a scan body, and FSDP's gather to='reduced'
    inside a scan over layers (its results are the backward pass's residuals): values
    and gradients against numpy and finite differences."""
    v = np.arange(4.0, dtype=np.float32)

    @spmd.shard_map(in_specs=P(reduced={"x"}), out_specs=P(reduced={"x"}))
    def h(a):
        return lax.scan(lambda c, _: (c + snp.sin(a), None), snp.zeros_like(a), None,
                        length=3)[0]

    a = put(v, P(reduced={"x"}))
    np.testing.assert_allclose(np.asarray(spmd.jit(h)(a)), 3 * np.sin(v), rtol=1e-6)
    g = spmd.jit(spmd.grad(lambda w: snp.sum(h(w))))(a)
    assert g.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    np.testing.assert_allclose(np.asarray(g), 3 * np.cos(v), rtol=1e-6)

    rng = np.random.default_rng(0)
    w_np = rng.standard_normal((3, 4, 4)).astype(np.float32) * 0.5
    x_np = rng.standard_normal((6, 4)).astype(np.float32)

    @spmd.shard_map(in_specs=(P(None, "x", None), P()), out_specs=P())
    def fwd(ws, x):
        def layer(c, w_block):
            w = lax.all_gather(w_block, "x", tiled=True, to="reduced")
            return snp.tanh(c @ w), None
        return lax.pmean(snp.sum(lax.scan(layer, x, ws)[0] ** 2), "x")

    def ref(w):
        c = x_np.astype(np.float64)
        for k in range(3):
            c = np.tanh(c @ w[k])
        return (c ** 2).sum()

    ws = put(w_np, P(None, "x", None))
    np.testing.assert_allclose(float(spmd.jit(fwd)(ws, x_np)), ref(w_np), rtol=1e-5)
    g = spmd.jit(spmd.grad(fwd))(ws, x_np)
    assert g.sharding == NamedSharding(mesh, P(None, "x", None))
    eps, num = 1e-3, np.zeros(w_np.shape)
    for idx in np.ndindex(w_np.shape):
        d = np.zeros(w_np.shape)
        d[idx] = eps
        num[idx] = (ref(w_np + d) - ref(w_np - d)) / (2 * eps)
    np.testing.assert_allclose(np.asarray(g), num, rtol=1e-3, atol=1e-3)
    # The weight's gradient is reduce-scattered, never all-reduced.
    prog = text(spmd.grad(fwd), ws, x_np)
    assert "psum_scatter" in prog


def test_cond_and_while_keep_reduced_types(mesh):
    v = np.arange(4.0, dtype=np.float32)
    a = put(v, P(reduced={"x"}))

    @spmd.shard_map(in_specs=(P(reduced={"x"}), P()), out_specs=P(reduced={"x"}))
    def c(w, k):
        # One branch keeps the reduced operand, the other returns an invariant value:
        # the results join to reduced.
        return lax.cond(k > 0, lambda w: snp.sin(w) * 2.0, lambda w: snp.ones_like(w), w)

    for k, value, grad in ((1, 2 * np.sin(v), 2 * np.cos(v)), (0, np.ones(4), np.zeros(4))):
        np.testing.assert_allclose(np.asarray(spmd.jit(c)(a, k)), value, rtol=1e-6)
        g = spmd.jit(spmd.grad(lambda w: snp.sum(c(w, k))))(a)
        assert g.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
        np.testing.assert_allclose(np.asarray(g), grad, rtol=1e-6)

    @spmd.shard_map(in_specs=P(reduced={"x"}), out_specs=P(reduced={"x"}))
    def h(w):
        return lax.while_loop(lambda t: t[0] < 3, lambda t: (t[0] + 1, t[1] + snp.sin(w)),
                              (0, snp.zeros_like(w)))[1]

    np.testing.assert_allclose(np.asarray(spmd.jit(h)(a)), 3 * np.sin(v), rtol=1e-6)
    _, t = spmd.jvp(h, (a,), (np.ones(4, np.float32),))
    np.testing.assert_allclose(np.asarray(t), 3 * np.cos(v), rtol=1e-6)


def test_branches_unreduced_along_other_axes_are_refused(mesh):
    @spmd.shard_map(in_specs=(P("x"), P()), out_specs=P(unreduced={"x"}))
    def c(b, k):
        return lax.cond(k > 0, lambda b: lax.pcast(b, "x", to="unreduced"), lambda b: b, b)

    with pytest.raises(spmd.errors.ProgramTypeError, match="differ in their unreduced axes"):
        spmd.jit(c)(put(np.arange(8.0), P("x")), 1)


@pytest.mark.parametrize("explicit", [True, False])
def test_operations_on_an_unreduced_array(explicit):
    """On explicit axes its type admits linear maps only; on automatic ones the
    partitioner adds the summands first.  Eager and jitted alike, values as numpy's."""
    from spmd.errors import ShardingTypeError

    types = (AxisType.Explicit if explicit else AxisType.Auto,)
    m = spmd.make_mesh((2,), ("x",), axis_types=types)
    v = np.arange(4.0, dtype=np.float32)
    u = spmd.device_put(v, NamedSharding(m, P(unreduced={"x"})))
    for f, want in [(lambda a: a * 2.0, 2 * v), (snp.sum, v.sum())]:
        for g in (f, spmd.jit(f)):
            out = g(u)
            np.testing.assert_allclose(np.asarray(out), want)
            assert bool(out.sharding.spec.unreduced) == explicit
    for f, want in [(snp.sin, np.sin(v)), (lambda a: a + 1.0, v + 1), (lambda a: a * a, v * v)]:
        for g in (f, spmd.jit(f)):
            if explicit:
                with pytest.raises(ShardingTypeError, match="unreduced"):
                    g(u)
            else:
                np.testing.assert_allclose(np.asarray(g(u)), want, rtol=1e-6)


LINEAR = {
    "neg": lambda u, c: -u,
    "reshape": lambda u, c: u.reshape(4, 2),
    "transpose": lambda u, c: u.reshape(2, 4).T,
    "slice": lambda u, c: u[1:6],
    "rev": lambda u, c: u[::-1],
    "sum": lambda u, c: snp.sum(u),
    "broadcast": lambda u, c: snp.broadcast_to(u, (3, 8)),
    "convert": lambda u, c: u.astype(np.float64),
    "mul_invariant": lambda u, c: u * c,
    "div_by_invariant": lambda u, c: u / (c + 1.0),
    "add_unreduced": lambda u, c: u + u * 2.0,
    "concatenate": lambda u, c: snp.concatenate([u, u * 3.0]),
    "dot": lambda u, c: snp.dot(u.reshape(2, 4), c.reshape(4, 2)),
}


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_linear_maps_of_summands_sum_to_the_map_of_the_sum(mesh2, name):
    """Each unreduced policy checked by computation: a linear map applied to each
    device's summand, then summed (psum), equals the map of the value (numpy); and
    its gradient is the map's transpose."""
    f = LINEAR[name]
    rng = np.random.default_rng(len(name))
    parts = rng.standard_normal((2, 8)).astype(np.float32)  # one summand per 'x' device
    c = rng.standard_normal(8).astype(np.float32)

    @spmd.jit
    @spmd.shard_map(in_specs=(P("x"), P()), out_specs=P())
    def body(p, cc):
        u = lax.pcast(p[0], "x", to="unreduced")
        out = f(u, cc)
        assert spmd.typeof(out).mat.unreduced == {"x"}
        return lax.psum(out, "x")

    got = body(put(parts, P("x")), put(c, P()))
    want = f(parts.sum(0), c) if name != "convert" else parts.sum(0).astype(np.float64)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    # The gradient of a linear map is the same for every summand.
    g = spmd.jit(spmd.grad(lambda p: snp.sum(body(p, put(c, P())) * 1.5)))(put(parts, P("x")))
    gw = spmd.grad(lambda v: snp.sum(f(v, c) * 1.5))(parts.sum(0))
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(np.asarray(gw), (2, 8)),
                               rtol=1e-5, atol=1e-5)


def test_nonlinear_or_mixed_uses_are_refused(mesh2):
    def run(f):
        @spmd.jit
        @spmd.shard_map(in_specs=(P("x"), P("y")), out_specs=P())
        def body(p, q):
            return lax.psum(f(lax.pcast(p[0], "x", to="unreduced"), q[0]), ("x", "y"))
        return body(put(np.ones((2, 8)), P("x")), put(np.ones((2, 8)), P("y")))

    for f, err in [(lambda u, v: u * u, ManualTypeError), (lambda u, v: snp.exp(u),
                                                           UnreducedRuleError),
                   (lambda u, v: u + 1.0, ManualTypeError),
                   (lambda u, v: u / u, ManualTypeError),
                   (lambda u, v: snp.maximum(u, 0.0), UnreducedRuleError)]:
        with pytest.raises(err):
            run(f)


@pytest.mark.parametrize("spec_u", [P(unreduced={"x"}), P("y", unreduced={"x"}),
                                    P(None, "y", unreduced={"x"})])
@pytest.mark.parametrize("spec_c", [P(), P("y"), P(None, "y")])
def test_global_products_of_unreduced_arrays(mesh2, spec_u, spec_c):
    """On explicit axes a product with an unreduced operand is unreduced (dot_general's
    policy "one"): summed afterwards it equals numpy's, or the types say it is
    ambiguous; never a wrong value."""
    from spmd.errors import ShardingTypeError

    rng = np.random.default_rng(3)
    u_np = rng.standard_normal((8, 6)).astype(np.float32)
    c_np = rng.standard_normal((6, 4)).astype(np.float32)
    u, c = put(u_np, spec_u), put(c_np, spec_c)
    for f, want in [(lambda u, c: snp.dot(u, c), u_np @ c_np),
                    (lambda u, c: snp.dot(c.T, u.T), (u_np @ c_np).T),
                    (lambda u, c: snp.dot(u, c, out_sharding=P(unreduced={"x"})),
                     u_np @ c_np)]:
        try:
            out = spmd.jit(lambda u, c: spmd.sharding.reshard(f(u, c), P()))(u, c)
        except ShardingTypeError:
            continue
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-4)


def test_a_carry_that_becomes_unreduced_is_refused(mesh):
    @spmd.shard_map(in_specs=P("x"), out_specs=P(unreduced={"x"}))
    def f(b):
        return lax.scan(lambda c, _: (lax.pcast(c, "x", to="unreduced"), None), b, None,
                        length=2)[0]

    with pytest.raises(spmd.errors.ProgramTypeError,
                       match=r"the body function must return a carry of the same type .* "
                             r"the input is f32\[4\]\{x\} and the output is f32\[4\]\{U:x\}"):
        spmd.jit(f)(put(np.arange(8.0), P("x")))
