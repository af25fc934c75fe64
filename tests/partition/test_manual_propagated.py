"""A partial-manual ``shard_map`` traced inside a ``jit`` is split along its
automatic axes by the placements the partitioner propagates through the whole
program (spmd/shard/partition/manual.py ``partition_in_program``): an operand
computed before the call, or an argument of a plain ``jit``, places the body as
its sharding says.

Oracles: numpy on the global arrays (values and analytic gradients); the printed
per-device program shows the blocks the body runs on.  Every input placement is
tried: replicated, split along the automatic axis, along the manual one, along
both (either order), a dimension the automatic axis does not divide, and a
pending sum (a contraction over a split dimension)."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd import NamedSharding as NS
from spmd.shard.partition import PartitionError


@pytest.fixture(scope="module")
def mesh():
    return spmd.make_mesh((2, 4), ("x", "y"))


A = (np.arange(64, dtype=np.float32).reshape(8, 8) - 20) / 16
W = np.linspace(0.5, 2.0, 8, dtype=np.float32)
M = (np.eye(8, dtype=np.float32) + np.arange(64, dtype=np.float32).reshape(8, 8) / 64) / 2
SPECS = [P(), P("x"), P("y"), P(None, "y"), P(None, "x"), P("x", "y"), P("y", "x"),
         P(("x", "y")), P(("y", "x"))]
# The body's per-device block for an operand placed so: the manual block (4, 8) of
# rows, cut further along the automatic axis 'y' where the placement names it ('x'
# elsewhere is moved to the manual split of dimension 0).
BLOCKS = {str(P()): (4, 8), str(P("x")): (4, 8), str(P("y")): (1, 8),
          str(P(None, "y")): (4, 2), str(P(None, "x")): (4, 8), str(P("x", "y")): (4, 2),
          str(P("y", "x")): (1, 8), str(P(("x", "y"))): (1, 8), str(P(("y", "x"))): (1, 8)}


def _halves(v):
    """psum over 'x' of blocks split along dimension 0, tiled back to the global shape."""
    s = v.reshape(2, 4, *v.shape[1:]).sum(0)
    return s, np.concatenate([s, s])


def _reducing(mesh, check_vma):
    body = lambda b, w: lax.psum(snp.sin(b) * w, "x")  # noqa: E731
    return spmd.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P(),
                          axis_names={"x"}, check_vma=check_vma)


def _mapping(mesh, check_vma):
    body = lambda b, w: snp.sin(b) * w + lax.axis_index("x")  # noqa: E731
    return spmd.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"),
                          axis_names={"x"}, check_vma=check_vma)


def _oracle(kind, u):
    """(value, d loss / d u, d loss / d W) of sum(f(u, W) ** 2) for the shard_map
    ``kind``."""
    if kind == "reducing":
        s, tiled = _halves(np.sin(u) * W)
        return s, 2 * tiled * np.cos(u) * W, (2 * tiled * np.sin(u)).sum(0)
    y = np.sin(u) * W + np.repeat([0.0, 1.0], 4)[:, None]
    return y, 2 * y * np.cos(u) * W, (2 * y * np.sin(u)).sum(0)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("kind", ["reducing", "mapping"])
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_an_operand_computed_in_the_jit_places_the_body(mesh, spec, kind, check_vma):
    sm = (_reducing if kind == "reducing" else _mapping)(mesh, check_vma)
    f = lambda x, w: sm(snp.tanh(x), w)  # noqa: E731
    loss = lambda x, w: snp.sum(f(x, w) ** 2)  # noqa: E731
    t = np.tanh(A)
    want, g_u, g_w = _oracle(kind, t)
    g_x = g_u * (1 - t ** 2)
    shardings = (NS(mesh, spec), NS(mesh, P()))
    x = spmd.device_put(A, NS(mesh, spec))
    for jitted, args in ((spmd.jit(f, in_shardings=shardings), (A, W)),
                         (spmd.jit(f), (x, W))):
        np.testing.assert_allclose(np.asarray(jitted(*args)), want, rtol=1e-5, atol=1e-6)
    for grad, args in ((spmd.jit(spmd.grad(loss, (0, 1)), in_shardings=shardings), (A, W)),
                       (spmd.jit(spmd.grad(loss, (0, 1))), (x, W)),
                       (spmd.grad(loss, (0, 1)), (x, W))):
        gx, gw = grad(*args)
        np.testing.assert_allclose(np.asarray(gx), g_x, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(gw), g_w, rtol=1e-5, atol=1e-5)
    # The body runs on the blocks the propagated placement gives (manual 'x' major).
    lowered = spmd.jit(f, in_shardings=shardings).lower(A, W).as_text()
    rows, cols = BLOCKS[str(spec)]
    assert f"f32[{rows},{cols}] = sin" in lowered, lowered


def test_the_task_example_runs_on_x_y_blocks(mesh):
    sm = _mapping(mesh, True)
    f = spmd.jit(lambda x, w: sm(snp.tanh(x), w))
    lowered = spmd.jit(lambda x, w: sm(snp.tanh(x), w),
                       in_shardings=(NS(mesh, P("x", "y")), NS(mesh, P()))).lower(A, W)
    text = lowered.as_text()
    assert "a:f32[4,2]" in text and "f32[4,2] = sin" in text and lowered.bytes_sent == 0
    # A plain jit on Arrays is partitioned with their shardings (over processes it
    # runs so; in one process its results are placed so): the same split body.
    from spmd.shard.partition import partition

    traced = spmd.make_jaxpr(lambda x, w: sm(snp.tanh(x), w))(A, W)
    assert "manual=('x',)" in str(traced)  # traced whole along 'y'
    part = partition(traced, mesh, [P("x", "y"), P()], [None])
    assert "f32[4,2] = sin" in str(part.body) and part.out_specs == (P("x", "y"),)
    x = spmd.device_put(A, NS(mesh, P("x", "y")))
    y = f(x, W)
    assert y.sharding == NS(mesh, P("x", "y"))  # as the partitioner propagated it
    np.testing.assert_allclose(np.asarray(y), _oracle("mapping", np.tanh(A))[0], rtol=1e-6)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("kind", ["reducing", "mapping"])
def test_a_pending_sum_operand(mesh, kind, check_vma):
    """x @ m with the contracted dimension split along 'y': the operand is a pending
    sum over 'y' when it reaches the shard_map, resolved before the body runs."""
    sm = (_reducing if kind == "reducing" else _mapping)(mesh, check_vma)
    f = lambda x, m, w: sm(x @ m, w)  # noqa: E731
    loss = lambda x, m, w: snp.sum(f(x, m, w) ** 2)  # noqa: E731
    u = A @ M
    want, g_u, g_w = _oracle(kind, u)
    shardings = (NS(mesh, P(None, "y")), NS(mesh, P("y")), NS(mesh, P()))
    g = spmd.jit(f, in_shardings=shardings)
    assert "psum[axes=('y',)]" in g.lower(A, M, W).as_text()  # the pending sum resolved
    np.testing.assert_allclose(np.asarray(g(A, M, W)), want, rtol=1e-5, atol=1e-5)
    gx, gm, gw = spmd.jit(spmd.grad(loss, (0, 1, 2)), in_shardings=shardings)(A, M, W)
    np.testing.assert_allclose(np.asarray(gx), g_u @ M.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gm), A.T @ g_u, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gw), g_w, rtol=1e-4, atol=1e-4)


def test_a_dimension_the_automatic_axis_does_not_divide(mesh):
    """(8, 12) split along 'y' gives 3 columns per device; a manual block of 2 rows
    placed along 'y' (size 4) cannot be split so and stays whole."""
    sm = spmd.shard_map(lambda b: lax.psum(snp.cos(b), "x"), mesh=mesh, in_specs=P("x"),
                        out_specs=P(), axis_names={"x"})
    v = np.linspace(-1, 1, 8 * 12, dtype=np.float32).reshape(8, 12)
    g = spmd.jit(lambda a: sm(a * 2.0), in_shardings=NS(mesh, P(None, "y")))
    assert "f32[4,3] = cos" in g.lower(v).as_text()
    np.testing.assert_allclose(np.asarray(g(v)), _halves(np.cos(v * 2))[0], rtol=1e-6)
    # (4, 8) placed along 'y' on its rows: the manual block has 2 rows, which 'y'
    # (size 4) cannot split: the body keeps its rows whole (resharded from 'y' to 'x').
    r = np.linspace(-1, 1, 4 * 8, dtype=np.float32).reshape(4, 8)
    h = spmd.jit(lambda a: sm(a * 2.0), in_shardings=NS(mesh, P("y")))
    np.testing.assert_allclose(np.asarray(h(r)), _halves_small(np.cos(r * 2)), rtol=1e-6)
    assert "f32[2,8] = cos" in h.lower(r).as_text()


def _halves_small(v):
    return v[:2] + v[2:]


def test_an_output_feeds_the_rest_of_the_program(mesh):
    """The result's placement (manual spec merged with the propagated one) flows on."""
    sm = _mapping(mesh, True)
    g = spmd.jit(lambda x, w: snp.sum(sm(snp.tanh(x), w) * 3.0, axis=1),
                 in_shardings=(NS(mesh, P("x", "y")), NS(mesh, P())))
    want = (_oracle("mapping", np.tanh(A))[0] * 3).sum(1)
    np.testing.assert_allclose(np.asarray(g(A, W)), want, rtol=1e-5)


