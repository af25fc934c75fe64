"""Bad inputs to the partitioner: each gets a specific exception whose message names
the argument, the offending value and the fix; contradictions between shardings are
resolved by a collective, never silently."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd import NamedSharding as NS
from spmd.shard.partition import GatherTooLargeError, PartitionError
from spmd.shard.arrays.spec import ShardingError


@pytest.fixture(scope="module")
def mesh():
    return spmd.make_mesh((4, 2), ("a", "b"))


@pytest.fixture(scope="module")
def other_mesh():
    return spmd.make_mesh((2, 4), ("a", "b"))


X = np.arange(32, dtype=np.float32).reshape(8, 4)


def test_wrong_number_of_in_shardings(mesh):
    f = spmd.jit(lambda x, y: x + y, in_shardings=(NS(mesh, P("a")),))
    with pytest.raises(PartitionError, match=r"in_shardings has 1 entries for 2 arguments; "
                                             r"give one per argument"):
        f(X, X)
    g = spmd.jit(lambda x: x, in_shardings=[NS(mesh, P("a")), None])
    with pytest.raises(PartitionError, match="in_shardings has 2 entries for 1 arguments"):
        g(X)


def test_in_shardings_not_a_prefix(mesh):
    f = spmd.jit(lambda t: t[0] + t[1], in_shardings=((NS(mesh, P()),) * 3,))
    with pytest.raises(PartitionError, match=r"not a pytree prefix of the arguments \(3 "
                                             r"shardings for 2 arrays\)"):
        f((X, X))


def test_shardings_over_different_meshes(mesh, other_mesh):
    f = spmd.jit(lambda x, y: x + y, in_shardings=(NS(mesh, P("a")), NS(other_mesh, P("a"))))
    with pytest.raises(PartitionError, match=r"2 different meshes .*must share a mesh"):
        f(X, X)
    g = spmd.jit(lambda x: x, in_shardings=NS(mesh, P()), out_shardings=NS(other_mesh, P()))
    with pytest.raises(PartitionError, match="different meshes"):
        g(X)


def test_bare_partition_spec_has_no_mesh():
    f = spmd.jit(lambda x: x, in_shardings=P("a"))
    with pytest.raises(PartitionError, match=r"shardings need a mesh: give "
                                             r"NamedSharding\(mesh, spec\)"):
        f(X)


def test_dimension_not_divisible(mesh):
    f = spmd.jit(lambda x: x * 2, in_shardings=NS(mesh, P("a")))
    with pytest.raises(ShardingError, match=r"in_shardings\[0\] \(argument leaf 0, "
                                            r"f32\[6,4\]\): dimension 0 of size 6 is not "
                                            r"divisible by 4.*pad the array"):
        f(np.ones((6, 4), np.float32))
    g = spmd.jit(lambda x: x[:3], in_shardings=NS(mesh, P()), out_shardings=NS(mesh, P("a")))
    with pytest.raises(ShardingError, match=r"out_shardings\[0\] \(output leaf 0, f32\[3,4\]\)"
                                            r": dimension 0 of size 3 is not divisible by 4"):
        g(X)


def test_axis_twice_or_unknown(mesh):
    f = spmd.jit(lambda x: x, in_shardings=NS(mesh, P("a", "a")))
    with pytest.raises(ShardingError, match="uses mesh axis 'a' twice"):
        f(X)
    with pytest.raises(ShardingError, match="names axis 'c', not in the mesh"):
        NS(mesh, P("c"))


def test_out_sharding_of_wrong_rank_cannot_be_reached(mesh):
    f = spmd.jit(lambda x: x.sum(0), in_shardings=NS(mesh, P("a")),
                 out_shardings=NS(mesh, P("a", "b")))
    with pytest.raises(PartitionError, match=r"out_shardings\[0\]: spec PartitionSpec\('a', "
                                             r"'b'\) has 2 entries but output 0 has rank 1 "
                                             r"\(shape \(4,\)\); it cannot be reached: give a "
                                             r"spec of at most 1 entries"):
        f(X)


def test_out_shardings_not_a_prefix(mesh):
    f = spmd.jit(lambda x: (x, x), in_shardings=NS(mesh, P("a")),
                 out_shardings=(NS(mesh, P()),) * 3)
    with pytest.raises(PartitionError, match=r"not a pytree prefix of the outputs \(3 "
                                             r"shardings for 2 arrays\); give one sharding "
                                             r"per output"):
        f(X)


def test_constraint_over_another_mesh(mesh, other_mesh):
    f = spmd.jit(lambda x: lax.with_sharding_constraint(x, NS(other_mesh, P("a"))) + 1,
                 in_shardings=NS(mesh, P("a")))
    with pytest.raises(PartitionError, match="with_sharding_constraint at .*use the mesh of "
                                             "the jit's shardings"):
        f(X)


def test_constraint_not_divisible(mesh):
    f = spmd.jit(lambda x: lax.with_sharding_constraint(x[:6], NS(mesh, P("a"))),
                 in_shardings=NS(mesh, P()))
    with pytest.raises(ShardingError, match="with_sharding_constraint at .*dimension 0 of "
                                            "size 6 is not divisible by 4"):
        f(X)


def test_nested_shard_map_over_another_mesh(mesh, other_mesh):
    inner = spmd.shard_map(lambda b: b * 2, mesh=other_mesh, in_specs=P("a"), out_specs=P("a"))
    f = spmd.jit(lambda x: inner(x), in_shardings=NS(mesh, P("a")))
    with pytest.raises(PartitionError, match="a shard_map over .* inside a program "
                                             "partitioned over .*use one mesh"):
        f(X)


def test_bad_jit_options(mesh):
    from spmd.errors import StaticArgumentError

    with pytest.raises(StaticArgumentError, match=r"argument 0 is both static and donated"):
        spmd.jit(lambda x: x, in_shardings=NS(mesh, P()), static_argnums=0, donate_argnums=0)
    with pytest.raises(StaticArgumentError, match=r"static_argnames entries must be parameter "
                                                  r"names \(str\), got 3"):
        spmd.jit(lambda x: x, in_shardings=NS(mesh, P()), static_argnames=(3,))
    with pytest.raises(StaticArgumentError, match=r"donate_argnums=5 is out of range"):
        spmd.jit(lambda x: x, in_shardings=NS(mesh, P()), donate_argnums=5)
    with pytest.raises(TypeError, match="jit: expected a function, got int"):
        spmd.jit(3, in_shardings=NS(mesh, P()))


def test_constraint_contradicting_in_sharding_inserts_collective(mesh):
    """Replicated by constraint, split by in_shardings: an all_gather, never a wrong value."""
    def f(x):
        y = lax.with_sharding_constraint(x, NS(mesh, P()))
        return y * 2 + snp.sum(y)

    jf = spmd.jit(f, in_shardings=NS(mesh, P("a", "b")))
    lo = jf.lower(X)
    assert [c for c, _, _ in lo.collectives()] == ["all_gather", "all_gather"]
    np.testing.assert_allclose(np.asarray(jf(X)), X * 2 + X.sum())


def test_constraint_contradicting_out_sharding_inserts_collective(mesh):
    """Split on dim 0 by constraint, on dim 1 by out_shardings: an all_to_all."""
    f = spmd.jit(lambda x: lax.with_sharding_constraint(x + 1, NS(mesh, P("a"))),
                 in_shardings=NS(mesh, P("a")), out_shardings=NS(mesh, P(None, "a")))
    lo = f.lower(X)
    assert [c for c, _, _ in lo.collectives()] == ["all_to_all"]
    out = f(X)
    np.testing.assert_allclose(np.asarray(out), X + 1)
    assert out.sharding == NS(mesh, P(None, "a"))


def test_forbid_gather_bytes_names_the_value(mesh):
    w = np.ones((4, 16), np.float32)
    f = spmd.jit(lambda x, w: snp.tanh(x @ w), in_shardings=(NS(mesh, P("a")), NS(mesh, P("a"))),
                 forbid_gather_bytes=64)
    with pytest.raises(GatherTooLargeError, match=r"all_gather over \('a',\) of input 1 of "
                                                  r"dot_general \(global f32\[4,16\]\) \(256 "
                                                  r"bytes per device.*forbid_gather_bytes=64"):
        f(X, w)


def test_constraint_needs_a_named_sharding():
    f = spmd.jit(lambda x: lax.with_sharding_constraint(x, P("a")))
    with pytest.raises(PartitionError, match=r"expected NamedSharding\(mesh, spec\) values, "
                                             r"got PartitionSpec\('a'\); a bare PartitionSpec "
                                             r"has no mesh"):
        f(X)
