"""Explicit sharding across processes: a typed program (elementwise, a contraction with
out_sharding=, a reduction, reshard, a gradient, auto_axes over one axis, a shard_map
manual over one axis) on a mesh spread over the ranks, each
rank holding only its blocks; values against numpy on the global arrays (read back
with spmd.process_allgather), shardings as the types say.  On 2 and on 4 ranks."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.errors import ShardingTypeError
from spmd.sharding import AxisType, NamedSharding, P, auto_axes, reshard

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _run_typed_program():
    n = spmd.device_count()
    mesh = spmd.make_mesh((n // 2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    rng = np.random.default_rng(0)
    xn = rng.normal(size=(4 * n, 8)).astype(np.float32)
    w1n = rng.normal(size=(8, 6)).astype(np.float32)
    w2n = rng.normal(size=(6, 4)).astype(np.float32)
    x = spmd.device_put(xn, NamedSharding(mesh, P("x", None)))
    w1 = spmd.device_put(w1n, NamedSharding(mesh, P(None, "y")))
    w2 = spmd.device_put(w2n, NamedSharding(mesh, P("y", None)))
    assert not x.is_fully_addressable

    def loss(params, xb):
        a, b = params
        h = snp.tanh(xb @ a)                            # (x, y)
        y = snp.dot(h, b, out_sharding=P("x", None))    # partial sums over y reduced
        return (y ** 2).mean()

    @spmd.jit
    def step(params, xb):
        h = snp.tanh(xb @ params[0])
        moved = reshard(h, P(None, "x"))
        # 'y' automatic inside: the flattened rows stay split over 'x'.
        flat = auto_axes(lambda v: v.reshape(-1), axes="y", out_sharding=P("x"))(h)
        # Manual over 'x' only: the body's values stay typed along 'y'.
        twice = spmd.shard_map(lambda v: v * 2, mesh=mesh, out_specs=P("x"),
                               axis_names={"x"})(h)
        return (loss(params, xb), spmd.grad(loss)(params, xb), h.sum(axis=0), moved, flat,
                twice)

    value, (g1, g2), s, moved, flat, twice = step((w1, w2), x)
    h = np.tanh(xn.astype(np.float64) @ w1n)
    y = h @ w2n
    dy = 2 * y / y.size
    got = lambda v: np.asarray(spmd.process_allgather(v))  # noqa: E731
    np.testing.assert_allclose(float(got(value)), (y ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(got(g2), h.T @ dy, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got(g1), xn.T @ ((dy @ w2n.T) * (1 - h ** 2)), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(got(s), h.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got(moved), h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got(flat), h.reshape(-1), rtol=1e-6, atol=1e-6)
    assert tuple(flat.sharding.spec) == ("x",)
    np.testing.assert_allclose(got(twice), 2 * h, rtol=1e-6, atol=1e-6)
    assert tuple(twice.sharding.spec) == ("x", "y")
    assert {sh.data.shape for sh in twice.addressable_shards} == {(4 * n // (n // 2), 3)}
    assert g1.sharding.spec == P(None, "y") and tuple(g2.sharding.spec) in (("y",), ("y", None))
    assert tuple(s.sharding.spec) == ("y",) and tuple(moved.sharding.spec) == (None, "x")
    # Each rank holds its blocks of the moved array only.
    assert {sh.data.shape for sh in moved.addressable_shards} == {(4 * n, 6 // (n // 2))}
    # The ambiguity error is raised on every rank alike (nothing runs, nothing hangs).
    with pytest.raises(ShardingTypeError, match="Contracting dimensions are sharded"):
        spmd.jit(lambda a, b: snp.tanh(a @ w1) @ b)(x, w2)
    # Eager operations on the ranks' blocks keep their types.
    e = snp.sin(x) * 2
    assert tuple(e.sharding.spec) in (("x",), ("x", None))
    np.testing.assert_allclose(got(e), np.sin(xn) * 2, rtol=1e-6)


@pytest.mark.spmd(processes=2)
def test_a_typed_program_on_two_ranks():
    assert spmd.process_count() == 2
    _run_typed_program()


def test_a_typed_program_on_four_ranks():
    assert spmd.process_count() == 4
    _run_typed_program()


def test_a_mixed_mesh_over_four_ranks():
    # 'x' explicit, 'y' automatic: types name 'x' only, the contraction over 'y' is the
    # partitioner's (a psum), and a gradient takes its parameter's type.
    n = spmd.device_count()
    mesh = spmd.make_mesh((n // 2, 2), ("x", "y"), axis_types=(AxisType.Explicit,
                                                               AxisType.Auto))
    rng = np.random.default_rng(1)
    an, wn = rng.normal(size=(2 * n, 8)).astype(np.float32), \
        rng.normal(size=(8, 6)).astype(np.float32)
    a = spmd.device_put(an, NamedSharding(mesh, P("x", "y")))
    w = spmd.device_put(wn, NamedSharding(mesh, P("y", None)))
    seen = []

    def loss(w, a):
        y = snp.tanh(a @ w)
        seen.append(str(spmd.typeof(y)))
        return (y ** 2).mean()

    value, g = spmd.jit(spmd.value_and_grad(loss))(w, a)
    assert seen[-1] == f"f32[{2 * n}@x,6]"
    h = np.tanh(an.astype(np.float64) @ wn)
    np.testing.assert_allclose(float(np.asarray(value)), (h ** 2).mean(), rtol=1e-5)
    want = an.T @ (2 * h / h.size * (1 - h ** 2))
    np.testing.assert_allclose(np.asarray(spmd.process_allgather(g)), want, rtol=1e-4,
                               atol=1e-6)