@pytest.mark.parametrize("spec", [P(), P(None, "c"), P("c")], ids=str)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_partial_manual_body_inside_another(spec, jit):
    """The inner body is manual along both shard_maps' axes: the outer's block along "a"
    is cut along "b" too, and each collective runs over its own axis."""
    mesh3 = spmd.make_mesh((2, 2, 2), ("a", "b", "c"))
    inner = spmd.shard_map(lambda b: lax.psum(b * 2, "b"), mesh=mesh3, in_specs=P("b"),
                           out_specs=P(), axis_names={"b"})
    outer = spmd.shard_map(lambda b: lax.psum(inner(b), "a"), mesh=mesh3, in_specs=P("a"),
                           out_specs=P(), axis_names={"a"})
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    want = 2 * x.reshape(4, 2, 4).sum(0)
    xs = spmd.device_put(x, NS(mesh3, spec))
    got = (spmd.jit(outer) if jit else outer)(xs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    grad = spmd.grad(lambda v: snp.sum(outer(v) ** 2))(xs)
    np.testing.assert_allclose(np.asarray(grad), np.tile(4 * want, (4, 1)), rtol=1e-5)


def test_inside_a_scan_and_under_vmap(mesh):
    sm = spmd.shard_map(lambda b: lax.psum(snp.sin(b), "x"), mesh=mesh, in_specs=P("x"),
                        out_specs=P(), axis_names={"x"})

    def loop(v):
        def step(c, _):
            return snp.concatenate([sm(c), sm(c)]) * 0.5, None
        return lax.scan(step, v, None, length=2)[0]

    g = spmd.jit(loop, in_shardings=NS(mesh, P(None, "y")))
    want = A
    for _ in range(2):
        want = _halves(np.sin(want))[1] * 0.5
    np.testing.assert_allclose(np.asarray(g(A)), want, rtol=1e-6)
    text = g.lower(A).as_text()
    assert "f32[4,2] = sin" in text and "bytes sent per device per call: 0" in text
    # vmap of the shard_map under a jit: the batched body is split along 'y' too.
    st = np.stack([A, A + 1])
    h = spmd.jit(spmd.vmap(lambda v: sm(snp.tanh(v))), in_shardings=NS(mesh, P(None, None, "y")))
    np.testing.assert_allclose(np.asarray(h(st)),
                               np.stack([_halves(np.sin(np.tanh(v)))[0] for v in st]),
                               rtol=1e-6)
    assert "f32[2,4,2] = sin" in h.lower(st).as_text()


def test_vmap_spmd_axis_name_must_be_manual(mesh):
    from spmd.shard.maps.shard_map import ShardMapError

    sm = spmd.shard_map(lambda b: b * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                        axis_names={"x"})
    with pytest.raises(ShardMapError, match=r"spmd_axis_name \('y',\) names 'y', which is not "
                                            r"a manual axis of this partial-manual shard_map"):
        spmd.vmap(sm, spmd_axis_name="y")(np.stack([A] * 4))


@pytest.mark.parametrize("check_vma", [True, False])
def test_a_result_left_as_a_pending_sum(mesh, check_vma):
    """The body sums over its 'y'-split dimension: its result leaves it as a pending
    sum over 'y', which the rest of the program resolves (values and gradients)."""
    sm = spmd.shard_map(lambda b: snp.sum(snp.sin(b), axis=1), mesh=mesh, in_specs=P("x"),
                        out_specs=P("x"), axis_names={"x"}, check_vma=check_vma)
    f = lambda x: snp.exp(sm(x * 1.5))  # noqa: E731
    g = spmd.jit(f, in_shardings=NS(mesh, P(None, "y")))
    text = g.lower(A).as_text()
    assert "f32[4,2] = sin" in text and "psum[axes=('y',)]" in text
    want = np.exp(np.sin(A * 1.5).sum(1))
    np.testing.assert_allclose(np.asarray(g(A)), want, rtol=1e-5)
    grad = spmd.jit(spmd.grad(lambda x: snp.sum(f(x))), in_shardings=NS(mesh, P(None, "y")))
    np.testing.assert_allclose(np.asarray(grad(A)),
                               want[:, None] * np.cos(A * 1.5) * 1.5, rtol=1e-5)
