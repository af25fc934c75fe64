"""The mesh context (``spmd.sharding.use_mesh`` / ``set_mesh``): shard_map without
``mesh=``, ``device_put(x, P(...))``, bare PartitionSpecs in sharding constraints
and jit shardings, and caches that retrace under another mesh."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax
from spmd.sharding import get_mesh, set_mesh, use_mesh
from spmd.shard.explicit.mesh_context import MeshContextError


@pytest.fixture(autouse=True)
def _no_global_mesh():
    set_mesh(None)
    yield
    set_mesh(None)


def _x():
    return np.arange(32, dtype=np.float32).reshape(8, 4)


def test_shard_map_and_device_put_under_use_mesh():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    x = _x()
    with use_mesh(mesh) as m:
        assert m is mesh and get_mesh() is mesh
        y = spmd.shard_map(lambda b: lax.psum(b, "j"), in_specs=P("i", "j"),
                           out_specs=P("i"))(x)
        xd = spmd.device_put(x, P("i", "j"))
        tree = spmd.device_put({"a": x, "b": x}, {"a": P("i"), "b": None})
        # in_specs inferred from the placed Array.
        z = spmd.shard_map(lambda b: b * 2, out_specs=P("i", "j"))(xd)
    assert get_mesh() is None
    np.testing.assert_allclose(np.asarray(y), x.reshape(8, 2, 2).sum(1))
    assert xd.sharding == NamedSharding(mesh, P("i", "j"))
    np.testing.assert_allclose(np.asarray(xd), x)
    assert tree["a"].sharding == NamedSharding(mesh, P("i"))
    np.testing.assert_allclose(np.asarray(z), 2 * x)
    # The same with mesh= (the two styles agree).
    y2 = spmd.shard_map(lambda b: lax.psum(b, "j"), mesh=mesh, in_specs=P("i", "j"),
                        out_specs=P("i"))(x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y2))


def test_set_mesh_global_nested_and_as_block():
    m8 = spmd.make_mesh((8,), ("i",))
    m4 = spmd.make_mesh((4,), ("i",))
    set_mesh(m8)
    assert get_mesh() is m8
    with use_mesh(m4):
        assert get_mesh() is m4
        with set_mesh(m8):
            assert get_mesh() is m8
        assert get_mesh() is m4
    assert get_mesh() is m8
    # A plain set_mesh is seen by other threads; a block is not.
    seen = []
    with use_mesh(m4):
        t = threading.Thread(target=lambda: seen.append(get_mesh()))
        t.start()
        t.join()
    assert seen == [m8]
    set_mesh(None)
    assert get_mesh() is None


def test_jit_retraces_under_another_mesh():
    f = spmd.jit(lambda x: spmd.shard_map(lambda b: lax.psum(b, "i"), in_specs=P("i"),
                                          out_specs=P())(x))
    x = np.ones(8, np.float32)
    with use_mesh(spmd.make_mesh((8,), ("i",))):
        np.testing.assert_allclose(np.asarray(f(x)), [8.0])
    with use_mesh(spmd.make_mesh((4,), ("i",))):
        np.testing.assert_allclose(np.asarray(f(x)), [4.0, 4.0])
    with use_mesh(spmd.make_mesh((8,), ("i",))):
        np.testing.assert_allclose(np.asarray(f(x)), [8.0])


def test_bare_specs_in_constraints_and_jit_shardings():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    x = _x()
    with use_mesh(mesh):
        f = spmd.jit(lambda x: lax.with_sharding_constraint(x * 2, P("i", "j")) + 1)
        np.testing.assert_allclose(np.asarray(f(x)), 2 * x + 1)
        assert "spec=PartitionSpec('i', 'j')" in str(spmd.make_jaxpr(f)(x))
        g = spmd.jit(lambda x: snp.sum(x, axis=1), in_shardings=P("i", "j"),
                     out_shardings=P("i"))
        out = g(x)
        np.testing.assert_allclose(np.asarray(out), x.sum(1))
        assert out.sharding == NamedSharding(mesh, P("i"))


def test_errors_without_a_mesh():
    x = _x()
    with pytest.raises(MeshContextError, match=r"shard_map\(<lambda>\): no mesh was given and "
                                               r"none is set; pass mesh="):
        spmd.shard_map(lambda b: b, in_specs=P("i"), out_specs=P("i"))(x)
    from spmd.shard.arrays.spec import ShardingError
    with pytest.raises(ShardingError, match=r"PartitionSpec\('i'\) without a mesh"):
        spmd.device_put(x, P("i"))
    from spmd.shard.partition.partitioner import PartitionError
    with pytest.raises(PartitionError, match="a bare PartitionSpec has no mesh.*use_mesh"):
        spmd.jit(lambda x: lax.with_sharding_constraint(x, P("i")))(x)
    with pytest.raises(MeshContextError, match="expected a spmd.Mesh.*got tuple"):
        use_mesh((8,))
    with pytest.raises(MeshContextError, match="set_mesh: expected a spmd.Mesh"):
        set_mesh("mesh")
    assert get_mesh() is None


def test_a_mesh_argument_must_match_the_context_mesh():
    x = _x()
    m42 = spmd.make_mesh((4, 2), ("i", "j"))
    m8 = spmd.make_mesh((8,), ("i",))
    # The same shape and names over the devices in another order: the same abstract
    # mesh, allowed (as in JAX).
    devices = np.array(spmd.devices()[::-1], dtype=object).reshape(4, 2)
    m42r = spmd.Mesh(devices, ("i", "j"))
    body = lambda b: b * 2  # noqa: E731
    with use_mesh(m42):
        for f in (lambda v: spmd.shard_map(body, mesh=m8, in_specs=P("i"), out_specs=P("i"))(v),
                  spmd.jit(lambda v: spmd.shard_map(body, mesh=m8, in_specs=P("i"),
                                                    out_specs=P("i"))(v))):
            with pytest.raises(ValueError, match=r"shard_map\(<lambda>\): the context mesh "
                               r"Mesh\(\{'i': 4, 'j': 2\}\) \(of set_mesh/use_mesh\) should "
                               r"match the mesh passed to shard_map, Mesh\(\{'i': 8\}\); leave "
                               r"mesh= out"):
                f(x)
        y = spmd.shard_map(body, mesh=m42r, in_specs=P("i", "j"), out_specs=P("i", "j"))(x)
        np.testing.assert_array_equal(np.asarray(y), 2 * x)
    # Outside the block any mesh goes.
    np.testing.assert_array_equal(
        np.asarray(spmd.shard_map(body, mesh=m8, in_specs=P("i"), out_specs=P("i"))(x)), 2 * x)
