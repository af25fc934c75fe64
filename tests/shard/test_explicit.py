"""Explicit sharding (spmd.shard.explicit.types): types flow through jitted and eager programs,
values equal numpy's on the global arrays, results are placed as their types say, and
every ambiguity is a ShardingTypeError naming the fix.  The rules themselves:
test_explicit_rules.py; the docs' examples: test_explicit_docs.py."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.errors import ArgumentError, ShardingTypeError
from spmd.shard.arrays.spec import ShardingError
from spmd.sharding import AxisType, NamedSharding, P, auto_axes, explicit_axes, reshard
from tests.tolerance import assert_sum_close

EXPLICIT = (AxisType.Explicit, AxisType.Explicit)


@pytest.fixture
def mesh():
    return spmd.make_mesh((4, 2), ("x", "y"), axis_types=EXPLICIT)


@pytest.fixture(autouse=True)
def _no_mesh_left():
    yield
    spmd.sharding.set_mesh(None)


def put(mesh, a, *spec):
    return spmd.device_put(np.asarray(a), NamedSharding(mesh, P(*spec)))


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def spec_of(x):
    """``x``'s spec without trailing Nones (``P('x', None)`` places as ``P('x')``)."""
    return norm(x.sharding.spec)


def norm(spec):
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return P(*parts)


# ------------------------------------------------------------------- types

def test_typeof_an_array_and_a_traced_value(mesh):
    a = put(mesh, rand(8, 4), "x", "y")
    t = spmd.typeof(a)
    assert str(t) == "f32[8@x,4@y]" and t.sharding == NamedSharding(mesh, P("x", "y"))
    assert t == spmd.typeof(np.zeros((8, 4), np.float32))  # compares as the plain value
    seen = []

    @spmd.jit
    def f(a):
        b = snp.exp(a)
        seen.append((str(spmd.typeof(b)), spmd.typeof(b).sharding.spec))
        return b

    f(a)
    assert seen == [("f32[8@x,4@y]", P("x", "y"))]
    # Not on explicit axes: the plain abstract value, no sharding attribute.
    auto = spmd.make_mesh((4, 2), ("x", "y"))
    plain = spmd.typeof(spmd.device_put(np.ones(8), NamedSharding(auto, P("x"))))
    assert not hasattr(plain, "sharding")


def test_jit_results_are_placed_as_typed_and_equal_numpy(mesh):
    an, bn = rand(8, 4), rand(1, 4, seed=1)
    a, b = put(mesh, an, "x", "y"), put(mesh, bn, None, "y")

    @spmd.jit
    def f(a, b):
        c = snp.tanh(a) * b + 1.0           # (x, y)
        s = c.sum(axis=0)                   # (y)
        m = c.max(axis=1)                   # (x)
        t = c.T                             # (y, x)
        r = snp.broadcast_to(s, (3, 4))     # (None, y)
        return c, s, m, t, r

    c, s, m, t, r = f(a, b)
    cn = np.tanh(an) * bn + 1.0
    for got, want, spec in [(c, cn, P("x", "y")), (s, cn.sum(0), P("y")), (m, cn.max(1), P("x")),
                            (t, cn.T, P("y", "x")), (r, np.broadcast_to(cn.sum(0), (3, 4)),
                                                     P(None, "y"))]:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
        assert spec_of(got) == spec


def test_eager_operations_keep_their_types(mesh):
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    b = snp.sin(a) + 1
    assert spec_of(b) == P("x", "y")
    np.testing.assert_allclose(np.asarray(b), np.sin(an) + 1, rtol=1e-6)
    assert spec_of(a.sum(axis=1)) == P("x")
    w = put(mesh, rand(4, 6), None, None)
    with pytest.raises(ShardingTypeError, match="Contracting dimensions are sharded"):
        a @ put(mesh, rand(4, 6), "y", None)
    assert spec_of(snp.matmul(a.T.T, w)) == P("x")


def test_numpy_arguments_and_constants_are_whole(mesh):
    a = put(mesh, rand(8, 4), "x", None)
    seen = []

    @spmd.jit
    def f(a, b):
        seen.append(spmd.typeof(b).sharding.spec)
        c = a + b + snp.ones((8, 4))
        seen.append(spmd.typeof(c).sharding.spec)
        return c

    out = f(a, np.ones((8, 4), np.float32))
    # (A type's spec names every dimension, as JAX's do.)
    assert seen == [P(None, None), P("x", None)] and spec_of(out) == P("x")


def test_the_current_mesh_types_a_function_of_numpy_values(mesh):
    seen = []

    @spmd.jit
    def f(x):
        y = reshard(x * 2, P("x"))
        seen.append(str(spmd.typeof(y)))
        return y

    with spmd.sharding.use_mesh(mesh):
        out = f(np.arange(8.0, dtype=np.float32))
    assert seen == ["f32[8@x]"] and spec_of(out) == P("x")
    np.testing.assert_allclose(np.asarray(out), np.arange(8.0) * 2)


# ------------------------------------------------------- ambiguity errors

