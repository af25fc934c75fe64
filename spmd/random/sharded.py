"""The ``out_sharding=`` argument of the samplers (as JAX's): the result is placed
with that sharding, each device drawing only its own block.

Inside a traced function the sampler's result gets a ``with_sharding_constraint``
(the partitioner then draws it block by block); called eagerly, the sampler runs
as ``jit(..., out_shardings=out_sharding)``.  A bare ``PartitionSpec`` names axes
of the mesh set with ``spmd.sharding.use_mesh``.
"""

from __future__ import annotations

import functools

from spmd.compiler.core.trace import is_eager
from spmd.shard.explicit.mesh_context import get_mesh, resolve_specs
from spmd.shard.arrays.spec import NamedSharding


def with_out_sharding(fn):
    """Give sampler ``fn(key, ...)`` an ``out_sharding=None`` keyword argument."""
    @functools.wraps(fn)
    def sampler(key, *args, out_sharding=None, **kwargs):
        if out_sharding is None:
            return fn(key, *args, **kwargs)
        # The partitioner stays unloaded until a sampler is given a sharding:
        # import spmd.random does not load it (nor does spmd.numpy).
        from spmd.shard.partition.api import jit, with_sharding_constraint

        if not is_eager():
            return with_sharding_constraint(fn(key, *args, **kwargs), out_sharding)
        sharding = _resolve(out_sharding, fn.__name__)
        return jit(lambda k: fn(k, *args, **kwargs), out_shardings=sharding)(key)

    return sampler


def _resolve(sharding, name):
    from spmd.shard.partition.partitioner import PartitionError  # late: see above

    if get_mesh() is not None:
        sharding = resolve_specs(sharding, f"spmd.random.{name}")
    if not isinstance(sharding, NamedSharding):
        raise PartitionError(f"spmd.random.{name}: out_sharding={sharding!r} must be a "
                             "NamedSharding(mesh, spec) (a bare PartitionSpec needs a mesh "
                             "set with spmd.sharding.use_mesh(mesh))")
    return sharding
