"""``spmd.jit`` (plain, or with shardings: :mod:`spmd.shard.partition.partitioned_jit`) and
``with_sharding_constraint``."""

from __future__ import annotations

import functools
from typing import Callable

from spmd import tree_util
from spmd.compiler.core.trace import axis_scope
from spmd.shard.arrays.spec import NamedSharding
from spmd.shard.call.jit import Jit
from spmd.shard.explicit.mesh_context import get_mesh, resolve_specs
from spmd.shard.partition.constraint import sharding_constraint_p
from spmd.shard.partition.partitioned_jit import sharding_per_leaf
from spmd.shard.partition.partitioner import PartitionError

# ------------------------------------------------------ with_sharding_constraint

def with_sharding_constraint(x, sharding):
    """Ask the partitioner to give ``x`` this sharding here (a pytree and a prefix of
    shardings); the identity elsewhere.

    >>> y = lax.with_sharding_constraint(y, NamedSharding(mesh, P("data", None)))
    """
    leaves, tree = tree_util.tree_flatten(x)
    if get_mesh() is not None:  # bare PartitionSpecs name axes of the context mesh
        sharding = resolve_specs(sharding, "with_sharding_constraint")
    shardings = sharding_per_leaf(sharding, x, "with_sharding_constraint")
    for s in shardings:
        if not isinstance(s, NamedSharding):
            raise PartitionError(f"with_sharding_constraint: expected NamedSharding(mesh, spec) "
                                 f"values, got {s!r}; a bare PartitionSpec has no mesh (give "
                                 "one with spmd.sharding.use_mesh(mesh))")
        _no_manual_axes(s)
    outs = [sharding_constraint_p.bind(v, spec=s.spec, mesh=s.mesh)
            for v, s in zip(leaves, shardings)]
    return tree_util.tree_unflatten(tree, outs)


def _no_manual_axes(s: NamedSharding) -> None:
    """Inside a ``shard_map`` body its manual axes are not the partitioner's: a value
    there is one device's block along them, so a constraint naming them has nothing to
    split (JAX raises too).  Checked here, as it is called, for full- and
    partial-manual bodies alike (the partitioner checks the equations it partitions)."""
    manual = [a for a in s.spec.mesh_axes if (scope := axis_scope(a)) is not None and
              scope.manual]
    if manual:
        raise PartitionError(
            f"with_sharding_constraint: spec {s.spec} names mesh axis {manual[0]!r}, which "
            "is manual here (inside a shard_map over it): a value in the body is one "
            "device's block along its manual axes, and a constraint there places it along "
            "the automatic axes only (those axis_names= leaves out); leave the manual axes "
            "out of its spec")


def jit(fun: Callable | None = None, *, in_shardings=None, out_shardings=None,
        forbid_gather_bytes: int | None = None, static_argnums=None, static_argnames=None,
        donate_argnums=None):
    """``spmd.jit``: compile ``fun``; with shardings, partition it over their mesh.

    >>> step = jit(f, in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))))
    """
    if fun is None:
        return functools.partial(jit, in_shardings=in_shardings, out_shardings=out_shardings,
                                 forbid_gather_bytes=forbid_gather_bytes,
                                 static_argnums=static_argnums, static_argnames=static_argnames,
                                 donate_argnums=donate_argnums)
    if not callable(fun):
        raise TypeError(f"jit: expected a function, got {type(fun).__name__}")
    return Jit(fun, static_argnums, static_argnames, donate_argnums, in_shardings=in_shardings,
               out_shardings=out_shardings, forbid_gather_bytes=forbid_gather_bytes)