def test_ambiguous_operations_raise_with_the_fix(mesh):
    a = put(mesh, rand(8, 4), "x", "y")
    cases = [
        (lambda a, b: a @ b, put(mesh, rand(4, 6), "y", None),
         r"Contracting dimensions are sharded .* `out_sharding` parameter"),
        (lambda a, b: a + b, put(mesh, rand(8, 4), "y", "x"),
         r"incompatible shardings for broadcasting: PartitionSpec\('x', 'y'\), "
         r"PartitionSpec\('y', 'x'\).*reshard"),
        (lambda a, b: snp.concatenate([a, b]), put(mesh, rand(8, 4), "x", None),
         r"concatenate: all operands should have the same sharding"),
        (lambda a, b: snp.where(a > 0, a, b), put(mesh, rand(8, 4), "x", None),
         r"incompatible shardings|select cases must have the same shardings"),
        (lambda a, b: a.reshape(32) + b.sum(), put(mesh, rand(8, 4), "x", "y"),
         r"reshape of f32\[8,4\] with sharding .* reshard the operand first, or give the "
         r"result's sharding with reshape\(\.\.\., out_sharding=\)"),
        (lambda a, b: a[b.astype(np.int32)], put(mesh, np.zeros(3), None),
         r"indexing dimension 0 of an array split over \('x',\)"),
        (lambda a, b: snp.einsum("ij,kj->ik", a, b), put(mesh, rand(4, 4), "x", None),
         r"dot_general: the result would be split over mesh axis 'x' twice"),
    ]
    for fn, b, pattern in cases:
        with pytest.raises(ShardingTypeError, match=pattern):
            spmd.jit(fn)(a, b)


def test_control_flow_needs_one_type(mesh):
    a = put(mesh, rand(8, 4), "x", None)
    with pytest.raises(ShardingTypeError, match=r"scan carry 0 enters with sharding "
                                                r"PartitionSpec\('x'\) and the body returns "
                                                r"PartitionSpec\(None, 'x'\)"):
        spmd.jit(lambda a: lax.scan(lambda c, _: (reshard(c, P(None, "x")), None), a,
                                    None, length=2))(a)
    with pytest.raises(ShardingTypeError, match=r"cond branches must give their outputs one "
                                                r"sharding; output 0"):
        spmd.jit(lambda a, p: lax.cond(p, lambda v: v, lambda v: reshard(v, P()), a))(a, True)
    # Carries that keep their type: values as numpy's.
    f = spmd.jit(lambda a: lax.scan(lambda c, _: (snp.sin(c) + c, c.sum()), a, None,
                                    length=3))
    c, ys = f(a)
    cn, ysn = np.asarray(a), []
    for _ in range(3):
        ysn.append(cn.sum())
        cn = np.sin(cn) + cn
    np.testing.assert_allclose(np.asarray(c), cn, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ys), ysn, rtol=1e-5)
    assert spec_of(c) == P("x")
    out = spmd.jit(lambda a: lax.fori_loop(0, 3, lambda i, v: v * 2, a))(a)
    assert spec_of(out) == P("x")
    np.testing.assert_allclose(np.asarray(out), np.asarray(a) * 8)


# ---------------------------------------------------- out_sharding, reshard

@pytest.mark.parametrize("spec", [P("x", None), P("x", "y"), P(None, "y"), P()])
def test_out_sharding_settles_a_contraction(mesh, spec):
    an, bn = rand(8, 4), rand(4, 6, seed=1)
    a, b = put(mesh, an, "x", "y"), put(mesh, bn, "y", None)
    for fn in (lambda a, b: snp.matmul(a, b, out_sharding=spec),
               lambda a, b: snp.dot(a, b, out_sharding=spec),
               lambda a, b: snp.einsum("ij,jk->ik", a, b, out_sharding=spec)):
        for out in (spmd.jit(fn)(a, b), fn(a, b)):  # jitted and eager
            np.testing.assert_allclose(np.asarray(out), an @ bn, rtol=1e-5, atol=1e-5)
            assert spec_of(out) == norm(spec)


def test_out_sharding_of_reshape_and_creation(mesh):
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")

    @spmd.jit
    def f(a):
        r = snp.reshape(a, (32,), out_sharding=P("x"))
        z = snp.zeros((8, 2), out_sharding=P("x"))
        o = snp.ones((4,), out_sharding=P("y"))
        full = snp.full((2, 8), 3.0, out_sharding=P(None, "x"))
        return r, z, o, full

    r, z, o, full = f(a)
    np.testing.assert_array_equal(np.asarray(r), an.reshape(32))
    assert [spec_of(v) for v in (r, z, o, full)] == [P("x"), P("x"), P("y"), P(None, "x")]
    np.testing.assert_array_equal(np.asarray(full), np.full((2, 8), 3.0))
    with spmd.sharding.use_mesh(mesh):
        assert spec_of(snp.zeros((8,), out_sharding=P("x"))) == P("x")


