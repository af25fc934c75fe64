"""Shardings survive ``jit`` in one process: a jitted ``shard_map`` returns its
``out_specs`` placement, a ``with_sharding_constraint`` on an output is kept, and
``jit(f)`` of sharded inputs returns the shardings the partitioner propagated."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax, shard_map
from spmd.shard import SingleDeviceSharding


def _mesh():
    return spmd.make_mesh((4, 2), ("i", "j"))


def _value(shape=(8, 4)):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)


@pytest.mark.parametrize("spec", [P("i"), P("i", "j"), P(None, "j"), P()])
def test_jitted_shard_map_keeps_out_specs(spec):
    mesh = _mesh()
    f = shard_map(lambda b: b * 2, mesh=mesh, in_specs=spec, out_specs=spec)
    eager, jitted = f(_value()), spmd.jit(f)(_value())
    assert jitted.sharding == NamedSharding(mesh, spec) == eager.sharding
    np.testing.assert_array_equal(np.asarray(jitted), 2 * _value())


def test_jitted_shard_map_outputs_each_keep_their_spec():
    mesh = _mesh()
    f = shard_map(lambda a, b: (a + 1, lax.psum(b, "j")), mesh=mesh,
                  in_specs=(P("i"), P("i", "j")), out_specs=(P("i"), P("i")))
    a, b = spmd.jit(f)(_value(), _value())
    assert a.sharding.spec == P("i") and b.sharding.spec == P("i")
    np.testing.assert_array_equal(np.asarray(a), _value() + 1)
    v = _value()
    np.testing.assert_array_equal(np.asarray(b), v[:, :2] + v[:, 2:])


def test_sharding_constraint_on_an_output_survives_jit():
    mesh = _mesh()
    want = NamedSharding(mesh, P(None, "j"))
    g = spmd.jit(lambda x: (lax.with_sharding_constraint(x * 2, want), x + 1))
    y, z = g(_value())
    assert y.sharding == want
    np.testing.assert_array_equal(np.asarray(y), 2 * _value())
    # The unconstrained output of numpy inputs is one whole copy.
    assert isinstance(z.sharding, SingleDeviceSharding)


@pytest.mark.parametrize("spec", [P("i"), P("i", "j"), P(None, "j")])
def test_jit_of_sharded_inputs_returns_the_propagated_shardings(spec):
    mesh = _mesh()
    s = NamedSharding(mesh, spec)
    x = spmd.device_put(_value(), s)
    y = spmd.jit(lambda v: snp.tanh(v) * 2.0 + 1.0)(x)
    assert y.sharding == s
    np.testing.assert_allclose(np.asarray(y), np.tanh(_value()) * 2 + 1, rtol=1e-6)
    # A reduction over the split dimension is replicated, as the partitioner decides.
    total = spmd.jit(lambda v: snp.sum(v, axis=0))(x)
    assert total.sharding.mesh == mesh
    np.testing.assert_allclose(np.asarray(total), _value().sum(0), rtol=1e-6)


def test_jit_of_sharded_inputs_keeps_an_output_constraint():
    mesh = _mesh()
    x = spmd.device_put(_value(), NamedSharding(mesh, P("i")))
    want = NamedSharding(mesh, P(None, "j"))
    y = spmd.jit(lambda v: lax.with_sharding_constraint(v * 3.0, want))(x)
    assert y.sharding == want
    np.testing.assert_array_equal(np.asarray(y), 3 * _value())


def test_jit_of_sharded_inputs_reuses_its_trace():
    mesh = _mesh()
    f = spmd.jit(lambda v: v + 1.0)
    x = spmd.device_put(_value(), NamedSharding(mesh, P("i")))
    for _ in range(3):
        f(x)
    assert f._cache_size() == 1
