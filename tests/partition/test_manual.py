"""Partial-manual ``shard_map(axis_names={...})``: the body is manual over the named
axes and the partitioner splits it along the others (spmd/shard/partition/manual.py).

Oracles: numpy on the global arrays; the per-device blocks (shapes of the result's
shards, of the printed per-device programs) prove the split along the automatic
axis."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd import NamedSharding as NS
from spmd.collectives.primitives import CollectiveAxisError
from spmd.shard.partition import PartitionError
from spmd.shard.partition.manual import merge_specs


@pytest.fixture(scope="module")
def mesh():
    return spmd.make_mesh((2, 4), ("x", "y"))


A = (np.arange(64, dtype=np.float32).reshape(8, 8) - 20) / 16
W = np.linspace(0.5, 2.0, 8, dtype=np.float32)


def _partial_manual(body, mesh, in_specs, out_specs, check_vma=True):
    return spmd.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                          axis_names={"x"}, check_vma=check_vma)


def _shapes(arr):
    return {s.data.shape for s in arr.addressable_shards}


def _sum_over_x(v):
    """psum over 'x' of the blocks split along dimension 0, on the global value."""
    return v.reshape(2, 4, *v.shape[1:]).sum(0)


def test_merge_specs():
    assert merge_specs(P("x"), P(None, "y"), 2) == P("x", "y")
    assert merge_specs(P("x"), P("y"), 2) == P(("x", "y"))
    assert merge_specs(P(), P(), 3) == P()
    assert merge_specs(P(None, "x"), P("y"), 2) == P("y", "x")


def test_an_argument_sharded_along_the_automatic_axis_splits_the_body(mesh):
    traced = []

    def body(b):
        traced.append(b.shape)  # the body is written on blocks along 'x' only
        return lax.psum(snp.sin(b) * 2.0, "x")

    f = _partial_manual(body, mesh, P("x"), P())
    x = spmd.device_put(A, NS(mesh, P("x", "y")))
    y = f(x)
    np.testing.assert_allclose(np.asarray(y), _sum_over_x(np.sin(A) * 2), rtol=1e-6)
    assert traced == [(4, 8)]
    # Each device computed its (4, 8/4) block: the result stays split along 'y'.
    assert y.sharding == NS(mesh, P(None, "y"))
    assert _shapes(y) == {(4, 2)}
    # Replicated along 'y' (a numpy argument, nothing asks for a split): whole blocks.
    z = f(A)
    np.testing.assert_allclose(np.asarray(z), np.asarray(y), rtol=1e-6)
    assert z.sharding == NS(mesh, P())


def test_jit_with_shardings_prints_the_split_per_device_program(mesh):
    f = _partial_manual(lambda b: lax.psum(snp.sin(b), "x"), mesh, P("x"), P())
    g = spmd.jit(f, in_shardings=NS(mesh, P("x", "y")))
    lowered = g.lower(A)
    text = lowered.as_text()
    # One (8/2, 8/4) block per device, the body's psum over 'x' only; nothing gathered.
    assert "a:f32[4,2]" in text and "psum[axes=('x',)]" in text
    assert lowered.bytes_sent == 0 and "all_gather" not in text
    y = g(A)
    assert y.sharding == NS(mesh, P(None, "y"))
    np.testing.assert_allclose(np.asarray(y), _sum_over_x(np.sin(A)), rtol=1e-6)


def test_a_constraint_in_the_body_splits_it(mesh):
    def body(b):
        b = lax.with_sharding_constraint(b, NS(mesh, P(None, "y")))
        return snp.tanh(b) + lax.axis_index("x")

    f = _partial_manual(body, mesh, P("x"), P("x"))
    # Traced, the body stays whole along 'y' (as JAX's jaxpr shows it); the
    # partitioner splits it: the per-device block along both axes.
    prog = str(spmd.make_jaxpr(f)(A))
    assert "f32[4,8]{x} = tanh" in prog and "manual=('x',)" in prog
    text = spmd.jit(f, in_shardings=NS(mesh, P())).lower(A).as_text()
    assert "f32[4,2] = tanh" in text
    y = f(A)
    assert y.sharding == NS(mesh, P("x", "y")) and _shapes(y) == {(4, 2)}
    want = np.tanh(A) + np.repeat([0.0, 1.0], 4)[:, None]
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(A)), want, rtol=1e-6)


@pytest.mark.parametrize("jitted", [False, True])
def test_gradients_match_numpy(mesh, jitted):
    def body(b, w):
        return snp.sin(b) * w

    f = _partial_manual(body, mesh, (P("x"), P()), P("x"))
    x = spmd.device_put(A, NS(mesh, P("x", "y")))
    loss = lambda b, w: snp.sum(f(b, w) ** 2)  # noqa: E731
    grad = spmd.grad(loss, argnums=(0, 1))
    if jitted:
        grad = spmd.jit(grad)
    gb, gw = grad(x, W)
    np.testing.assert_allclose(np.asarray(gb), 2 * np.sin(A) * np.cos(A) * W ** 2, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gw), (2 * np.sin(A) ** 2 * W).sum(0), rtol=1e-5)


def test_gradient_through_a_psum_with_the_argument_split_along_y(mesh):
    f = _partial_manual(lambda b: lax.psum(b * b, "x"), mesh, P("x"), P())
    x = spmd.device_put(A, NS(mesh, P(None, "y")))
    g = spmd.grad(lambda v: snp.sum(f(v) * _sum_over_x(A)))(x)
    np.testing.assert_allclose(np.asarray(g), 2 * A * np.tile(_sum_over_x(A), (2, 1)),
                               rtol=1e-5)


def test_collectives_over_the_manual_axis(mesh):
    x = spmd.device_put(A, NS(mesh, P("x", "y")))

    def body(b):
        gathered = lax.all_gather(b, "x", axis=0, tiled=True)        # (8, 8)
        stacked = lax.all_gather(b, "x", axis=1)                     # (4, 2, 8)
        scattered = lax.psum_scatter(b, "x", scatter_dimension=1, tiled=True)  # (4, 4)
        shifted = lax.ppermute(b, "x", perm=[(0, 1), (1, 0)])
        swapped = lax.all_to_all(b, "x", split_axis=1, concat_axis=0, tiled=True)  # (8, 4)
        top = lax.pmax(snp.sum(b, 1), "x")                           # (4,)
        return gathered, stacked, scattered, shifted, swapped, top

    # The gathered outputs are the same on both 'x' devices, which the varying-axes
    # types do not know: untyped.
    f = _partial_manual(body, mesh, P("x"), (P(), P(), P("x"), P("x"), P("x"), P()),
                        check_vma=False)
    got = [np.asarray(o) for o in f(x)]
    blocks = [A[:4], A[4:]]
    np.testing.assert_allclose(got[0], A)
    np.testing.assert_allclose(got[1], np.stack(blocks, axis=1))
    total = blocks[0] + blocks[1]
    np.testing.assert_allclose(got[2], np.concatenate([total[:, :4], total[:, 4:]]))
    np.testing.assert_allclose(got[3], np.concatenate(blocks[::-1]))
    want = np.concatenate([np.concatenate([blk[:, 4 * i:4 * i + 4] for blk in blocks])
                           for i in range(2)])
    np.testing.assert_allclose(got[4], want)
    np.testing.assert_allclose(got[5], np.maximum(blocks[0].sum(1), blocks[1].sum(1)),
                               rtol=1e-6)


def test_errors(mesh):
    with pytest.raises(CollectiveAxisError, match=r"psum over mesh axis 'y', which is "
                                                  r"automatic in this partial-manual shard_map "
                                                  r"\(axis_names=\['x'\]\).*add 'y' to "
                                                  "axis_names"):
        _partial_manual(lambda b: lax.psum(b, "y"), mesh, P("x"), P("x"))(A)
    with pytest.raises(CollectiveAxisError, match=r"axis_index over mesh axis 'y'"):
        _partial_manual(lambda b: b + lax.axis_index("y"), mesh, P("x"), P("x"))(A)

    def constrained(b):
        return lax.with_sharding_constraint(b, NS(mesh, P("x")))

    manual = r"spec PartitionSpec\('x'\) names mesh axis 'x', which is manual here"
    with pytest.raises(PartitionError, match=manual):
        _partial_manual(constrained, mesh, P("x"), P("x"))(A)
    with pytest.raises(PartitionError, match=manual):  # under jit too
        spmd.jit(_partial_manual(constrained, mesh, P("x"), P("x")))(A)
    # In a full-manual body every axis is manual: the constraint is refused, not ignored.
    both = spmd.shard_map(lambda b: lax.with_sharding_constraint(b, NS(mesh, P("x", "y"))),
                          mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))
    full = r"spec PartitionSpec\('x', 'y'\) names mesh axis 'x', which is manual here"
    with pytest.raises(PartitionError, match=full):
        both(A)
    with pytest.raises(PartitionError, match=full):
        spmd.jit(both)(A)
    # The automatic axes stay free to name.
    auto = _partial_manual(lambda b: lax.with_sharding_constraint(b, NS(mesh, P(None, "y"))),
                           mesh, P("x"), P("x"))
    np.testing.assert_array_equal(np.asarray(auto(A)), A)


@pytest.mark.parametrize("check_vma", [True, False])
def test_control_flow_and_transformations_in_and_around_the_body(mesh, check_vma):
    x = spmd.device_put(A, NS(mesh, P("x", "y")))

    def body(b):
        def step(c, _):
            return lax.psum(snp.tanh(c), "x") * 0.5, snp.sum(c)
        return lax.scan(step, b, None, length=3)

    # (The typed carry becomes varying along 'x' in the loop: out_specs name 'x'.)
    c, ys = _partial_manual(body, mesh, P("x"), (P("x"), P("x")), check_vma)(x)
    blocks, want_ys = [A[:4], A[4:]], []
    for _ in range(3):
        want_ys.append([blk.sum() for blk in blocks])
        blocks = [(np.tanh(blocks[0]) + np.tanh(blocks[1])) * 0.5] * 2
    assert _shapes(c) == {(4, 2)}  # the loop ran on (4, 2) blocks
    np.testing.assert_allclose(np.asarray(c), np.concatenate(blocks), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ys), np.array(want_ys).T.reshape(-1), rtol=1e-5)
    # vmap and jvp of a partial-manual shard_map.
    g = _partial_manual(lambda b: lax.psum(b * 2, "x"), mesh, P("x"), P())
    stacked = np.stack([A, A + 1])
    np.testing.assert_allclose(np.asarray(spmd.vmap(g)(stacked)),
                               np.stack([_sum_over_x(v * 2) for v in stacked]), rtol=1e-6)
    _, t = spmd.jvp(g, (x,), (np.ones_like(A),))
    np.testing.assert_allclose(np.asarray(t), np.full((4, 8), 4.0))


def test_three_axes_manual_in_the_middle():
    mesh = spmd.make_mesh((2, 2, 2), ("a", "b", "c"))
    v = np.arange(64, dtype=np.float32).reshape(4, 16) / 8

    def body(blk):  # a (4, 8) block along 'b'; 'a' and 'c' automatic
        return lax.psum(snp.exp(-blk), "b") + lax.axis_index("b")

    f = spmd.shard_map(body, mesh=mesh, in_specs=P(None, "b"), out_specs=P(None, "b"),
                       axis_names={"b"}, check_vma=False)
    x = spmd.device_put(v, NS(mesh, P("a", ("b", "c"))))
    y = f(x)
    assert y.sharding == NS(mesh, P("a", ("b", "c")))
    assert _shapes(y) == {(2, 4)}  # 4/2 rows ('a'), 16/(2*2) columns ('b', 'c')
    halves = np.exp(-v[:, :8]) + np.exp(-v[:, 8:])
    np.testing.assert_allclose(np.asarray(y), np.concatenate([halves, halves + 1], 1),
                               rtol=1e-6)
    # An argument split the other way round along dimension 1 ('c' major) is moved to
    # the manual-major split: the same values.
    z = f(spmd.device_put(v, NS(mesh, P("a", ("c", "b")))))
    np.testing.assert_allclose(np.asarray(z), np.asarray(y), rtol=1e-6)
