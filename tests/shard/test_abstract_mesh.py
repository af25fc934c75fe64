"""``get_abstract_mesh()`` (empty outside any mesh; the context mesh's axes; inside a
shard_map body its mesh with the manual axes typed ``Manual``) and
``shard_map(mesh=AbstractMesh)``, which runs on the mesh of those axes in context."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
from spmd import P, lax
from spmd.sharding import AxisType, get_abstract_mesh, set_mesh, use_mesh
from spmd.shard.explicit.mesh_context import MeshContextError

A, M = AxisType.Auto, AxisType.Manual
X = np.arange(16.0, dtype=np.float32).reshape(8, 2)


@pytest.fixture(autouse=True)
def _no_global_mesh():
    set_mesh(None)
    yield
    set_mesh(None)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_inside_and_outside_shard_map_bodies(jit):
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    assert get_abstract_mesh().empty
    seen = []

    def body(b):
        am = get_abstract_mesh()
        seen.append(am.axis_types)
        return b * am.shape["i"]

    run = spmd.jit if jit else (lambda f: f)
    full = spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    partial = spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                             axis_names={"i"})
    with use_mesh(mesh):
        assert get_abstract_mesh() == mesh.abstract_mesh
        np.testing.assert_array_equal(np.asarray(run(full)(X)), 4 * X)
        np.testing.assert_array_equal(np.asarray(run(partial)(X)), 4 * X)
        inner = spmd.smap(lambda b: b + get_abstract_mesh().shape["j"], in_axes=1, out_axes=1,
                          axis_name="j")
        outer = spmd.smap(lambda b: (seen.append(get_abstract_mesh().axis_types), inner(b))[1],
                          in_axes=0, out_axes=0, axis_name="i")
        np.testing.assert_array_equal(np.asarray(run(outer)(X)), X + 2)
    assert (M, M) in seen and (M, A) in seen
    assert get_abstract_mesh().empty


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_shard_map_over_an_abstract_mesh_runs_on_the_mesh_in_context(jit):
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    f = spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh.abstract_mesh, in_specs=P("i"),
                       out_specs=P())
    with use_mesh(mesh):
        got = (spmd.jit(f) if jit else f)(X)
    np.testing.assert_array_equal(np.asarray(got), X.reshape(4, 2, 2).sum(0))
    with pytest.raises(MeshContextError, match=r"has no devices, and no mesh of its axes is in "
                                               r"context \(current: None\)"):
        f(X)
    with use_mesh(spmd.make_mesh((8,), ("i",))):
        with pytest.raises(MeshContextError, match=r"no mesh of its axes is in context"):
            f(X)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_shard_map_over_an_abstract_mesh_runs_on_its_arguments_mesh(jit):
    # As in JAX: with no mesh in context, the mesh the placed arguments are on.
    from spmd import NamedSharding

    devs = spmd.devices()
    m1 = spmd.Mesh(np.array(devs[:4]).reshape(2, 2), ("x", "y"))
    m2 = spmd.Mesh(np.array(devs[4:8]).reshape(2, 2), ("x", "y"))
    x = X
    f = lambda v: spmd.shard_map(lambda b: b * 2, mesh=m1.abstract_mesh,  # noqa: E731
                                 in_specs=P("x"), out_specs=P("x"))(v)
    run = spmd.jit(f) if jit else f
    for m in (m1, m2, m1):  # the same function, arguments on two meshes of one shape
        out = run(spmd.device_put(x, NamedSharding(m, P("x", "y"))))
        assert out.sharding.mesh == m
        np.testing.assert_array_equal(np.asarray(out), 2 * x)
    with pytest.raises(MeshContextError, match=r"has no devices, and no mesh of its axes is "
                                               r"in context \(current: None\) or holds its "
                                               r"arguments"):
        run(x)
