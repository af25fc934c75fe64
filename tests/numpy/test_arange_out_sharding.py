"""spmd.numpy.arange takes out_sharding as zeros and ones do (issue 58: JAX's
``jnp.arange(4, dtype='float32', out_sharding=P('x'))`` failed with an unexpected
keyword)."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.shard.arrays.spec import ShardingError
from spmd.sharding import AxisType, NamedSharding, P


@pytest.fixture
def mesh():
    return spmd.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)


@pytest.fixture(autouse=True)
def _no_mesh_left():
    yield
    spmd.sharding.set_mesh(None)


def test_arange_is_placed_as_out_sharding_says_in_jit_and_eagerly(mesh):
    with spmd.sharding.use_mesh(mesh):
        a, b = spmd.jit(lambda: (snp.arange(8, dtype="float32", out_sharding=P("x")),
                                 snp.arange(2, 10, 2, out_sharding=P("y"))))()
        eager = snp.arange(8, out_sharding=P("x"))
    assert (a.sharding.spec, b.sharding.spec, eager.sharding.spec) == (P("x"), P("y"),
                                                                       P("x"))
    np.testing.assert_array_equal(np.asarray(a), np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(b), np.arange(2, 10, 2))
    np.testing.assert_array_equal(np.asarray(eager), np.arange(8))
    assert a.dtype == np.float32 and eager.dtype == np.int32


def test_arange_takes_a_named_sharding_without_a_mesh_in_context(mesh):
    s = NamedSharding(mesh, P(("x", "y")))
    out = snp.arange(8, out_sharding=s)
    assert out.sharding == s
    np.testing.assert_array_equal(np.asarray(out), np.arange(8))


def test_arange_without_out_sharding_is_as_before():
    out = snp.arange(1, 7, 2, dtype="float32")
    np.testing.assert_array_equal(np.asarray(out), np.arange(1, 7, 2, dtype=np.float32))


def test_arange_length_the_mesh_axis_does_not_divide_is_refused(mesh):
    with spmd.sharding.use_mesh(mesh), pytest.raises(ShardingError, match="not divisible by 4"):
        snp.arange(6, out_sharding=P("x"))
