"""spmd.testing.strategies: every drawn mesh, spec and array is valid (the specs fit
their shapes, the arrays are placed as drawn), and a property over them reads as
users would write it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import spmd
import spmd.numpy as snp
from spmd.errors import ArgumentError
from spmd.shard.arrays.spec import NamedSharding, check_spec
from spmd.testing import assert_sharded_allclose, strategies as sst


@given(sst.meshes(max_devices=8, max_axes=3))
def test_meshes_are_powers_of_two_within_the_budget(mesh):
    n = math.prod(mesh.shape.values())
    assert n <= 8 and n & (n - 1) == 0
    assert 1 <= len(mesh.axis_names) <= 3
    assert mesh.axis_names == ("i", "j", "k")[:len(mesh.axis_names)]


@given(st.data())
def test_partition_specs_fit_their_shape(data):
    mesh = data.draw(sst.meshes())
    shape = tuple(data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12]), max_size=3)))
    spec = data.draw(sst.partition_specs(shape, mesh))
    check_spec(spec, mesh, shape, "test")  # raises when it does not fit
    used = list(spec.mesh_axes)
    assert len(used) == len(set(used))


@given(st.data())
def test_shapes_and_specs_fit(data):
    mesh = data.draw(sst.meshes())
    shape, spec = data.draw(sst.shapes_and_specs(mesh, max_rank=3))
    check_spec(spec, mesh, shape, "test")
    assert NamedSharding(mesh, spec).shard_shape(shape) is not None


@given(sst.sharded_arrays(max_rank=2))
def test_a_property_over_sharded_arrays(x):
    """The form users write: the same result as numpy on every mesh and placement."""
    want = np.asarray(x) * 2 + 1
    assert_sharded_allclose(spmd.jit(lambda a: a * 2 + 1)(x), want, rtol=1e-6)
    assert_sharded_allclose(spmd.jit(lambda a: snp.sum(a))(x), np.asarray(x).sum(),
                            rtol=1e-4, atol=1e-3)


@given(st.data())
def test_sharded_arrays_are_placed_as_asked(data):
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    x = data.draw(sst.sharded_arrays(mesh, shape=(8, 6), dtype=np.int32))
    assert x.shape == (8, 6) and x.dtype == np.int32
    assert x.sharding.mesh == mesh
    check_spec(x.sharding.spec, mesh, (8, 6), "test")


@given(st.data())
def test_bad_arguments_are_named(data):
    mesh = spmd.make_mesh((2,), ("i",))
    with pytest.raises(ArgumentError, match=r"max_devices=64 must be between 1 and this "
                                            r"process's 8 devices"):
        data.draw(sst.meshes(max_devices=64))
    with pytest.raises(ArgumentError, match=r"max_axes=5 must be between 1 and len\(names\)=4"):
        data.draw(sst.meshes(max_axes=5))
    with pytest.raises(ArgumentError, match="a spec was given without a shape"):
        data.draw(sst.sharded_arrays(mesh, spec=spmd.P("i")))