def test_reshard_in_jit_and_eagerly(mesh):
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    for spec in (P(None, "x"), P("y", None), P(), P(("x", "y"))):
        out = spmd.jit(lambda v: reshard(v, spec))(a)
        assert spec_of(out) == norm(spec)
        np.testing.assert_array_equal(np.asarray(out), an)
        eager = reshard(a, spec)
        assert spec_of(eager) == norm(spec)
        np.testing.assert_array_equal(np.asarray(eager), an)
    # Pytrees, with one spec or one per leaf.
    x, y = reshard((a, a), (P("x"), P()))
    assert (spec_of(x), spec_of(y)) == (P("x"), P())
    with pytest.raises(ShardingTypeError, match=r"reshard: the PartitionSpec .* needs a mesh: "
                                                r"call it under spmd.sharding.set_mesh"):
        reshard(np.ones(8), P("x"))
    with pytest.raises(ShardingTypeError, match=r"reshard: expected a PartitionSpec or "
                                                r"NamedSharding, got str"):
        reshard(a, "x")


# ------------------------------------------------------ auto and explicit

def test_auto_axes(mesh):
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    seen = []

    def flat(v):
        seen.append(hasattr(spmd.typeof(v), "sharding"))
        return v.reshape(-1) * 2

    out = spmd.jit(lambda v: auto_axes(flat, out_sharding=P("x"))(v))(a)
    assert seen == [False] and spec_of(out) == P("x")
    np.testing.assert_array_equal(np.asarray(out), an.reshape(-1) * 2)
    # The out_sharding may come with the call; eagerly, too.
    out = auto_axes(flat)(a, out_sharding=P("y"))
    assert spec_of(out) == P("y")
    with pytest.raises(TypeError, match="auto_axes: missing required keyword argument "
                                        "'out_sharding'"):
        spmd.jit(lambda v: auto_axes(flat)(v))(a)
    # All the explicit axes by name: the same as axes=None.
    out = spmd.jit(lambda v: auto_axes(flat, axes=("x", "y"), out_sharding=P("x"))(v))(a)
    assert seen[-1] is False and spec_of(out) == P("x")


def test_auto_axes_over_some_axes(mesh):
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    seen = []

    def flat(v):
        t = spmd.typeof(v)
        seen.append((t.sharding.spec, t.sharding.mesh.axis_types))
        w = v.reshape(-1) * 2  # a split of the major dimension stays: typed on 'x'
        seen.append(spmd.typeof(w).sharding.spec)
        return w

    f = spmd.jit(lambda v: auto_axes(flat, axes="y", out_sharding=P(("x", "y")))(v))
    out = f(a)
    # Inside, 'y' is automatic: the types name 'x' only, on the mesh as retyped.
    assert seen == [(P("x", None), (AxisType.Explicit, AxisType.Auto)), P("x")]
    assert spec_of(out) == P(("x", "y"))
    np.testing.assert_array_equal(np.asarray(out), an.reshape(-1) * 2)
    # The pins inside leave 'y' to the partitioner.
    text = str(spmd.make_jaxpr(lambda v: auto_axes(flat, axes="y", out_sharding=P("x"))(v))(a))
    assert "free=frozenset({'y'})" in text
    # Along 'x' the types still hold: a reshape that would move elements of a dimension
    # split over 'x' is an error, as on a mesh whose 'x' alone is explicit.
    b = put(mesh, an, "y", "x")
    with pytest.raises(ShardingTypeError, match="reshape of f32\\[8,4\\] with sharding "
                                                "PartitionSpec\\(None, 'x'\\)"):
        spmd.jit(lambda v: auto_axes(lambda w: w.reshape(-1), axes="y",
                                     out_sharding=P("x"))(v))(b)
    with pytest.raises(ShardingTypeError, match=r"auto_axes\(axes='z'\): 'z' is not an axis"):
        spmd.jit(lambda v: auto_axes(flat, axes="z", out_sharding=P("x"))(v))(a)


def test_explicit_axes_inside_auto_axes(mesh):
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    seen = []

    def inner(v):
        seen.append(str(spmd.typeof(v)))
        return v * 3

    def outer(v):
        seen.append(str(spmd.typeof(v)))
        w = explicit_axes(inner, axes="y", in_sharding=P("x", "y"))(v + 1)
        seen.append(str(spmd.typeof(w)))  # its type on the axes explicit here
        return w

    out = spmd.jit(lambda v: auto_axes(outer, axes="y", out_sharding=P("x", "y"))(v))(a)
    assert seen == ["f32[8@x,4]", "f32[8@x,4@y]", "f32[8@x,4]"]
    assert spec_of(out) == P("x", "y")
    np.testing.assert_allclose(np.asarray(out), (an + 1) * 3, rtol=1e-6)


