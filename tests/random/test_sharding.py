"""The same numbers on every mesh: sharded random arrays equal the unsharded ones,
and each device computes only its own block (no generate-then-slice)."""

import functools

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P
from spmd import random as sr

MESHES = [((8,), ("i",)), ((4, 2), ("i", "j")), ((2, 4), ("i", "j"))]


def _specs(names):
    if len(names) == 1:
        return [P("i"), P(None, "i"), P("i", None)]
    return [P("i", "j"), P("j", "i"), P(("i", "j")), P(None, ("j", "i")), P("i")]


def _norm(spec):
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return tuple(parts)


@pytest.mark.parametrize("shape,names", MESHES)
def test_sharded_samplers_equal_unsharded(shape, names):
    mesh = spmd.make_mesh(shape, names)
    k = sr.key(1234)
    samplers = {
        "normal": lambda k: sr.normal(k, (16, 8)),
        "uniform": lambda k: sr.uniform(k, (16, 8), minval=-2.0, maxval=3.0),
        "bits": lambda k: sr.bits(k, (16, 8)),
        "bernoulli": lambda k: sr.bernoulli(k, 0.25, (16, 8)),
        "exponential": lambda k: sr.exponential(k, (16, 8)),
    }
    for name, f in samplers.items():
        want = np.asarray(f(k))
        for spec in _specs(names):
            g = spmd.jit(f, out_shardings=NamedSharding(mesh, spec))
            got = g(k)
            assert _norm(got.sharding.spec) == _norm(spec), (name, spec)
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"{name} {spec}")


def test_each_device_computes_only_its_block():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    f = spmd.jit(lambda k: sr.normal(k, (1024, 64)),
                 out_shardings=NamedSharding(mesh, P("i", "j")))
    text = f.lower(sr.key(0)).as_text()
    # The per-device program draws a (256, 32) block at its offsets, nothing global.
    assert "random_bits[shape=(256, 32), global_shape=(1024, 64)" in text
    assert "1024,64" not in text and "[1024" not in text
    assert "bytes sent per device per call: 0" in text


def test_split_keys_placed_over_an_axis_and_vmapped():
    mesh = spmd.make_mesh((8,), ("i",))
    keys = sr.split(sr.key(7), 8)
    sharded = spmd.device_put(keys, NamedSharding(mesh, P("i")))
    assert isinstance(sharded, sr.PRNGKeyArray) and sharded.shape == (8,)
    draw = spmd.vmap(lambda k: sr.normal(k, (5,)))
    f = spmd.jit(draw, out_shardings=NamedSharding(mesh, P("i")))
    np.testing.assert_array_equal(np.asarray(f(sharded)), np.asarray(draw(keys)))
    sk = spmd.jit(lambda k: sr.split(k, 8), out_shardings=NamedSharding(mesh, P("i")))
    np.testing.assert_array_equal(sr.key_data(sk(sr.key(7))), sr.key_data(keys))


def test_fold_in_axis_index_gives_per_device_streams():
    mesh = spmd.make_mesh((4,), ("i",))

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=P(), out_specs=P("i"))
    def per_device(k):
        k = sr.fold_in(k, spmd.lax.axis_index("i"))
        return sr.uniform(k, (1, 3))

    k = sr.key(5)
    got = np.asarray(spmd.jit(per_device)(k))
    want = np.concatenate([np.asarray(sr.uniform(sr.fold_in(k, d), (1, 3))) for d in range(4)])
    np.testing.assert_array_equal(got, want)
    assert len({tuple(r) for r in got.tolist()}) == 4  # four different streams


def test_keys_inside_shard_map_bodies():
    mesh = spmd.make_mesh((2,), ("i",))
    keys = sr.split(sr.key(3), 2)

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    def body(k):  # k: a block of one key
        return spmd.vmap(lambda kk: sr.normal(kk, (4,)))(k)

    got = np.asarray(body(keys))
    want = np.stack([np.asarray(sr.normal(kk, (4,))) for kk in keys])
    np.testing.assert_array_equal(got, want)


def test_sampler_output_under_a_sharding_constraint():
    mesh = spmd.make_mesh((4,), ("i",))

    def f(k):
        x = sr.uniform(k, (8, 4))
        x = spmd.lax.with_sharding_constraint(x, NamedSharding(mesh, P("i")))
        return snp.sum(x)

    g = spmd.jit(f, out_shardings=NamedSharding(mesh, P()))
    np.testing.assert_allclose(np.asarray(g(sr.key(0))), np.asarray(f(sr.key(0))), rtol=1e-6)


def test_grad_of_a_sharded_reparameterised_loss_draws_blocks_only():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    S = lambda *s: NamedSharding(mesh, P(*s))  # noqa: E731
    k, mu = sr.key(0), np.ones((16, 8), np.float32)

    def loss(mu, k):
        return snp.sum((mu + sr.normal(k, (16, 8))) ** 2)

    g = spmd.jit(spmd.grad(loss), in_shardings=(S("i", "j"), S()), out_shardings=S("i", "j"))
    np.testing.assert_array_equal(np.asarray(g(mu, k)),
                                  2 * (mu + np.asarray(sr.normal(k, (16, 8)))))
    text = g.lower(mu, k).as_text()
    assert "random_bits[shape=(4, 4), global_shape=(16, 8)" in text
    assert "bytes sent per device per call: 0" in text


def test_out_sharding_argument_eager_and_traced():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    s = NamedSharding(mesh, P("i", "j"))
    k = sr.key(8)
    x = sr.normal(k, (8, 4), out_sharding=s)
    assert _norm(x.sharding.spec) == ("i", "j")
    np.testing.assert_array_equal(np.asarray(x), np.asarray(sr.normal(k, (8, 4))))
    # Traced: a sharding constraint, so a partitioned jit draws the blocks only.
    f = spmd.jit(lambda k: snp.sum(sr.uniform(k, (8, 4), out_sharding=s)),
                 out_shardings=NamedSharding(mesh, P()))
    assert "random_bits[shape=(2, 2), global_shape=(8, 4)" in f.lower(k).as_text()
    np.testing.assert_allclose(np.asarray(f(k)), np.asarray(sr.uniform(k, (8, 4))).sum(),
                               rtol=1e-6)
    with spmd.sharding.use_mesh(mesh):
        y = sr.randint(k, (8,), 0, 5, out_sharding=P("i"))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(sr.randint(k, (8,), 0, 5)))
    with pytest.raises(spmd.shard.partition.PartitionError, match="use_mesh"):
        sr.normal(k, (8,), out_sharding=P("i"))
