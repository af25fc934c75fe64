"""Reduced and unreduced values across processes: FSDP's gather to='reduced' with its
gradient reduce-scattered, a reduced input whose gradient is an unreduced Array, and a
contraction left unreduced then summed in a shard_map; on a mesh spread over the ranks,
values against numpy on the global arrays (read back with spmd.process_allgather).
On 2 and on 4 ranks."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.sharding import AxisType, NamedSharding, P, reshard

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def _run():
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("x",), axis_types=(AxisType.Explicit,))
    rng = np.random.default_rng(0)
    xn = rng.normal(size=(2 * n, n)).astype(np.float32)
    wn = rng.normal(size=(n, 5)).astype(np.float32)
    got = lambda v: np.asarray(spmd.process_allgather(v))  # noqa: E731

    @spmd.shard_map(mesh=mesh, in_specs=P("x", None), out_specs=P(None, None, reduced={"x"}))
    def gather(w_block):
        return lax.all_gather(w_block, "x", tiled=True, to="reduced")

    def loss(x, w):
        return snp.sum(snp.sin(snp.matmul(x, gather(w))))

    x = spmd.device_put(xn, NamedSharding(mesh, P("x", None)))
    w = spmd.device_put(wn, NamedSharding(mesh, P("x", None)))
    assert not w.is_fully_addressable
    gw = spmd.jit(spmd.grad(loss, argnums=1))(x, w)
    assert gw.sharding == NamedSharding(mesh, P("x", None))
    np.testing.assert_allclose(got(gw), xn.T @ np.cos(xn @ wn), rtol=1e-4, atol=1e-5)

    # A reduced input: its gradient leaves as an unreduced Array (the sum is the value).
    @spmd.shard_map(mesh=mesh, in_specs=P(None, reduced={"x"}), out_specs=P("x"))
    def tile(v):
        return lax.pcast(v, "x", to="varying") * 2.0

    vn = np.arange(4.0, dtype=np.float32)
    v = spmd.device_put(vn, NamedSharding(mesh, P(None, reduced={"x"})))
    gv = spmd.jit(spmd.grad(lambda a: snp.sum(tile(a) ** 2)))(v)
    assert gv.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    np.testing.assert_allclose(got(reshard(gv, P())), 8.0 * n * vn, rtol=1e-6)

    # A contraction over the split dimension left unreduced, then summed in a body.
    @spmd.shard_map(mesh=mesh, in_specs=P(unreduced={"x"}), out_specs=P())
    def total(z):
        return lax.psum(z, "x")

    an = rng.normal(size=(3, 2 * n)).astype(np.float32)
    bn = rng.normal(size=(2 * n, 4)).astype(np.float32)
    a = spmd.device_put(an, NamedSharding(mesh, P(None, "x")))
    b = spmd.device_put(bn, NamedSharding(mesh, P("x", None)))

    @spmd.jit
    def f(a, b):
        return total(snp.einsum("ij,jk->ik", a, b, out_sharding=P(unreduced={"x"})))

    np.testing.assert_allclose(got(f(a, b)), an @ bn, rtol=1e-5, atol=1e-5)
    ga = spmd.jit(spmd.grad(lambda a, b: snp.sum(f(a, b)), argnums=0))(a, b)
    np.testing.assert_allclose(got(ga), np.ones((3, 4)) @ bn.T, rtol=1e-5, atol=1e-5)


@pytest.mark.spmd(processes=2)
def test_unreduced_and_reduced_on_two_ranks():
    assert spmd.process_count() == 2
    _run()


def test_unreduced_and_reduced_on_four_ranks():
    assert spmd.process_count() == 4
    _run()


def test_eager_bodies_with_marked_specs_on_four_ranks():
    """Not jitted: the shard_map runs as a program over the ranks (an eager body's
    values carry their varying axes only)."""
    assert spmd.process_count() == 4
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("x",), axis_types=(AxisType.Explicit,))
    vn = np.arange(4.0, dtype=np.float32)
    v = spmd.device_put(vn, NamedSharding(mesh, P(reduced={"x"})))

    @spmd.shard_map(mesh=mesh, in_specs=P(reduced={"x"}), out_specs=P("x"))
    def tile(a):
        return lax.pcast(a, "x", to="varying") * 2.0

    out = tile(v)
    np.testing.assert_allclose(np.asarray(spmd.process_allgather(out)), np.tile(2 * vn, n))
    g = spmd.grad(lambda a: snp.sum(tile(a)))(v)
    assert g.sharding == NamedSharding(mesh, P(None, unreduced={"x"}))
    np.testing.assert_allclose(np.asarray(spmd.process_allgather(reshard(g, P()))),
                               2.0 * n * np.ones(4))
