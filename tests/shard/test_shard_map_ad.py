"""Derivatives through shard_map and collectives: finite differences, compositions with
jit/vmap/checkpoint/control flow, and the transposed programs (JEP 17111)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.test_util import check_grads
from tests.tolerance import numerical_grad

MESH = spmd.make_mesh((4, 2), ("i", "j"))
MESH4 = spmd.make_mesh((4,), ("i",))
RING = tuple((k, (k + 1) % 4) for k in range(4))
RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def sm(body, in_specs, out_specs, mesh=MESH, **kw):
    return spmd.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw)


def _close(got, want, tol=1e-4):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


# (body, in_specs, out_specs, global input shape) per collective; bodies are nonlinear
# around the collective so that second derivatives see it too.
CASES = {
    "psum": (lambda b: lax.psum(b * b, "i"), P("i", "j"), P(None, "j"), (8, 4)),
    "psum_tuple": (lambda b: lax.psum(snp.sin(b), ("j", "i")) * 2.0, P("i", "j"), P(), (8, 4)),
    "pmean": (lambda b: snp.sin(lax.pmean(snp.sin(b), ("i", "j"))), P("i", "j"), P(), (8, 4)),
    "pmax": (lambda b: lax.pmax(b * b, "i"), P("i", "j"), P(None, "j"), (8, 4)),
    "pmin": (lambda b: lax.pmin(snp.sin(b), ("j", "i")), P("i", "j"), P(), (8, 4)),
    "all_gather": (lambda b: lax.all_gather(b * b, "i", axis=1), P("i", "j"),
                   P("i", None, "j"), (8, 4)),
    "all_gather_tiled": (lambda b: lax.all_gather(snp.sin(b), ("j", "i"), axis=1, tiled=True),
                         P("i", "j"), P("i", "j"), (8, 4)),
    "psum_scatter": (lambda b: lax.psum_scatter(b * b, "j", scatter_dimension=1), P("i"),
                     P(("i", "j")), (8, 2)),
    "psum_scatter_tiled": (lambda b: lax.psum_scatter(snp.sin(b), ("i", "j"),
                                                      scatter_dimension=0, tiled=True),
                           P(None, "j"), P(("i", "j")), (16, 4)),
    "all_to_all": (lambda b: lax.all_to_all(b * b, "i", 0, 1), P(None, "j"), P("i", "j"),
                   (4, 6)),
    "all_to_all_tiled": (lambda b: lax.all_to_all(snp.sin(b), "i", 1, 0, tiled=True),
                         P("i", "j"), P("i", "j"), (8, 16)),
    "ppermute": (lambda b: lax.ppermute(b * b, "i", ((0, 1), (1, 2), (2, 0))), P("i", "j"),
                 P("i", "j"), (8, 4)),
    "ppermute_tuple": (lambda b: lax.ppermute(snp.sin(b), ("j", "i"),
                                              tuple((k, (3 * k + 1) % 8) for k in range(8))),
                       P("i", "j"), P("i", "j"), (8, 4)),
    "axis_index": (lambda b: b * b * lax.axis_index(("j", "i")).astype(b.dtype), P("i", "j"),
                   P("i", "j"), (8, 4)),
}


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_check_grads_collectives(name, check_vma):
    body, i, o, shape = CASES[name]
    if not check_vma and name in ("psum", "psum_tuple", "pmean", "pmax", "pmin"):
        o = P("i", "j")  # untyped: every axis may vary, so assemble every block
    f = sm(body, i, o, check_vma=check_vma)
    check_grads(f, (_x(*shape),), order=2, modes=("fwd", "rev"))


def test_check_grads_jitted_shard_map():
    body, i, o, shape = CASES["all_gather_tiled"]
    check_grads(spmd.jit(sm(body, i, o)), (_x(*shape),), order=2)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("in_spec,out_spec", [(P(), P()), (P(), P("i")), (P(), P(("j", "i"))),
                                              (P("i"), P(("i", "j")))])
def test_grads_of_replicated_and_tiled_values(in_spec, out_spec, check_vma):
    # Replicated inputs sum their cotangent over devices; outputs tiled along axes they do
    # not vary on sum the tiles' cotangents.
    f = sm(lambda b: snp.sin(b) * 2.0, (in_spec,), out_spec, check_vma=check_vma)
    check_grads(f, (_x(8),), order=2)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("out_spec", [P(), P("i"), P(("i", "j"))])
def test_grads_psum_outputs(out_spec, check_vma):
    f = sm(lambda b: snp.sin(lax.psum(b * b, "i")), (P("i"),), out_spec, check_vma=check_vma)
    check_grads(f, (_x(8),), order=2)
    g = sm(lambda b: snp.sin(lax.psum(b, "i")) * b, (P("i"),), P(("i", "j")),
           check_vma=check_vma)
    check_grads(g, (_x(8),), order=2)


def test_two_inputs_mixed_specs():
    def body(w, b):
        return lax.psum(snp.tanh(b @ w), "i"), lax.all_gather(w * b[0, :, None], "j")

    f = sm(body, (P(None, "j"), P("i")), (P(None, "j"), P("j", None, "i")))
    check_grads(f, (_x(3, 4), _x(8, 3)), order=2)


# ------------------------------------------------------------ compositions

def _loss_body(w, b):
    return lax.pmean(snp.sum(snp.tanh(b @ w) ** 2), ("i", "j"))


def _loss_ref(w, x):
    return np.mean([np.sum(np.tanh(x[k:k + 1] @ w) ** 2) for k in range(8)])


W, XS = _x(4, 3), _x(8, 4)
LOSS = sm(_loss_body, (P(), P(("i", "j"))), P())


G_REF = numerical_grad(lambda w: _loss_ref(w, XS.astype(np.float64)), W, 1e-3)


def test_grad_of_shard_map():
    _close(LOSS(W, XS), _loss_ref(W, XS), 1e-5)
    _close(spmd.grad(LOSS)(W, XS), G_REF)


def test_jit_grad_and_grad_jit():
    _close(spmd.jit(spmd.grad(LOSS))(W, XS), G_REF)
    _close(spmd.grad(spmd.jit(LOSS))(W, XS), G_REF)
    _close(spmd.jit(spmd.grad(spmd.jit(LOSS)))(W, XS), G_REF)


def test_value_and_grad_two_args():
    v, (gw, gx) = spmd.value_and_grad(LOSS, argnums=(0, 1))(W, XS)
    _close(v, _loss_ref(W, XS), 1e-5)
    _close(gw, G_REF)
    gx_ref = numerical_grad(lambda x: _loss_ref(W.astype(np.float64), x), XS, 1e-3)
    _close(gx, gx_ref)


def test_shard_map_of_grad():
    # Inside the body w is invariant: its gradient is the psum of every device's (JEP 17111),
    # so the pmean of it is the sum of the per-example gradients.
    def body(w, b):
        gw = spmd.grad(lambda w: snp.sum(snp.tanh(b @ w) ** 2))(w)
        return lax.pmean(gw, ("i", "j"))

    f = sm(body, (P(), P(("i", "j"))), P())
    _close(f(W, XS), 8 * G_REF)
    _close(spmd.jit(f)(W, XS), 8 * G_REF)


def test_shard_map_of_grad_of_local_loss():
    # Differentiating the device-local part only, then averaging explicitly.
    def body(w, b):
        gw = spmd.grad(lambda w: snp.sum(snp.tanh(b @ lax.pvary(w, ("i", "j"))) ** 2))(w)
        return gw / 8.0

    f = sm(body, (P(), P(("i", "j"))), P())
    _close(f(W, XS), G_REF)


def test_vmap_of_shard_map():
    ws = np.stack([W, 2 * W, -W])
    got = spmd.vmap(LOSS, in_axes=(0, None))(ws, XS)
    _close(got, [_loss_ref(w, XS) for w in ws], 1e-5)
    gots = spmd.vmap(spmd.grad(LOSS), in_axes=(0, None))(ws, XS)
    _close(gots[0], G_REF)
    xs = np.stack([XS, XS[::-1]])
    _close(spmd.vmap(LOSS, in_axes=(None, 0))(W, xs), [_loss_ref(W, x) for x in xs], 1e-5)
    _close(spmd.jit(spmd.vmap(LOSS, in_axes=(None, 0)))(W, xs),
           [_loss_ref(W, x) for x in xs], 1e-5)


def test_vmap_of_shard_map_with_collectives():
    f = sm(lambda b: lax.all_gather(lax.ppermute(b, "i", RING), "j", tiled=True), P("i", "j"),
           P("i", "j"))
    xs = _x(3, 8, 4)
    want = np.stack([np.asarray(f(x)) for x in xs])
    _close(spmd.vmap(f)(xs), want, 1e-6)
    _close(spmd.vmap(f, in_axes=1, out_axes=1)(xs.transpose(1, 0, 2)),
           want.transpose(1, 0, 2), 1e-6)


def test_shard_map_of_vmap():
    ws = np.stack([W, 2 * W])
    f = sm(spmd.vmap(_loss_body, in_axes=(0, None)), (P(), P(("i", "j"))), P())
    _close(f(ws, XS), [_loss_ref(w, XS) for w in ws], 1e-5)
    g = spmd.grad(lambda ws: snp.sum(f(ws, XS)))(ws)
    _close(g[0], G_REF)
    _close(g[1], numerical_grad(lambda w: _loss_ref(w, XS.astype(np.float64)), 2 * W, 1e-3))


def test_vmap_grad_with_named_axis():
    # Per-example gradient under vmap(axis_name): a collective-free body, and a global
    # reduction through the named axis differentiated from outside.
    x = _x(4, 3)
    f = spmd.vmap(spmd.grad(lambda v: snp.sum(snp.sin(v)) *
                            lax.axis_index("b").astype(snp.float32)), axis_name="b")
    _close(f(x), np.cos(x) * np.arange(4)[:, None])
    g = spmd.grad(lambda x: snp.sum(spmd.vmap(lambda v: v * lax.psum(v, "b"),
                                              axis_name="b")(x)))
    _close(g(x), np.broadcast_to(2 * x.sum(0), x.shape))


def test_nested_grad():
    # grad of grad through shard_map with a collective.
    f = sm(lambda b: lax.psum(snp.sum(snp.sin(b) ** 3), ("i", "j")), P("i", "j"), P())
    x = _x(8, 4)
    g2 = spmd.grad(lambda x: snp.sum(spmd.grad(f)(x) ** 2))(x)
    d = np.cos(x) * 3 * np.sin(x) ** 2
    dd = -np.sin(x) * 3 * np.sin(x) ** 2 + np.cos(x) * 6 * np.sin(x) * np.cos(x)
    _close(g2, 2 * d * dd)


def test_jvp_and_linearize():
    t = _x(4, 3)
    y, dy = spmd.jvp(lambda w: LOSS(w, XS), (W,), (t,))
    _close(y, _loss_ref(W, XS), 1e-5)
    _close(dy, np.sum(G_REF * t))
    y2, lin = spmd.linearize(lambda w: LOSS(w, XS), W)
    _close(y2, y, 1e-6)
    _close(lin(t), dy)
    _close(lin(2 * t), 2 * np.asarray(dy))


def test_checkpoint_in_body_without_collectives():
    f = sm(spmd.checkpoint(lambda b: snp.sin(snp.sin(b))), P("i", "j"), P("i", "j"))
    check_grads(f, (_x(8, 4),), order=2)
    g = sm(lambda b: lax.psum(spmd.checkpoint(lambda v: snp.sin(v) ** 2)(b), "i"),
           P("i", "j"), P(None, "j"))
    check_grads(g, (_x(8, 4),), order=1)


@pytest.mark.parametrize("check_vma", [True, False])
def test_checkpoint_around_collective(check_vma):
    f = sm(spmd.checkpoint(lambda b: lax.ppermute(snp.sin(snp.sin(b)), "i", RING)),
           P("i", "j"), P("i", "j"), check_vma=check_vma)
    check_grads(f, (_x(8, 4),), order=1)


def _loop_bodies():
    return {
        "fori": lambda b: lax.fori_loop(0, 3, lambda k, c: lax.ppermute(snp.sin(c), "i", RING),
                                        b),
        "scan": lambda b: lax.scan(lambda c, t: (lax.ppermute(snp.sin(c) * t, "i", RING),
                                                 snp.sum(c)), b[0], b)[0],
        "cond": lambda b: lax.cond(lax.psum(snp.sum(b), ("i", "j")) > 0.0,
                                   lambda v: lax.ppermute(snp.sin(v), "i", RING),
                                   lambda v: v * v, b),
        "while_fwd": lambda b: lax.while_loop(
            lambda c: c[0] < 2, lambda c: (c[0] + 1, lax.ppermute(snp.sin(c[1]), "i", RING)),
            (0, b))[1],
    }


@pytest.mark.parametrize("kind", ["fori", "scan", "cond", "while_fwd"])
def test_control_flow_with_ppermute_untyped(kind):
    # The cond predicate is the same on every device (a psum).
    body = _loop_bodies()[kind]
    f = sm(body, P("i", "j"), P(("i", "j")) if kind == "scan" else P("i", "j"), check_vma=False)
    modes = ("fwd",) if kind == "while_fwd" else ("fwd", "rev")
    check_grads(f, (_x(8, 4),), order=2 if kind == "fori" else 1, modes=modes)


@pytest.mark.parametrize("kind", ["cond", "while_fwd"])
def test_control_flow_with_ppermute_typed(kind):
    body = _loop_bodies()[kind]
    f = sm(body, P("i", "j"), P("i", "j"))
    modes = ("fwd",) if kind == "while_fwd" else ("fwd", "rev")
    check_grads(f, (_x(8, 4),), order=2 if kind == "cond" else 1, modes=modes)


@pytest.mark.parametrize("kind", ["fori", "scan", "fori_no_collective"])
def test_control_flow_grads_typed(kind):
    bodies = dict(_loop_bodies(), fori_no_collective=lambda b: lax.fori_loop(
        0, 2, lambda k, c: snp.sin(c), b))
    f = sm(bodies[kind], P("i", "j"), P(("i", "j")) if kind == "scan" else P("i", "j"))
    check_grads(f, (_x(8, 4),), order=1, modes=("rev",))


def test_cond_on_device_index_without_collectives():
    f = sm(lambda b: lax.cond(lax.axis_index("i") % 2 == 0, snp.sin, lambda v: v * v, b),
           P("i", "j"), P("i", "j"))
    check_grads(f, (_x(8, 4),), order=2)


# ------------------------------------------------------------ transposed programs

def _vjp_text(f, x):
    def g(x):
        y, pull = spmd.vjp(f, x)
        return pull(y)

    return str(spmd.make_jaxpr(g)(x))


def _eqns(text, name):
    return re.findall(rf"= {name}\[([^\]]*)\]", text)


def test_transpose_all_gather_is_psum_scatter():
    text = _vjp_text(sm(lambda b: lax.all_gather(b, "i", axis=1, tiled=True), P("i", "j"),
                        P("i", "j")), _x(8, 8))
    assert _eqns(text, "psum_scatter") == [
        "axes=('i',), scatter_dimension=1, tiled=True, axis_size=4"], text
    text = _vjp_text(sm(lambda b: lax.all_gather(b, ("j", "i"), axis=0), P("i", "j"),
                        P(None, "i", "j")), _x(8, 8))
    assert _eqns(text, "psum_scatter") == [
        "axes=('j', 'i'), scatter_dimension=0, tiled=False, axis_size=8"], text


def test_transpose_psum_scatter_is_all_gather():
    text = _vjp_text(sm(lambda b: lax.psum_scatter(b, "j", scatter_dimension=1, tiled=True),
                        P("i", "j"), P("i", "j")), _x(8, 4))
    assert _eqns(text, "all_gather") == ["axes=('j',), axis=1, tiled=True, axis_size=2"], text
    assert not _eqns(text, "psum")


def test_transpose_ppermute_is_inverse():
    perm = ((0, 1), (1, 3), (3, 2), (2, 0))
    text = _vjp_text(sm(lambda b: lax.ppermute(b, "i", perm), P("i"), P("i")), _x(8))
    fwd, bwd = _eqns(text, "ppermute")
    assert fwd == f"axes=('i',), perm={perm}"
    assert bwd == f"axes=('i',), perm={tuple((d, s) for s, d in perm)}", text


def test_transpose_all_to_all_swaps_axes():
    text = _vjp_text(sm(lambda b: lax.all_to_all(b, "i", 0, 1, tiled=True), P("i", "j"),
                        P("i", "j")), _x(16, 8))
    fwd, bwd = _eqns(text, "all_to_all")
    assert fwd == "axes=('i',), split_axis=0, concat_axis=1, axis_size=4"
    assert bwd == "axes=('i',), split_axis=1, concat_axis=0, axis_size=4", text


def test_transpose_psum_is_pvary():
    text = _vjp_text(sm(lambda b: lax.psum(b, "i"), P("i"), P()), _x(8))
    assert len(_eqns(text, "psum")) == 1 and "pvary[axes=('i',)]" in text, text


def test_data_parallel_grad_has_one_all_reduce_per_parameter():
    def body(w1, w2, b):
        return lax.pmean(snp.sum(snp.tanh(b @ w1) @ w2), ("i", "j"))

    loss = sm(body, (P(), P(), P(("i", "j"))), P())
    text = str(spmd.make_jaxpr(spmd.grad(loss, argnums=(0, 1)))(_x(4, 3), _x(3, 2), _x(8, 4)))
    sums = _eqns(text, "psum")
    assert sums == ["axes=('i', 'j')"] * 2, text  # one per parameter, none on the loss ct


def test_double_transpose_of_identity_adds_no_communication():
    f = sm(lambda b: b, P(), P())

    def twice(x):
        ct = spmd.vjp(f, x)[1](x)[0]
        return spmd.vjp(lambda c: spmd.vjp(f, c)[1](x)[0], ct)[1](ct)[0]

    text = str(spmd.make_jaxpr(twice)(_x(3)))
    for name in ("psum", "all_gather", "psum_scatter", "ppermute", "all_to_all"):
        assert not _eqns(text, name), text
    _close(twice(_x(3)), twice(_x(3)))


def test_tiled_output_cotangent_is_summed():
    # y = psum(x) is invariant, tiled by out_specs P('i'): the cotangent sums the tiles.
    f = sm(lambda b: lax.psum(b, "i"), P("i"), P("i"), mesh=MESH4)
    x, ct = _x(8), _x(8)
    got = spmd.vjp(f, x)[1](ct)[0]
    _close(got, np.tile(ct.reshape(4, 2).sum(0), 4))