def test_explicit_axes_on_an_automatic_mesh():
    auto = spmd.make_mesh((4, 2), ("x", "y"))
    seen = []

    def g(v):
        w = v * 2
        seen.append(str(spmd.typeof(w)))
        return w.sum(axis=0)

    with spmd.sharding.use_mesh(auto):
        out = spmd.jit(lambda v: explicit_axes(g, in_sharding=P("x", "y"))(v))(
            np.ones((8, 4), np.float32))
    assert seen == ["f32[8@x,4@y]"]
    np.testing.assert_array_equal(np.asarray(out), np.full(4, 16.0))
    # Over some of the axes: only 'x' is explicit inside, and 'y' is dropped from the
    # type (the partitioner's).
    an = rand(8, 4)
    with spmd.sharding.use_mesh(auto):
        out = spmd.jit(lambda v: explicit_axes(g, axes="x", in_sharding=P("x", "y"))(v))(
            put(auto, an))
    assert seen == ["f32[8@x,4@y]", "f32[8@x,4]"]
    # Summed in parts over 'x', then across: a sum near zero may differ from numpy's
    # in more than its own last bits.
    assert_sum_close(np.asarray(out), an * 2, axis=0)
    with pytest.raises(TypeError, match="explicit_axes: missing required keyword argument"):
        with spmd.sharding.use_mesh(auto):
            spmd.jit(lambda v: explicit_axes(g)(v))(np.ones((8, 4), np.float32))


# ------------------------------------------------------ transformations

def test_gradients_take_their_parameters_types(mesh):
    xn, w1n, w2n = rand(8, 4), rand(4, 6, seed=1), rand(6, 3, seed=2)
    x = put(mesh, xn, "x", None)
    params = (put(mesh, w1n, None, "y"), put(mesh, w2n, "y", None))
    seen = []

    def loss(params, xb):
        w1, w2 = params
        h = snp.tanh(xb @ w1)
        seen.append(str(spmd.typeof(h)))
        y = snp.dot(h, w2, out_sharding=P("x", None))
        return (y ** 2).mean()

    for grad in (spmd.jit(spmd.grad(loss)), spmd.grad(loss)):  # jitted, and eagerly
        g1, g2 = grad(params, x)
        assert (spec_of(g1), spec_of(g2)) == (P(None, "y"), P("y"))

        def lossn(w1, w2):
            return ((np.tanh(xn @ w1) @ w2) ** 2).mean()

        # The exact gradient, in float64, by hand.
        h = np.tanh(xn.astype(np.float64) @ w1n)
        y = h @ w2n
        dy = 2 * y / y.size
        np.testing.assert_allclose(np.asarray(g2), h.T @ dy, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(g1), xn.T @ ((dy @ w2n.T) * (1 - h ** 2)),
                                   rtol=1e-4, atol=1e-6)
        assert lossn(w1n, w2n) > 0
    assert seen[0] == "f32[8@x,6@y]"


def test_vmap_and_nested_jit_and_shard_map(mesh):
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")

    inner = spmd.jit(lambda v: snp.sin(v) * 2)
    body = spmd.shard_map(lambda b: b + lax.axis_index("x").astype(np.float32), mesh=mesh,
                          in_specs=P("x", "y"), out_specs=P("x", "y"))

    @spmd.jit
    def f(a):
        v = spmd.vmap(lambda row: row * row.sum())(a)
        i = inner(a)
        s = body(a)
        return v, i, s

    v, i, s = f(a)
    np.testing.assert_allclose(np.asarray(v), an * an.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(i), np.sin(an) * 2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(s), an + np.repeat(np.arange(4.0), 2)[:, None],
                               rtol=1e-6)
    assert spec_of(i) == P("x", "y") and spec_of(s) == P("x", "y")


def test_types_key_the_traces(mesh):
    # One function, arguments placed two ways: two traces, each typed as its arguments.
    seen = []

    @spmd.jit
    def f(a):
        s = getattr(spmd.typeof(a), "sharding", None)
        seen.append(None if s is None else s.spec)
        return a * 2

    an = rand(8, 4)
    for spec in (("x",), (None, "y"), ("x",)):
        np.testing.assert_array_equal(np.asarray(f(put(mesh, an, *spec))), an * 2)
    assert seen == [P("x", None), P(None, "y")]
    # The same devices on an automatic mesh: another program (no types).
    auto = spmd.make_mesh((4, 2), ("x", "y"))
    out = f(spmd.device_put(an, NamedSharding(auto, P("x"))))
    assert seen[2:] == [None]
    np.testing.assert_array_equal(np.asarray(out), an * 2)


def test_arguments_on_two_explicit_meshes_are_refused(mesh):
    other = spmd.make_mesh((2, 4), ("x", "y"), axis_types=EXPLICIT)
    with pytest.raises(ShardingTypeError, match="arguments are typed on two meshes"):
        spmd.jit(lambda a, b: a)(put(mesh, np.ones(8), "x"), put(other, np.ones(8), "x"))


# ------------------------------------------------------------------ unreduced

