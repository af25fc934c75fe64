"""Errors JAX raises around ``shard_map`` that ``spmd`` raises too (issue 58): each
case checks the error type JAX uses and the valid program next to it."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
from spmd import lax
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

