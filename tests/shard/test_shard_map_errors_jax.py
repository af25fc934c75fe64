"""Errors JAX raises around ``shard_map`` that ``spmd`` raises too (issue 58): each
case checks the error type JAX uses and the valid program next to it."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.autodiff import TangentVaryingError
from spmd.shard.maps.shard_map import ShardMapError
from spmd.sharding import AxisType, NamedSharding, P


def _explicit_mesh():
    return spmd.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_axis_names_may_not_name_an_axis_vmap_maps_over(jit):
    # JAX's shard_map_test.test_vmap_explicit_mesh_axis_error: the mapped axis is
    # split along explicit "x", so vmap has taken "x".
    mesh = _explicit_mesh()
    x = spmd.device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4),
                        NamedSharding(mesh, P("x", "y")))

    def body(b):
        return b * 2

    def wrap(f):
        return spmd.jit(f) if jit else f

    both = spmd.shard_map(body, mesh=mesh, in_specs=P("y"), out_specs=P("y"),
                          axis_names={"x", "y"})
    with pytest.raises(ValueError, match=r"axis_names=\['x', 'y'\] names 'x'.*leave 'x' out"):
        wrap(spmd.vmap(both))(x)
    assert isinstance(pytest.raises(ShardMapError, wrap(spmd.vmap(both)), x).value,
                      ValueError)
    # Manual over the other axis only, or over the mesh's axes by default: fine.
    only_y = spmd.shard_map(body, mesh=mesh, in_specs=P("y"), out_specs=P("y"),
                            axis_names={"y"})
    np.testing.assert_allclose(np.asarray(wrap(spmd.vmap(only_y))(x)), np.asarray(x) * 2)
    default = spmd.shard_map(body, mesh=mesh, in_specs=P("y"), out_specs=P("y"))
    np.testing.assert_allclose(np.asarray(wrap(spmd.vmap(default))(x)), np.asarray(x) * 2)
    # The same shard_map outside vmap is manual over both axes.
    whole = spmd.shard_map(lambda b: lax.psum(b, "x"), mesh=mesh, in_specs=P("x", "y"),
                           out_specs=P(None, "y"), axis_names={"x", "y"})
    xn = np.asarray(x)
    np.testing.assert_allclose(np.asarray(wrap(whole)(x)), xn[:2] + xn[2:])


def _mean_square(x):
    return snp.mean(x ** 2)


def test_linearize_tangent_must_vary_like_its_primal():
    # JAX's shard_map_test.test_shmap_linearize_and_linearize_transpose_error: the
    # primal is a constant (invariant), the tangent a block (varying along "x").
    mesh = spmd.make_mesh((2,), ("x",))

    def body(t, cast):
        p = snp.array([1.0], dtype=np.float32)
        if cast:  # the fix the error names
            p = lax.pcast(p, "x", to="varying")
        _, f_jvp = spmd.linearize(_mean_square, p)
        return f_jvp(t)

    def run(cast):
        return spmd.shard_map(lambda t: body(t, cast) * snp.ones((1,), np.float32), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x"))(
            np.array([1.0, 3.0], np.float32))

    with pytest.raises(TangentVaryingError,
                       match=r"tangent 0 varies along mesh axes \['x'\].*pcast\(\.\.\., "
                             r"\('x',\), to='varying'\)` to the primal"):
        run(cast=False)
    assert issubclass(TangentVaryingError, ValueError)
    # d/dp mean(p**2) = 2p = 2, times each device's tangent.
    np.testing.assert_allclose(np.asarray(run(cast=True)), [2.0, 6.0])


def test_linearize_tangent_invariant_where_the_primal_varies():
    mesh = spmd.make_mesh((2,), ("x",))

    def body(p):
        _, f_jvp = spmd.linearize(_mean_square, p)
        return f_jvp(snp.ones((1,), np.float32))

    with pytest.raises(TangentVaryingError, match=r"to the tangent passed to the `f_jvp`"):
        spmd.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(
            np.array([1.0, 3.0], np.float32))
    # Outside shard_map nothing varies: the same call is fine.
    _, f_jvp = spmd.linearize(_mean_square, np.array([3.0], np.float32))
    np.testing.assert_allclose(np.asarray(f_jvp(np.ones((1,), np.float32))), 6.0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_nested_shard_map_given_the_mesh_without_axis_names(jit):
    # JAX's shard_map_test.test_partial_auto_mismatch_mesh_error: inside a body manual
    # over "i", the context mesh has "i" manual; the concrete mesh= does not match it.
    mesh = spmd.make_mesh((2, 2), ("i", "j"))
    v = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    vs = spmd.device_put(v, NamedSharding(mesh, P("i", "j")))

    def outer(inner):
        f = spmd.shard_map(inner, mesh=mesh, in_specs=P("i", None), out_specs=P("i", None),
                           check_vma=False, axis_names=frozenset({"i"}))
        return spmd.jit(f) if jit else f

    def square(x):
        return x * x

    concrete = outer(lambda x: spmd.shard_map(square, mesh=mesh, in_specs=P(None, "j"),
                                              out_specs=P(None, "j"))(x))
    with pytest.raises(ShardMapError, match=r"context mesh inside the enclosing shard_map's "
                                            r"body .*should match the mesh passed"):
        concrete(vs)
    # The context's abstract mesh, or the nested one's axes named: fine.
    for inner in (lambda x: spmd.shard_map(square, mesh=spmd.sharding.get_abstract_mesh(),
                                           in_specs=P(None, "j"), out_specs=P(None, "j"))(x),
                  lambda x: spmd.shard_map(square, mesh=mesh, in_specs=P(None, "j"),
                                           out_specs=P(None, "j"), axis_names={"j"})(x)):
        np.testing.assert_allclose(np.asarray(outer(inner)(vs)), v * v)