def test_unreduced_results_of_a_contraction(mesh):
    an, bn = rand(8, 4), rand(4, 6, seed=1)
    a, b = put(mesh, an, "x", "y"), put(mesh, bn, "y", None)
    seen = []

    @spmd.jit
    def f(a, b, c):
        u = snp.dot(a, b, out_sharding=P("x", unreduced={"y"}))   # summands over y
        v = (u * 2 + u - u / 4).sum(axis=1) * c                    # linear in u
        seen.extend(str(spmd.typeof(t)) for t in (u, v))
        return reshard(v, P("x")), reshard(u, P("x", "y"))

    c = put(mesh, rand(8, seed=2), "x")
    v, u = f(a, b, c)
    assert seen == ["f32[8@x,6]{U:y}", "f32[8@x]{U:y}"]
    want = an.astype(np.float64) @ bn
    np.testing.assert_allclose(np.asarray(v), (want * 2.75).sum(1) * np.asarray(c), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(u), want, rtol=1e-5, atol=1e-5)
    assert (spec_of(v), spec_of(u)) == (P("x"), P("x", "y"))


def test_unreduced_values_only_pass_linear_maps(mesh):
    a, b = put(mesh, rand(8, 4), "x", "y"), put(mesh, rand(4, 6, seed=1), "y", None)
    u_of = lambda a, b: snp.dot(a, b, out_sharding=P("x", unreduced={"y"}))  # noqa: E731
    cases = [
        (lambda a, b: reshard(snp.tanh(u_of(a, b)), P()), r"tanh got an unreduced operand .* "
                                                         r"reshard it to a spec without"),
        (lambda a, b: reshard(u_of(a, b) * u_of(a, b), P()), r"mul: both operands are unreduced"),
        (lambda a, b: reshard(u_of(a, b) + 1.0, P()), r"add: operands unreduced over different"),
        (lambda a, b: reshard(u_of(a, b).astype(np.int32), P()),
         r"convert_element_type to an integer type got an unreduced operand"),
    ]
    for fn, pattern in cases:
        with pytest.raises(ShardingTypeError, match=pattern):
            spmd.jit(fn)(a, b)
    # An unreduced result leaves as an unreduced Array holding the sum.
    out = spmd.jit(u_of)(a, b)
    assert out.sharding == NamedSharding(mesh, P("x", unreduced={"y"}))
    np.testing.assert_allclose(np.asarray(out), np.asarray(a) @ np.asarray(b), rtol=1e-5,
                               atol=1e-6)


def test_unreduced_specs(mesh):
    s = P("x", unreduced={"y"})
    assert s != P("x") and hash(s) != hash(P("x")) and s == P("x", unreduced=("y",))
    assert repr(s) == "PartitionSpec('x', unreduced={'y'})"
    assert P() != None and P("x") != "x" and P("x") == ("x",)  # noqa: E711
    import pickle

    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(ShardingError, match=r"both split a dimension and are unreduced"):
        P("x", unreduced={"x"})
    # An Array placed unreduced holds its value (the sum of its summands).
    v = rand(8)
    u = spmd.device_put(v, NamedSharding(mesh, s))
    np.testing.assert_array_equal(np.asarray(u), v)
    np.testing.assert_array_equal(sum(np.asarray(sh.data) for sh in u.addressable_shards
                                      if sh.index == u.addressable_shards[0].index), v[:2])
    assert P(reduced={"x"}).reduced == {"x"} and P(reduced={"x"}) != P()


def test_jit_with_in_shardings_types_its_arguments(mesh):
    seen = []

    def f(a, w, v):
        seen.append(str(spmd.typeof(a)))
        p = snp.matmul(a, w, out_sharding=P("x", unreduced={"y"}))
        q = snp.matmul(a, v, out_sharding=P("x", unreduced={"y"}))
        return reshard(p + q, P("x"))   # one psum for both products

    s = lambda *p: NamedSharding(mesh, P(*p))  # noqa: E731
    g = spmd.jit(f, in_shardings=(s("x", "y"), s("y", None), s("y", None)))
    an, wn = rand(8, 4), rand(4, 6, seed=1)
    out = g(an, wn, wn)
    assert seen == ["f32[8@x,4@y]"] and spec_of(out) == P("x")
    np.testing.assert_allclose(np.asarray(out), 2 * an @ wn, rtol=1e-5, atol=1e-5)
    assert [c[0] for c in g.lower(an, wn, wn).collectives()] == ["psum"]


def test_typeof_under_vmap_drops_the_batch_dimensions(mesh):
    a = put(mesh, np.ones((8, 4, 6), np.float32), "x", None, "y")
    seen = []

    def row(r):
        seen.append(str(spmd.typeof(r)))
        return spmd.vmap(lambda c: (seen.append(str(spmd.typeof(c))), c * 2)[1], in_axes=1)(r)

    out = spmd.jit(lambda a: spmd.vmap(row)(a))(a)
    spmd.jit(lambda a: spmd.vmap(lambda r: (seen.append(str(spmd.typeof(r))), r)[1],
                                 in_axes=2)(a))(a)
    assert seen == ["f32[4,6@y]", "f32[4]", "f32[8@x,4]"]
    np.testing.assert_array_equal(np.asarray(out), 2 * np.ones((8, 6, 4)))  # (out_axes 0)


# --------------------------------------------------------------- mixed meshes

