"""spmd.nn.initializers give jax.nn.initializers' values for the same key (recorded
with jax 0.10.2 in jax_values.json), and shard like any sampler."""

import json
import os

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P
from spmd import random as sr
from spmd.errors import ArgumentError, ShapeError
from spmd.nn import initializers as init

with open(os.path.join(os.path.dirname(__file__), "jax_values.json")) as f:
    JAX = json.load(f)

CASES = {
    "init_glorot_uniform": lambda k: init.glorot_uniform()(k, (4, 3)),
    "init_glorot_normal": lambda k: init.glorot_normal()(k, (4, 3)),
    "init_he_uniform": lambda k: init.he_uniform()(k, (5, 2)),
    "init_he_normal": lambda k: init.he_normal()(k, (5, 2)),
    "init_lecun_uniform": lambda k: init.lecun_uniform()(k, (3, 3)),
    "init_lecun_normal": lambda k: init.lecun_normal()(k, (2, 3, 4)),
    "init_normal": lambda k: init.normal(0.5)(k, (6,)),
    "init_uniform": lambda k: init.uniform(2.0)(k, (6,)),
    "init_truncated_normal": lambda k: init.truncated_normal(0.3)(k, (6,)),
    "init_variance_scaling_fan_out": lambda k: init.variance_scaling(0.7, "fan_out",
                                                                     "normal")(k, (3, 5)),
    "init_variance_scaling_conv": lambda k: init.variance_scaling(
        1.0, "fan_geo_avg", "uniform", in_axis=-2, out_axis=-1)(k, (3, 3, 2, 4)),
    "init_orthogonal": lambda k: init.orthogonal(1.5)(k, (3, 4)),
    "init_orthogonal_3d": lambda k: init.orthogonal(column_axis=0)(k, (2, 3, 2)),
    "init_constant": lambda k: init.constant(0.25)(k, (2, 2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_initializers_match_jax(name):
    e = JAX[name]
    want = np.array(e["values"], e["dtype"]).reshape(e["shape"])
    got = np.asarray(CASES[name](sr.key(42)))
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=4e-7 * 4, atol=4e-7 * 4)


def test_aliases_zeros_ones_and_dtypes():
    assert init.xavier_uniform is init.glorot_uniform and init.kaiming_normal is init.he_normal
    k = sr.key(0)
    np.testing.assert_array_equal(init.zeros(k, (2, 3)), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(init.ones(k, (2,), np.int32), np.ones(2, np.int32))
    assert init.he_normal(dtype=np.float16)(k, (4, 4)).dtype == np.float16


def test_variance_scaling_statistics():
    x = np.asarray(init.he_normal()(sr.key(1), (400, 300)))
    assert abs(x.std() - np.sqrt(2 / 400)) < 0.02 * np.sqrt(2 / 400) * 5
    u = np.asarray(init.glorot_uniform()(sr.key(1), (400, 300)))
    lim = np.sqrt(6 / 700)
    assert u.min() >= -lim and u.max() < lim


def test_sharded_initializer_equals_unsharded():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    f = lambda k: init.lecun_normal()(k, (16, 8))  # noqa: E731
    g = spmd.jit(f, out_shardings=NamedSharding(mesh, P("i", "j")))
    np.testing.assert_array_equal(np.asarray(g(sr.key(3))), np.asarray(f(sr.key(3))))
    assert "random_bits[shape=(4, 4), global_shape=(16, 8)" in g.lower(sr.key(3)).as_text()


def test_initializer_errors():
    with pytest.raises(ArgumentError, match="mode"):
        init.variance_scaling(1.0, "fan_sideways", "normal")
    with pytest.raises(ArgumentError, match="distribution"):
        init.variance_scaling(1.0, "fan_in", "cauchy")
    with pytest.raises(ShapeError, match="in_axis"):
        init.glorot_normal()(sr.key(0), (5,))
    with pytest.raises(ShapeError, match="2 dimensions"):
        init.orthogonal()(sr.key(0), (5,))
    with pytest.raises(ShapeError, match="shape"):
        init.normal()(sr.key(0), (2, -3))


def test_initializer_out_sharding():
    mesh = spmd.make_mesh((4,), ("i",))
    s = NamedSharding(mesh, P("i"))
    w = init.he_uniform()(sr.key(2), (8, 3), out_sharding=s)
    assert tuple(w.sharding.spec)[:1] == ("i",)
    np.testing.assert_array_equal(np.asarray(w), np.asarray(init.he_uniform()(sr.key(2), (8, 3))))
    z = init.zeros(sr.key(0), (8,), out_sharding=s)
    assert tuple(z.sharding.spec) == ("i",) and not np.asarray(z).any()
