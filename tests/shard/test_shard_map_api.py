"""shard_map's JAX calling conventions: ``None`` in ``in_specs`` (arguments passed
through as they are), ``in_specs=None``, ``in_specs`` inferred from Array
shardings, static arguments under ``jit(static_argnums)``, ``mesh`` passed
positionally; each against numpy on the global arrays."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.errors import DTypeError
from spmd.shard.maps.shard_map import ShardMapError


@pytest.fixture
def mesh():
    return spmd.make_mesh((4, 2), ("x", "y"))


def _a():
    return np.arange(64, dtype=np.float32).reshape(8, 8)


def _add_ones(x, static_shape):
    return x + snp.ones(static_shape, dtype=x.dtype)


def test_static_argument_under_jit_static_argnums(mesh):
    # JAX's shard_map_test.test_with_static_arg.
    a = _a()

    @functools.partial(spmd.jit, static_argnums=(1,))
    def fun(a, static_shape):
        return spmd.shard_map(_add_ones, mesh=mesh, in_specs=(P("x", "y"), None),
                              out_specs=P("x", "y"))(a, static_shape)

    np.testing.assert_allclose(np.asarray(fun(a, (2, 4))), a + 1)
    # Eagerly too, and a tuple argument covered by one None in a nested prefix.
    f = spmd.shard_map(lambda x, cfg: x * cfg[0] + cfg[1], mesh=mesh,
                       in_specs=(P("x"), None), out_specs=P("x"))
    np.testing.assert_allclose(np.asarray(f(a, (3, 1))), 3 * a + 1)
    f = spmd.shard_map(lambda args: args[0] * args[1]["k"], mesh=mesh,
                       in_specs=((P("x"), {"k": None}),), out_specs=P("x"))
    np.testing.assert_allclose(np.asarray(f((a, {"k": 2.0}))), 2 * a)


def test_none_spec_array_is_seen_whole_by_every_device(mesh):
    a, w = _a(), np.arange(8, dtype=np.float32)

    def body(x, w):
        assert w.shape == (8,)  # the whole array, not a block
        return x * w

    f = spmd.shard_map(body, mesh=mesh, in_specs=(P("x"), None), out_specs=P("x"))
    np.testing.assert_allclose(np.asarray(f(a, w)), a * w)
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(a, w)), a * w)
    # Under jit a traced None-spec argument is closed over: replicated, and its
    # gradient sums over the devices, as for P().
    g = spmd.grad(lambda w: snp.sum(f(a, w)))(w)
    np.testing.assert_allclose(np.asarray(g), a.sum(0))
    g = spmd.jit(spmd.grad(lambda w: snp.sum(f(a, w))))(w)
    np.testing.assert_allclose(np.asarray(g), a.sum(0))


def test_in_specs_none_passes_every_argument_through(mesh):
    f = spmd.shard_map(lambda x, n: x * n, mesh=mesh, in_specs=None, out_specs=P())
    np.testing.assert_allclose(np.asarray(f(_a(), 3)), 3 * _a())
    # The body sees the whole array on every device; psum over 'x' counts 4 copies.
    f = spmd.shard_map(lambda x: lax.psum(x, "x"), mesh=mesh, in_specs=None, out_specs=P())
    np.testing.assert_allclose(np.asarray(f(_a())), 4 * _a())


def test_in_specs_inferred_from_array_shardings(mesh):
    a = _a()
    ad = spmd.device_put(a, NamedSharding(mesh, P("x", "y")))
    f = spmd.shard_map(lambda b: lax.psum(b.sum(), ("x", "y")) + 0 * b, mesh=mesh,
                       out_specs=P("x", "y"))
    np.testing.assert_allclose(np.asarray(f(ad)), np.full_like(a, a.sum()))
    seen = []
    spmd.shard_map(lambda b: seen.append(b.shape) or b, mesh=mesh, out_specs=P("x", "y"))(ad)
    assert seen == [(2, 4)]
    with pytest.raises(ShardMapError, match=r"in_specs was not given, and argument\[0\] is "
                                            r"not an Array placed on the mesh"):
        f(a)
    other = spmd.make_mesh((2, 4), ("x", "y"))
    with pytest.raises(ShardMapError, match=r"argument\[0\] is not an Array placed"):
        f(spmd.device_put(a, NamedSharding(other, P("x", "y"))))


def test_mesh_in_specs_out_specs_positional(mesh):
    a = _a()
    f = spmd.shard_map(lambda b: 2 * b, mesh, P("x", "y"), P("x", "y"))
    np.testing.assert_allclose(np.asarray(f(a)), 2 * a)
    dec = spmd.shard_map(mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    np.testing.assert_allclose(np.asarray(dec(lambda b: b + 1)(a)), a + 1)


def test_out_specs_none_for_a_body_returning_none(mesh):
    # As in JAX, out_specs=None is the spec of no outputs (None is a pytree), not
    # "out_specs left out".
    seen = []
    f = spmd.shard_map(lambda b: seen.append(b.shape), mesh=mesh, in_specs=P("x"),
                       out_specs=None)
    assert f(_a()) is None and spmd.jit(f)(_a()) is None and seen
    with pytest.raises(ShardMapError, match=r"out_specs is None; use P\(\) for a replicated"):
        spmd.shard_map(lambda b: b, mesh=mesh, in_specs=P("x"), out_specs=None)(_a())


def test_api_errors(mesh):
    with pytest.raises(ShardMapError, match="out_specs is required"):
        spmd.shard_map(lambda b: b, mesh=mesh, in_specs=P())
    with pytest.raises(ShardMapError, match="expected a function first, got Mesh"):
        spmd.shard_map(mesh, P(), P())
    with pytest.raises(DTypeError, match=r"argument\[1\] of type str is not an array; give it "
                                         "the in_specs entry None"):
        spmd.shard_map(lambda x, s: x, mesh=mesh, in_specs=(P(), P()), out_specs=P())(_a(), "s")
    with pytest.raises(ShardMapError, match=r"names 'z', which is not an axis"):
        spmd.shard_map(lambda b: b, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                       axis_names={"x", "z"})(_a())
    # All axes manual, spelled out: the ordinary shard_map.
    f = spmd.shard_map(lambda b: b, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                       axis_names={"x", "y"})
    np.testing.assert_allclose(np.asarray(f(_a())), _a())


# ------------------------------------------------------- partial-manual shard_map

@pytest.mark.parametrize("check_vma", [True, False])
def test_partial_manual_axes(mesh, check_vma):
    a = _a()
    shapes = []

    def body(b):
        shapes.append(b.shape)  # split along the manual axis 'x' only
        return lax.psum(snp.sum(b * b, 0), "x")

    f = spmd.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P(), axis_names={"x"},
                       check_vma=check_vma)
    want = (a * a).sum(0)
    np.testing.assert_allclose(np.asarray(f(a)), want)
    assert shapes == [(2, 8)]
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(a)), want)
    # Inside a partitioned jit the body is split along the automatic axis too.
    g = spmd.jit(f, in_shardings=NamedSharding(mesh, P("x", "y")))
    np.testing.assert_allclose(np.asarray(g(a)), want)
    # Gradients count each device along the automatic axis once (typed and untyped).
    grad = spmd.grad(lambda a: snp.sum(f(a)))(a)
    np.testing.assert_allclose(np.asarray(grad), 2 * a)
    grad = spmd.jit(spmd.grad(lambda a: snp.sum(f(a) ** 2)))(a)
    np.testing.assert_allclose(np.asarray(grad), 4 * a * want[None, :], rtol=1e-6)


def test_partial_manual_errors(mesh):
    from spmd.collectives.primitives import CollectiveAxisError

    with pytest.raises(ShardMapError, match=r"in_specs\[0\]=PartitionSpec\('x', 'y'\) names "
                                            r"mesh axis 'y', which is not manual"):
        spmd.shard_map(lambda b: b, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x"),
                       axis_names={"x"})(_a())
    with pytest.raises(ShardMapError, match=r"out_specs=PartitionSpec\('y'\) names mesh "
                                            "axis 'y'"):
        spmd.shard_map(lambda b: b, mesh=mesh, in_specs=P("x"), out_specs=P("y"),
                       axis_names={"x"})(_a())
    with pytest.raises(CollectiveAxisError, match=r"psum over mesh axis 'y', which is automatic "
                                                  r"in this partial-manual shard_map"):
        spmd.shard_map(lambda b: lax.psum(b, "y"), mesh=mesh, in_specs=P("x"),
                       out_specs=P("x"), axis_names={"x"})(_a())