@pytest.fixture
def mixed():
    return spmd.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Auto))


def test_a_mixed_mesh_types_its_explicit_axes_only(mixed):
    an, wn = rand(8, 4), rand(4, 6, seed=1)
    a, w = put(mixed, an, "x", "y"), put(mixed, wn, "y", None)
    assert str(spmd.typeof(a)) == "f32[8@x,4]"
    seen = []

    @spmd.jit
    def f(a, w):
        b = snp.tanh(a) * 2
        c = a @ w   # contracts over 'y', an automatic axis: the partitioner's business
        seen.extend(str(spmd.typeof(v)) for v in (b, c))
        return b, c, c.sum(axis=0)

    b, c, s = f(a, w)
    assert seen == ["f32[8@x,4]", "f32[8@x,6]"]
    np.testing.assert_allclose(np.asarray(b), np.tanh(an) * 2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(c), an @ wn, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(s), (an @ wn).sum(0), rtol=1e-5, atol=1e-5)
    # The explicit axis is where the type says; 'y' is wherever the partitioner put it.
    for v, dim0 in ((b, "x"), (c, "x")):
        assert v.sharding.spec[0] == dim0 or "x" in v.sharding.spec[0]
    assert "x" not in spmd.tree_util.tree_leaves(tuple(s.sharding.spec))
    # Explicit-axis ambiguity is still an error; naming an automatic axis in reshard is too.
    with pytest.raises(ShardingTypeError, match="Contracting dimensions are sharded"):
        spmd.jit(lambda u, v: u @ v)(put(mixed, rand(8, 8), None, "x"),
                                     put(mixed, rand(8, 8), "x", None))
    with pytest.raises(ShardingTypeError, match=r"reshard: PartitionSpec\('x', 'y'\) names "
                                                r"automatic axes \['y'\]"):
        spmd.jit(lambda a: reshard(a, P("x", "y")))(a)
    out = spmd.jit(lambda a: reshard(a, P(None, "x")))(a)
    assert out.sharding.spec[1] == "x" or "x" in out.sharding.spec[1]
    np.testing.assert_array_equal(np.asarray(out), an)
    # jit(in_shardings=) types its arguments by their explicit axes only.
    seen.clear()
    g = spmd.jit(lambda a: (seen.append(str(spmd.typeof(a))), a * 2)[1],
                 in_shardings=NamedSharding(mixed, P("x", "y")))
    np.testing.assert_array_equal(np.asarray(g(an)), an * 2)
    assert seen == ["f32[8@x,4]"]


@pytest.mark.parametrize("name", ["add", "matmul_t", "sum0", "transpose", "reshape_merge"])
def test_on_a_mixed_mesh_every_accepted_program_runs_as_typed(mixed, name):
    from tests.shard.test_explicit_rules import accepted_programs

    def x_of(spec, n):  # where 'x' splits, per dimension
        parts = [tuple(p for p in ((e,) if isinstance(e, str) else (e or ())) if p == "x")
                 for e in spec]
        return parts + [()] * (n - len(parts))

    accepted = 0
    for specs, out, typed, _, want in accepted_programs(mixed, name):
        accepted += 1
        # The explicit axis is where the type puts it ('y' wherever the partitioner did).
        assert x_of(out.sharding.spec, want.ndim) == x_of(typed.spec, want.ndim), (name, specs)
    assert accepted > 0


def test_make_jaxpr_traces_with_the_types(mesh):
    a = put(mesh, rand(8, 4), "x", "y")
    text = str(spmd.make_jaxpr(lambda a: snp.sin(a).sum(axis=0))(a))
    assert "sharding_constraint[spec=PartitionSpec('y')" in text
    with pytest.raises(ShardingTypeError, match="Contracting dimensions are sharded"):
        spmd.make_jaxpr(lambda a, b: a @ b)(a, put(mesh, rand(4, 6), "y", None))
    # Unplaced values: the program as before.
    assert "sharding_constraint" not in str(spmd.make_jaxpr(lambda v: v + 1)(np.ones(3)))


def test_make_jaxpr_prints_the_types(mesh, mixed):
    a, b = put(mesh, rand(8, 4), "x", "y"), put(mesh, rand(4, 6), "y", None)
    f = lambda a, b: snp.einsum("ij,jk->ik", snp.sin(a), b, out_sharding=P("x"))  # noqa: E731
    lines = str(spmd.make_jaxpr(f)(a, b)).splitlines()
    assert lines[0].strip() == "{ lambda ; a:f32[8@x,4@y] b:f32[4@y,6]. let"
    # sin's result is pinned to its type; the product is left to the partitioner
    # inside out_sharding= (untyped), and its reshard types it.
    assert lines[1].strip() == "c:f32[8,4] = sin a"
    assert lines[2].strip().startswith("d:f32[8@x,4@y] = sharding_constraint")
    assert lines[3].strip().startswith("e:f32[8,6] = dot_general")
    assert lines[4].strip().startswith("f:f32[8@x,6] = sharding_constraint")
    # A mixed mesh's types name its explicit axes only.
    m = put(mixed, rand(8, 4), "x", "y")
    text = str(spmd.make_jaxpr(lambda v: v * 2)(m))
    assert text.splitlines()[0].strip() == "{ lambda ; a:f32[8@x,4]. let"
    # The printed program is the program: it evaluates as any other.
    closed = spmd.make_jaxpr(f)(a, b)
    assert closed.program.eqns[0].primitive.name == "sin"


