"""Higher-order primitives (jit, checkpoint, custom_jvp/custom_vjp, scan, fori_loop, cond,
while_loop) inside shard_map bodies and named vmaps: the varying-axes types of their
results (JEP 17111), loop carries and branches whose types grow, collectives inside their
bodies, and derivatives through them.  Oracles are numpy on the same blocks."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.shard.maps.shard_map import ShardMapError
from spmd.test_util import check_grads

MESH4 = spmd.make_mesh((4,), ("i",))
MESH = spmd.make_mesh((4, 2), ("i", "j"))
RING = tuple((k, (k + 1) % 4) for k in range(4))
RNG = np.random.default_rng(7)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _close(got, want, tol=1e-4):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def sm(body, in_specs, out_specs, mesh=MESH4, **kw):
    return spmd.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw)


def _psum_sin(axis):
    return lambda v: lax.psum(snp.sin(v), axis)


def _custom_jvp(axis):
    @spmd.custom_jvp
    def f(v):
        return lax.psum(snp.sin(v), axis)

    @f.defjvp
    def f_jvp(primals, tangents):
        (v,), (t,) = primals, tangents
        return f(v), lax.psum(snp.cos(v) * t, axis)

    return f


def _custom_vjp(axis, sum_ct):
    """``sum_ct``: the cotangent of the invariant result is summed over the axis (vmap and
    untyped shard_map, where devices hold shares of it) or not (typed shard_map: JEP 17111
    gives every device the whole cotangent)."""
    @spmd.custom_vjp
    def f(v):
        return lax.psum(snp.sin(v), axis)

    f.defvjp(lambda v: (f(v), snp.cos(v)),
             lambda r, g: (r * (lax.psum(g, axis) if sum_ct else g),))
    return f


def _shifted_sin():
    @spmd.custom_jvp
    def f(v):
        return lax.ppermute(snp.sin(v), "i", RING)

    @f.defjvp
    def f_jvp(primals, tangents):
        (v,), (t,) = primals, tangents
        return f(v), lax.ppermute(snp.cos(v) * t, "i", RING)

    return f


# Each body computes `k * psum(sin(b), "i")` (scan: summed over the rows too) through one
# higher-order primitive whose body holds the collective: (body, k, sums rows).
def _kinds(typed=True):
    a = "i"
    return {
        "jit": (lambda b: spmd.jit(_psum_sin(a))(b), 1, False),
        "checkpoint": (lambda b: spmd.checkpoint(_psum_sin(a))(b), 1, False),
        "checkpoint_dots": (lambda b: spmd.checkpoint(
            _psum_sin(a), policy=spmd.checkpoint_policies.dots_saveable)(b), 1, False),
        "custom_jvp": (lambda b: _custom_jvp(a)(b), 1, False),
        "custom_vjp": (lambda b: _custom_vjp(a, not typed)(b), 1, False),
        "scan": (lambda b: lax.scan(lambda c, t: (c + _psum_sin(a)(t), None),
                                    snp.zeros(b.shape[1:], b.dtype), b)[0], 1, True),
        # (zeros(b.shape), not zeros_like(b): that varies as b does, as in JAX)
        "fori": (lambda b: lax.fori_loop(0, 2, lambda k, c: c + _psum_sin(a)(b),
                                         snp.zeros(b.shape, b.dtype)), 2, False),
        "cond": (lambda b: lax.cond(lax.psum(snp.sum(b), a) > -1e9, _psum_sin(a),
                                    lambda v: lax.psum(v * v, a), b), 1, False),
        "while": (lambda b: lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + _psum_sin(a)(b)),
            (0, snp.zeros(b.shape, b.dtype)))[1], 3, False),
    }


KINDS = list(_kinds())


def _modes(kind):
    if kind == "while":
        return ("fwd",)  # while_loop is forward-mode differentiable only
    if kind == "custom_vjp":
        return ("rev",)
    return ("fwd", "rev")


def _reference(x, k, rows):
    out = k * np.sin(x.astype(np.float64)).reshape(4, -1, x.shape[-1]).sum(0)
    return out.sum(0) if rows else out


# --------------------------------------------- results typed by their bodies (C, D)

@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_collective_in_body_values(kind, check_vma):
    body, k, rows = _kinds(check_vma)[kind]
    # Typed: the result is invariant (its body ends in a psum), so out_specs P() is accepted.
    f = sm(body, P("i"), P(), check_vma=check_vma)
    x = _x(8, 3)
    want = _reference(x, k, rows)
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_collective_in_body_grads(kind, check_vma):
    if kind == "custom_vjp" and not check_vma:
        pytest.skip("covered typed; the untyped bwd sums shares of the cotangent (as in JAX)")
    body, _, _ = _kinds(check_vma)[kind]
    f = sm(body, P("i"), P(), check_vma=check_vma)
    x = _x(8, 3)
    check_grads(f, (x,), order=2, modes=_modes(kind))
    check_grads(spmd.jit(f), (x,), order=1, modes=_modes(kind))


@pytest.mark.parametrize("kind", ["jit", "checkpoint", "custom_jvp", "scan", "cond"])
def test_varying_results_stay_varying(kind):
    # The same primitives around a ppermute: the result varies, and P() must be refused.
    bodies = {
        "jit": lambda b: spmd.jit(lambda v: lax.ppermute(v, "i", RING))(b),
        "checkpoint": lambda b: spmd.checkpoint(lambda v: lax.ppermute(v, "i", RING))(b),
        "custom_jvp": lambda b: _shifted_sin()(b),
        "scan": lambda b: lax.scan(lambda c, t: (lax.ppermute(c, "i", RING), None), b, None,
                                   length=2)[0],
        "cond": lambda b: lax.cond(True, lambda v: lax.ppermute(v, "i", RING), lambda v: v, b),
    }
    with pytest.raises(ShardMapError, match="varies along mesh axis 'i'"):
        sm(bodies[kind], P("i"), P())(_x(8, 3))


def test_printed_types_of_higher_order_results():
    def body(b):
        y = spmd.jit(_psum_sin("i"))(b)
        z = spmd.checkpoint(lambda v: v * 2.0)(b)
        return y, z

    text = str(spmd.make_jaxpr(sm(body, P("i"), (P(), P("i"))))(_x(8, 3)))
    assert "f32[2,3] = jit" in text, text  # invariant: its body ends in psum
    assert "f32[2,3]{i} = remat" in text, text


def test_jit_in_body_on_a_2d_mesh():
    def body(b):
        return spmd.jit(lambda v: lax.psum(lax.ppermute(snp.sin(v), "i", RING), "j"))(b)

    f = sm(body, P("i", "j"), P("i"), mesh=MESH)
    x = _x(8, 4)
    blocks = np.sin(x).reshape(4, 2, 2, 2)  # (i, rows, j, cols)
    want = np.roll(blocks, 1, axis=0).sum(2).reshape(8, 2)
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)
    check_grads(f, (x,), order=2)


# ------------------------------------------------ scan residuals keep their types (A)

@pytest.mark.parametrize("kind", ["fori_ppermute", "scan_ys", "fori_local", "scan_two_carries"])
def test_reverse_mode_through_loops_in_typed_bodies(kind):
    bodies = {
        "fori_ppermute": (lambda b: lax.fori_loop(
            0, 3, lambda k, c: lax.ppermute(snp.sin(c), "i", RING) * b, b), P("i")),
        "scan_ys": (lambda b: lax.scan(lambda c, t: (snp.sin(c) * t, snp.cos(c) * t), b[0], b),
                    (P("i"), P("i"))),
        "fori_local": (lambda b: lax.fori_loop(0, 2, lambda k, c: snp.sin(c) * c, b), P("i")),
        "scan_two_carries": (lambda b: lax.scan(
            lambda c, t: ((c[1], snp.sin(c[0]) * t), snp.sum(c[0])), (b[0], b[1]), b)[0],
            (P("i"), P("i"))),
    }
    body, out = bodies[kind]
    f = sm(body, P("i"), out)
    x = _x(8, 3)
    check_grads(f, (x,), order=2, modes=("rev",))
    check_grads(spmd.jit(f), (x,), order=1, modes=("rev",))


def test_scan_reverse_mode_values_against_numpy():
    # d/db sum(fori(0, 2, c -> sin(c) * b, b)) per block, by the chain rule in numpy.
    f = sm(lambda b: lax.fori_loop(0, 2, lambda k, c: snp.sin(c) * b, b), P("i"), P("i"))
    x = _x(8, 3)
    c1 = np.sin(x) * x
    # c2 = sin(c1) * x; dc1/dx = cos(x) x + sin(x); dc2/dx = cos(c1) dc1/dx x + sin(c1)
    want = np.cos(c1) * (np.cos(x) * x + np.sin(x)) * x + np.sin(c1)
    _close(spmd.grad(lambda v: snp.sum(f(v)))(x), want, 1e-4)
    _close(spmd.jit(spmd.grad(lambda v: snp.sum(f(v))))(x), want, 1e-4)


# ---------------------------------------- carries and branches whose types grow (B)

def test_fori_carry_becoming_varying():
    x = _x(8, 3)
    f = sm(lambda b: lax.fori_loop(0, 2, lambda k, c: lax.psum(c, "i") + b, snp.zeros_like(b)),
           P("i"), P("i"))
    blocks = x.reshape(4, 2, 3)
    # c1 = b; c2 = psum(b) + b
    want = (blocks.sum(0)[None] + blocks).reshape(8, 3)
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)
    check_grads(f, (x,), order=1)
    # The carry is varying: returning it replicated is refused.
    with pytest.raises(ShardMapError, match="varies along mesh axis 'i'"):
        sm(lambda b: lax.fori_loop(0, 2, lambda k, c: lax.psum(c, "i") + b,
                                   snp.zeros_like(b)), P("i"), P())(x)


def test_scan_carry_becoming_varying_through_another_carry():
    # Carry a starts invariant and becomes varying only through carry c (two rounds).
    def body(b):
        def step(carry, t):
            a, c = carry
            return (a + c, c * t), snp.sum(a)

        return lax.scan(step, (snp.zeros(3), snp.ones(3)), b)

    x = _x(8, 3)
    f = sm(body, P("i"), ((P("i"), P("i")), P("i")))
    blocks = x.reshape(4, 2, 3)
    want_a, want_c, want_ys = [], [], []
    for blk in blocks:
        a, c, ys = np.zeros(3), np.ones(3), []
        for t in blk:
            ys.append(a.sum())
            a, c = a + c, c * t
        want_a.append(a), want_c.append(c), want_ys.append(ys)
    for (a, c), ys in (f(x), spmd.jit(f)(x)):
        _close(a, np.concatenate(want_a))
        _close(c, np.concatenate(want_c))
        _close(ys, np.concatenate(want_ys))
    check_grads(lambda v: f(v)[0][0], (x,), order=2)


def test_while_carry_varying_through_the_predicate():
    # Device k runs k iterations: the carry starts invariant (a psum) and ends varying.
    def body(b):
        return lax.while_loop(lambda c: c[0] < lax.axis_index("i"),
                              lambda c: (c[0] + 1, c[1] * 2.0, c[2]),
                              (0, lax.psum(b, "i"), b))[1]

    x = _x(8, 3)
    s = x.reshape(4, 2, 3).sum(0)
    want = np.concatenate([s * 2.0 ** k for k in range(4)])
    f = sm(body, P("i"), P("i"))
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)
    check_grads(f, (x,), order=2, modes=("fwd",))
    with pytest.raises(ShardMapError, match="varies along mesh axis 'i'"):
        sm(body, P("i"), P())(x)


def test_while_predicate_becoming_varying_through_a_carry():
    # The sum carry becomes varying (it adds b), so does the predicate, so does the counter.
    def body(b):
        n, s = lax.while_loop(lambda c: c[1] < 5.0, lambda c: (c[0] + 1, c[1] + snp.sum(b)),
                              (0, 0.0))
        return n.reshape(1), s.reshape(1)

    x = np.abs(_x(8)) + 0.5
    sums = x.reshape(4, 2).sum(1)
    want_n = np.ceil(5.0 / sums)
    f = sm(body, P("i"), (P("i"), P("i")))
    for n, s in (f(x), spmd.jit(f)(x)):
        np.testing.assert_array_equal(np.asarray(n), want_n)
        _close(s, want_n * sums)


def test_cond_branches_join_their_types():
    # One branch returns an invariant value, the other a varying one: the result varies.
    def body(b):
        return lax.cond(lax.psum(snp.sum(b), "i") > 0, lambda v: lax.psum(v, "i"),
                        lambda v: v * 2.0, b)

    x = _x(8, 3)
    x = x if x.sum() > 0 else -x
    want = np.tile(x.reshape(4, 2, 3).sum(0), (4, 1))
    f = sm(body, P("i"), P("i"))
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)
    _close(f(-x), -2 * x)
    check_grads(f, (x,), order=2)
    check_grads(f, (-x,), order=2)
    with pytest.raises(ShardMapError, match="varies along mesh axis 'i'"):
        sm(body, P("i"), P())(x)
    text = str(spmd.make_jaxpr(f)(x))
    assert "pvary[axes=('i',)]" in text, text


def test_switch_on_a_varying_index_makes_results_varying():
    def body(b):
        s = lax.psum(b, "i")  # invariant operand, but each device picks its own branch
        return lax.switch(lax.axis_index("i") % 3, [lambda v: v, lambda v: 2.0 * v,
                                                    lambda v: snp.sin(v)], s)

    x = _x(8, 3)
    s = x.reshape(4, 2, 3).sum(0)
    want = np.concatenate([s, 2 * s, np.sin(s), s])
    f = sm(body, P("i"), P("i"))
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)
    check_grads(f, (x,), order=2)
    with pytest.raises(ShardMapError, match="varies along mesh axis 'i'"):
        sm(body, P("i"), P())(x)


# -------------------------------------------- collectives in bodies under named vmap (D)

def _vmap_kinds():
    b = "b"
    return {
        "jit": lambda v: spmd.jit(_psum_sin(b))(v),
        "checkpoint": lambda v: spmd.checkpoint(_psum_sin(b))(v),
        "custom_jvp": lambda v: _custom_jvp(b)(v),
        "custom_vjp": lambda v: _custom_vjp(b, True)(v),
        "cond": lambda v: lax.cond(snp.sum(v) > -1e9, _psum_sin(b), lambda u: u, v),
        "cond_batched_pred": lambda v: lax.cond(v[0] > 0, _psum_sin(b),
                                                lambda u: 2.0 * _psum_sin(b)(u), v),
        "fori": lambda v: lax.fori_loop(0, 1, lambda k, c: _psum_sin(b)(c), v),
        "while": lambda v: lax.while_loop(lambda c: c[0] < 1,
                                          lambda c: (c[0] + 1, _psum_sin(b)(c[1])), (0, v))[1],
    }


@pytest.mark.parametrize("kind", list(_vmap_kinds()))
def test_named_vmap_of_higher_order_with_collectives(kind):
    x = _x(4, 3)
    f = spmd.vmap(_vmap_kinds()[kind], axis_name="b")
    ref = np.sin(x).sum(0)
    want = np.broadcast_to(ref, x.shape)
    if kind == "cond_batched_pred":
        want = np.where(x[:, :1] > 0, ref, 2 * ref)
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)
    check_grads(f, (x,), order=2, modes=_modes(kind))


def test_vmap_of_jit_psum_sums():
    x = _x(4, 3)
    _close(spmd.vmap(spmd.jit(lambda v: lax.psum(v, "b")), axis_name="b")(x),
           np.broadcast_to(x.sum(0), x.shape))


@pytest.mark.parametrize("kind", ["jit", "checkpoint", "cond", "scan"])
@pytest.mark.parametrize("check_vma", [True, False])
def test_vmap_of_shard_map_with_collective_in_body(kind, check_vma):
    bodies = {
        "jit": lambda b: spmd.jit(_psum_sin("i"))(b),
        "checkpoint": lambda b: spmd.checkpoint(_psum_sin("i"))(b),
        "cond": lambda b: lax.cond(lax.psum(snp.sum(b), ("i", "j")) > -1e9, _psum_sin("i"),
                                   lambda v: lax.psum(v, "i"), b),
        "scan": lambda b: lax.scan(lambda c, t: (c + _psum_sin("i")(t), None),
                                   snp.zeros(b.shape[1:]), b)[0][None],
    }
    f = sm(bodies[kind], P("i", "j"), P(None, "j"), mesh=MESH, check_vma=check_vma)
    g = spmd.vmap(f)
    x = _x(3, 8, 4)
    want = np.stack([np.asarray(f(v)) for v in x])
    blocks = np.sin(x).reshape(3, 4, 2, 4)
    _close(want, blocks.sum((1, 2))[:, None] if kind == "scan" else blocks.sum(1))
    _close(g(x), want)
    _close(spmd.jit(g)(x), want)
    check_grads(g, (x,), order=1)


@pytest.mark.parametrize("check_vma", [True, False])
def test_vmap_inside_body_around_cond_with_collective(check_vma):
    f = sm(lambda b: spmd.vmap(lambda r: lax.cond(True, _psum_sin("i"),
                                                  lambda v: lax.psum(v, "i"), r))(b),
           P("i", "j"), P(None, "j"), mesh=MESH, check_vma=check_vma)
    x = _x(8, 4)
    want = np.sin(x).reshape(4, 2, 4).sum(0)
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)
    check_grads(f, (x,), order=2)


def test_nested_vmap_collective_over_both_axes_names_the_levels():
    x = _x(2, 3, 4)
    f = spmd.vmap(spmd.vmap(lambda v: lax.all_gather(v, ("a", "b")), axis_name="b"),
                  axis_name="a")
    with pytest.raises(NotImplementedError, match="different nested vmap/shard_map levels"):
        f(x)
    # Reductions may span the levels.
    g = spmd.vmap(spmd.vmap(lambda v: lax.psum(v, ("a", "b")), axis_name="b"), axis_name="a")
    _close(g(x), np.broadcast_to(x.sum((0, 1)), x.shape))


# ---------------------------------------- bodies whose operands are all replicated (E)

def test_collective_axes_of_nested_bodies():
    from spmd.compiler.transforms.batching import collective_axes

    def body(b):
        return lax.scan(lambda c, t: (lax.cond(True, lambda v: lax.ppermute(v, "i", RING),
                                               lambda v: v, c), None), b, None, length=2)[0]

    closed = spmd.make_jaxpr(sm(body, P("i"), P("i")))(_x(8, 3))
    (eqn,) = closed.eqns
    sm_body = eqn.params["program"]
    (scan_eqn,) = [e for e in sm_body.eqns if e.primitive.name == "scan"]
    assert collective_axes(scan_eqn.params) == {"i"}
    assert collective_axes({"program": sm_body}) == {"i"}
    plain = spmd.make_jaxpr(lambda v: lax.cond(True, snp.sin, snp.cos, v))(_x(3))
    (cond_eqn,) = plain.eqns
    assert collective_axes(cond_eqn.params) == frozenset()




@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("kind", ["jit", "checkpoint", "fori", "cond", "while"])
def test_collective_in_body_on_replicated_operands(kind, check_vma):
    def idx(v):
        return v * lax.axis_index("i").astype(v.dtype)

    bodies = {
        "jit": lambda b: spmd.jit(idx)(b),
        "checkpoint": lambda b: spmd.checkpoint(idx)(b),
        "fori": lambda b: lax.fori_loop(0, 1, lambda k, c: idx(c), b),
        "cond": lambda b: lax.cond(True, idx, lambda v: v, b),
        "while": lambda b: lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, idx(c[1])),
                                          (0, b))[1],
    }
    f = sm(bodies[kind], P(), P("i"), check_vma=check_vma)
    x = _x(3)
    want = np.concatenate([k * x for k in range(4)])
    _close(f(x), want)
    _close(spmd.jit(f)(x), want)


def test_second_order_reverse_mode_of_a_carry_becoming_varying():
    # The transposed loop's operands are all replicated; its body holds a psum.
    f = sm(lambda b: lax.fori_loop(0, 2, lambda k, c: snp.sin(lax.psum(c, "i")) + b,
                                   snp.zeros_like(b)), P("i"), P("i"))
    check_grads(f, (_x(8, 3),), order=2, modes=("rev",))


def test_untyped_loop_over_a_psum_result():
    # Untyped, a psum result is one unstacked value: the loop's operands are all replicated.
    body = lambda b: lax.while_loop(lambda c: c[0] < 2,  # noqa: E731
                                    lambda c: (c[0] + 1, lax.psum(snp.sin(c[1]), "i")),
                                    (0, lax.psum(b, "i")))[1]
    f = sm(body, P("i"), P(), check_vma=False)
    x = _x(8, 3)
    s = x.reshape(4, 2, 3).sum(0)
    _close(f(x), 4 * np.sin(4 * np.sin(s)))


def test_named_vmap_of_cond_over_a_closed_over_constant():
    c = _x(3)
    f = spmd.vmap(lambda v: v + lax.cond(True, lambda u: u * lax.axis_index("b"),
                                         lambda u: u, c), axis_name="b")
    x = _x(4, 3)
    _close(f(x), x + np.arange(4)[:, None] * c)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_custom_vjp_cotangent_varying_where_its_primal_is_not_is_summed(jit):
    # The bwd rule returns w's cotangent varying along "i" (each device's share) while
    # w is invariant: it is summed over "i" (JAX raises and asks for the psum).
    mesh = spmd.make_mesh((4,), ("i",))

    @spmd.custom_vjp
    def f(w, x):
        return w * x

    f.defvjp(lambda w, x: (f(w, x), (w, x)),
             lambda res, g: (snp.sum(g * res[1]), g * res[0]))

    def loss(w, x):
        return spmd.shard_map(lambda w, x: lax.psum(snp.sum(f(w, x)), "i"), mesh=mesh,
                              in_specs=(P(), P("i")), out_specs=P())(w, x)

    x = np.arange(8.0, dtype=np.float32)
    grad = spmd.grad(loss, argnums=(0, 1))
    gw, gx = (spmd.jit(grad) if jit else grad)(np.float32(2.0), x)
    assert float(gw) == float(x.sum())
    np.testing.assert_array_equal(np.asarray(gx), np.full(8, 2.0, np.float32))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_custom_vjp_cotangent_invariant_where_its_primal_varies_raises(jit):
    # JAX's own case: the bwd rule's psum makes x's cotangent invariant along "i"
    # (and 4x too large); it names the pcast that would accept it as is.
    from spmd.compiler.transforms.custom import CustomRuleVaryingError

    mesh = spmd.make_mesh((4,), ("i",))

    @spmd.custom_vjp
    def f(x):
        return lax.psum(x, "i")

    f.defvjp(lambda x: (f(x), None), lambda _, g: (lax.psum(g, "i"),))
    g = spmd.shard_map(lambda x: f(f(x)), mesh=mesh, in_specs=P("i"), out_specs=P())
    grad = spmd.value_and_grad(lambda x: g(x).sum())
    with pytest.raises(CustomRuleVaryingError, match=r"pcast\(\.\.\., \('i',\), "
                                                     r"to='varying'\)"):
        (spmd.jit(grad) if jit else grad)(np.ones(4, np.float32))

    # With the pcast the rule's value is accepted as each device's cotangent.
    f.defvjp(lambda x: (f(x), None),
             lambda _, g: (lax.pcast(g, "i", to="varying"),))
    value, gx = (spmd.jit(grad) if jit else grad)(np.arange(4, dtype=np.float32))
    assert float(value) == 24.0  # psum of the invariant psum(x) = 6: 4 * 6
    np.testing.assert_array_equal(np.asarray(gx), np.ones(4, np.float32))  # the rule's


def test_full_like_results_vary_as_their_prototype():
    # As JAX's full_like: zeros_like(x) of a varying x varies too, so that a custom
    # rule returning ones_like(ct) gives a cotangent of the primal's type.
    mesh = spmd.make_mesh((4,), ("x",))
    seen = []

    def body(x, w):
        seen.extend(spmd.typeof(f(v)).vma for v in (x, w)
                    for f in (snp.zeros_like, snp.ones_like, lambda v: snp.full_like(v, 3)))
        return x

    spmd.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))(
        np.arange(4.0, dtype=np.float32), np.float32(1))
    assert seen == [frozenset({"x"})] * 3 + [frozenset()] * 3

    @spmd.custom_vjp
    def foo(x):
        return 2.0 * x

    foo.defvjp(lambda x: (foo(x), None), lambda _, y_bar: (snp.ones_like(y_bar),))
    g = spmd.shard_map(lambda x: foo(x) * x, mesh=mesh, in_specs=(P("x"),),
                       out_specs=P("x"))
    x = np.arange(4.0, dtype=np.float32)
    value, x_bar = spmd.value_and_grad(lambda x: g(x).sum())(x)
    assert float(value) == float((2 * x * x).sum())
    np.testing.assert_array_equal(np.asarray(x_bar), np.ones(4, np.float32) + 2 * x)
