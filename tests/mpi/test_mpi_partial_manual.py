"""Partial-manual ``shard_map`` across processes: on a 2x2 mesh of ranks, a body
manual over ``'x'`` is split by the partitioner along ``'y'``, so each rank holds
and computes only its ``('x', 'y')`` block.  Values against numpy on the global
arrays (read back with ``spmd.process_allgather``); the per-rank block shapes and
the printed per-device program prove the split."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding as NS, P, lax  # noqa: E402
from spmd.collectives.primitives import CollectiveAxisError  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=4), pytest.mark.timeout(120)]

A = (np.arange(64, dtype=np.float32).reshape(8, 8) - 20) / 16
W = np.linspace(0.5, 2.0, 8, dtype=np.float32)


def _mesh():
    n = spmd.device_count()
    return spmd.make_mesh((2, n // 2), ("x", "y"))


def _global(x):
    return np.asarray(spmd.process_allgather(x, tiled=True))


def _sum_over_x(v):
    return v.reshape(2, 4, *v.shape[1:]).sum(0)


def _local_shapes(a):
    return {s.data.shape for s in a.addressable_shards}


def _partial_manual(body, mesh, in_specs, out_specs):
    return spmd.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                          axis_names={"x"})


def test_each_rank_computes_its_automatic_block():
    mesh = _mesh()
    ny = mesh.shape["y"]
    f = _partial_manual(lambda b: lax.psum(snp.sin(b) * 2.0, "x"), mesh, P("x"), P())
    x = spmd.device_put(A, NS(mesh, P("x", "y")))
    y = f(x)
    assert y.sharding == NS(mesh, P(None, "y"))
    assert _local_shapes(y) == {(4, 8 // ny)}
    assert y.held_nbytes < y.nbytes  # only this rank's block
    np.testing.assert_allclose(_global(y), _sum_over_x(np.sin(A) * 2), rtol=1e-6)


def test_jit_with_shardings_runs_the_split_program():
    mesh = _mesh()
    ny = mesh.shape["y"]
    f = _partial_manual(lambda b: lax.psum(snp.sin(b), "x"), mesh, P("x"), P())
    g = spmd.jit(f, in_shardings=NS(mesh, P("x", "y")))
    lowered = g.lower(A)
    assert f"a:f32[4,{8 // ny}]" in lowered.as_text() and lowered.bytes_sent == 0
    y = g(A)
    assert _local_shapes(y) == {(4, 8 // ny)}
    np.testing.assert_allclose(_global(y), _sum_over_x(np.sin(A)), rtol=1e-6)


def test_a_constraint_in_the_body_and_gradients():
    mesh = _mesh()
    ny = mesh.shape["y"]

    def body(b, w):
        b = lax.with_sharding_constraint(b, NS(mesh, P(None, "y")))
        return snp.sin(b) * w + lax.axis_index("x")

    f = _partial_manual(body, mesh, (P("x"), P()), P("x"))
    x = spmd.device_put(A, NS(mesh, P("x")))
    y = f(x, W)
    assert y.sharding == NS(mesh, P("x", "y")) and _local_shapes(y) == {(4, 8 // ny)}
    want = np.sin(A) * W + np.repeat([0.0, 1.0], 4)[:, None]
    np.testing.assert_allclose(_global(y), want, rtol=1e-6)
    loss = spmd.jit(spmd.grad(lambda b, w: snp.sum(f(b, w) ** 2), argnums=(0, 1)))
    gb, gw = loss(x, W)
    np.testing.assert_allclose(_global(gb), 2 * want * np.cos(A) * W, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_global(gw), (2 * want * np.sin(A)).sum(0), rtol=1e-5)


def test_a_collective_over_the_automatic_axis_raises_on_every_rank():
    mesh = _mesh()
    with pytest.raises(CollectiveAxisError, match="which is automatic"):
        _partial_manual(lambda b: lax.psum(b, "y"), mesh, P("x"), P("x"))(A)


def test_an_operand_computed_in_a_plain_jit_places_the_body():
    """Under a plain jit on Arrays spread over the ranks, the operand ``tanh(x)`` has
    no sharding while traced; the partitioner propagates ``x``'s placement to it and
    splits the body along 'y' by it: each rank runs on its ('x', 'y') block."""
    mesh = _mesh()
    ny = mesh.shape["y"]
    sm = _partial_manual(lambda b, w: snp.sin(b) * w + lax.axis_index("x"), mesh,
                         (P("x"), P()), P("x"))
    f = lambda v, w: sm(snp.tanh(v), w)  # noqa: E731
    x = spmd.device_put(A, NS(mesh, P("x", "y")))
    t = np.tanh(A)
    want = np.sin(t) * W + np.repeat([0.0, 1.0], 4)[:, None]
    y = spmd.jit(f)(x, W)
    assert y.sharding == NS(mesh, P("x", "y")) and _local_shapes(y) == {(4, 8 // ny)}
    assert y.held_nbytes < y.nbytes
    np.testing.assert_allclose(_global(y), want, rtol=1e-6)
    text = spmd.jit(f, in_shardings=(NS(mesh, P("x", "y")), NS(mesh, P()))).lower(A, W) \
        .as_text()
    assert f"f32[4,{8 // ny}] = sin" in text, text
    grad = spmd.grad(lambda v, w: snp.sum(f(v, w) ** 2), argnums=(0, 1))
    for g in (spmd.jit(grad), grad):  # jitted (partitioned) and eager
        gx, gw = g(x, W)
        np.testing.assert_allclose(_global(gx), 2 * want * np.cos(t) * W * (1 - t ** 2),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_global(gw), (2 * want * np.sin(t)).sum(0), rtol=1e-5)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nested_smaps_across_ranks(jit):
    """smap over 'x' around smap over 'y': the inner body is manual along both, its
    collectives over either axis run across the ranks (values and gradient against
    numpy)."""
    mesh = _mesh()
    ny = mesh.shape["y"]

    def inner_body(b):  # a block of 8 // (2 * ny) rows
        return snp.sin(b) + lax.psum(snp.sum(b), ("x", "y"))

    inner = spmd.smap(inner_body, in_axes=0, out_axes=0, axis_name="y")
    outer = spmd.smap(lambda b: lax.psum(inner(b) * 2.0, "x"), in_axes=0, out_axes=None,
                      axis_name="x")
    with spmd.sharding.use_mesh(mesh):
        f = spmd.jit(outer) if jit else outer
        x = spmd.device_put(A, NS(mesh, P("x")))
        want = _sum_over_x((np.sin(A) + A.sum()) * 2)
        np.testing.assert_allclose(_global(f(x)), want, rtol=1e-5)
        g = spmd.grad(lambda v: snp.sum(outer(v)))(x)
        # d/dA of the 64 terms 2 * (sin(A[r, c]) + sum(A)): 2 cos(A) + 2 * 64.
        np.testing.assert_allclose(_global(g), 2 * np.cos(A) + 128.0, rtol=1e-5)