def test_closed_over_traced_values_and_threads(mesh):
    import threading

    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    seen = []

    @spmd.jit
    def outer(a):
        b = snp.exp(a)

        @spmd.jit
        def inner(c):  # closes over b, a traced value of the outer explicit trace
            d = c + b
            seen.append(str(spmd.typeof(d)))
            return d

        return inner(a * 2)

    np.testing.assert_allclose(np.asarray(outer(a)), an * 2 + np.exp(an), rtol=1e-6)
    assert seen == ["f32[8@x,4@y]"]

    # Threads tracing and running typed programs at once keep their own traces.
    results, errors = {}, []

    def work(k, spec):
        try:
            v = put(mesh, an + k, *spec)
            f = spmd.jit(lambda v: (results.setdefault(("type", k), str(spmd.typeof(v))),
                                    snp.sin(v).sum(axis=1))[1])
            results[k] = (np.asarray(f(v)), f(v).sharding.spec)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k, spec))
               for k, spec in enumerate((("x", "y"), ("y", "x"), (None, "x"), ("x",)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, spec in enumerate((("x", "y"), ("y", "x"), (None, "x"), ("x",))):
        np.testing.assert_allclose(results[k][0], np.sin(an + k).sum(1), rtol=1e-5)
        assert results[k][1] == norm(P(spec[0]))


def test_bad_specs_and_missing_meshes_are_named(mesh):
    with pytest.raises(ShardingError, match=r"PartitionSpec: unreduced=\{1\} must be mesh axis "
                                            r"names"):
        P("x", unreduced={1})
    with pytest.raises(ShardingError, match=r"NamedSharding: spec PartitionSpec\('x', "
                                            r"unreduced=\{'z'\}\) names axis 'z', not in the mesh"):
        spmd.jit(lambda a: reshard(a, P("x", unreduced={"z"})))(put(mesh, rand(8), "x"))
    with pytest.raises(ShardingTypeError, match=r"explicit_axes: no current mesh; call it "
                                                r"under spmd.sharding.set_mesh"):
        explicit_axes(lambda v: v, in_sharding=P("x"))(np.ones(8, np.float32))


def test_an_eager_shard_map_on_an_explicit_mesh(mesh):
    # Splitting the typed Arrays into the devices' blocks is the call's own data
    # movement, not a typed operation (a reshape of a split dimension would be refused).
    an = rand(8, 4)
    with spmd.sharding.use_mesh(mesh):
        a = put(mesh, an, "x", "y")
        f = spmd.shard_map(lambda b: b * 2, out_specs=P("x", "y"))
        out = f(a)
        np.testing.assert_array_equal(np.asarray(out), an * 2)
        assert spec_of(out) == P("x", "y")
        assert spec_of(spmd.jit(f)(a)) == P("x", "y")
        # in_specs inferred from a numpy argument on an explicit mesh: replicated.
        g = spmd.shard_map(lambda b, w: b * w, out_specs=P("x", "y"))
        np.testing.assert_allclose(np.asarray(g(a, an[:2, :1])), an * np.tile(an[:2, :1], (4, 4)),
                                   rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_partial_manual_body_is_typed_along_the_explicit_axes(mesh, jit):
    # As in JAX: the axes a partial-manual shard_map leaves stay explicit inside, and
    # its values are typed along them (the manual axis typed Manual on the mesh view).
    from spmd.sharding import get_abstract_mesh

    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    seen = []

    def body(v):
        am = get_abstract_mesh()
        t = spmd.typeof(v)
        seen.append((am.manual_axes, am.explicit_axes, t.sharding.spec,
                     t.sharding.mesh.axis_types, v.aval.sharding.spec))
        return v * 2

    with spmd.sharding.use_mesh(mesh):
        f = spmd.shard_map(body, out_specs=P("x"), axis_names={"x"})
        out = (spmd.jit(f) if jit else f)(a)
    assert seen[0] == (("x",), ("y",), P(None, "y"), (AxisType.Manual, AxisType.Explicit),
                       P(None, "y"))
    assert spec_of(out) == P("x", "y")
    np.testing.assert_array_equal(np.asarray(out), an * 2)


def test_a_partial_manual_bodys_types_merge_into_its_results():
    # Two manual axes, two explicit ones: the body transposes, so its result is typed
    # (l, k, -, -) inside, and outside each dimension is split over its manual axis,
    # then the body's explicit one.
    E = AxisType.Explicit
    mesh = spmd.make_mesh((2, 1, 2, 2), ("i", "j", "k", "l"), axis_types=(E,) * 4)
    vn = np.arange(64.0, dtype=np.float32).reshape(4, 2, 2, 4)
    v = put(mesh, vn, "i", "j", "k", "l")
    seen = []

    def g(x):
        seen.append(spmd.typeof(x).sharding.spec)
        out = x.T
        seen.append(spmd.typeof(out).sharding.spec)
        return out

    @spmd.jit
    def f(x):
        y = spmd.shard_map(g, mesh=mesh, out_specs=P("i", "j", None, None),
                           axis_names={"i", "j"})(x)
        seen.append(spmd.typeof(y).sharding.spec)
        return y

    with spmd.sharding.use_mesh(mesh):
        out = f(v)
    assert seen == [P(None, None, "k", "l"), P("l", "k", None, None),
                    P(("i", "l"), ("j", "k"), None, None)]
    assert spec_of(out) == P(("i", "l"), ("j", "k"))
    # Each (i, j) block (j has one device) transposed, the results stacked along i.
    want = np.concatenate([vn[2 * p:2 * p + 2].T for p in range(2)], axis=0)
    np.testing.assert_array_equal(np.asarray(out), want)


def test_collectives_in_a_typed_partial_manual_body(mesh):
    # The collectives act along the manual axis, which types never name: values keep
    # their types, and a dimension a collective resizes must be whole along the typed
    # axes.
    an = rand(8, 4)
    a = put(mesh, an, "x", "y")
    seen = []

    def body(v):
        s = lax.psum(v, "x")
        g = lax.all_gather(v, "x", axis=0, tiled=True, to="invarying")
        r = lax.ppermute(v, "x", [(i, (i + 1) % 4) for i in range(4)])
        i = lax.axis_index("x")
        seen.append([str(spmd.typeof(w)) for w in (s, g, r)])
        return s, g, r + i

    f = spmd.jit(spmd.shard_map(body, mesh=mesh, out_specs=(P(), P(), P("x")),
                                axis_names={"x"}))
    s, g, r = f(a)
    assert seen[0] == ["f32[2,4@y]", "f32[8,4@y]", "f32[2,4@y]{x}"]
    blocks = an.reshape(4, 2, 4)
    np.testing.assert_allclose(np.asarray(s), blocks.sum(0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g), an, rtol=1e-6)
    want = np.concatenate([blocks[(k - 1) % 4] + k for k in range(4)])
    np.testing.assert_allclose(np.asarray(r), want, rtol=1e-6)
    assert spec_of(s) == P(None, "y") and spec_of(r) == P("x", "y")
    with pytest.raises(ShardingTypeError, match=r"all_gather along dimension 1 of f32\[2,4\]\{x\} "
                                                r"with sharding PartitionSpec\(None, 'y'\)"):
        spmd.jit(spmd.shard_map(lambda v: lax.all_gather(v, "x", axis=1, tiled=True),
                                mesh=mesh, out_specs=P(), axis_names={"x"}))(a)


def test_vmap_keeps_the_batch_split_its_inputs_types_give(mesh):
    # As in JAX: the mapped axis stays split over the explicit axes the inputs' types
    # split it over, where it meets a sharding constraint or a shard_map.
    an = rand(8, 4)
    a = put(mesh, an, "x", None)
    out = spmd.jit(spmd.vmap(lambda r: reshard(r * 2, P("y"))))(a)
    assert spec_of(out) == P("x", "y")
    np.testing.assert_allclose(np.asarray(out), an * 2, rtol=1e-6)
    # A shard_map with no collective over 'x': each device maps over its rows.
    sm = spmd.shard_map(lambda r: lax.psum(r, "y"), mesh=mesh, in_specs=P("y"),
                        out_specs=P())
    f = spmd.jit(spmd.vmap(sm))
    out = f(a)
    assert spec_of(out) == P("x")
    np.testing.assert_allclose(np.asarray(out), an.reshape(8, 2, 2).sum(1), rtol=1e-6)
    pj = spmd.jit(spmd.vmap(sm), in_shardings=NamedSharding(mesh, P("x", None)))
    assert pj.lower(a).collectives() == []  # the partitioner moves no rows
    # One whose body sums over 'x' sees the whole batch (the copies along 'x' were the
    # same): the rows gathered, the result split again.
    sx = spmd.shard_map(lambda r: lax.psum(r, "x") / 4, mesh=mesh, in_specs=P("y"),
                        out_specs=P("y"))
    out = spmd.jit(spmd.vmap(sx))(a)
    assert spec_of(out) == P("x", "y")
    np.testing.assert_allclose(np.asarray(out), an, rtol=1e-6)
    with pytest.raises(ArgumentError, match=r"spmd_axis_name='y', and the mapped arguments "
                                            r"are split over explicit mesh axes \('x',\)"):
        spmd.jit(spmd.vmap(sm, spmd_axis_name="y"))(a)
    with pytest.raises(ShardingError, match=r"names mesh axes \['x'\] that the mapped axis "
                                            r"is split over"):
        spmd.jit(spmd.vmap(lambda r: reshard(r, P("x"))))(a)
