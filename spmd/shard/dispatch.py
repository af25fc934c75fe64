"""Eager evaluation of primitives that have sharded Arrays among their arguments.

The compiler hands every eager primitive application with a
:class:`~spmd.shard.sharded.ShardedArray` argument to :func:`eval_primitive`
(through ``Array._eval_primitive``).  As in JAX, an eager operation on arrays
placed on a mesh of several devices runs as an SPMD computation over that mesh:

- ``shard_map`` runs its per-device program (:func:`spmd.shard.shard_map.eval_shard_map`);
- a jitted call (``jit``) is partitioned with its arguments' shardings: across
  processes it runs as the partitioned per-device program on this process's
  blocks; in one process it runs its compiled program on the whole values, and
  its results carry the shardings the partitioner propagated;
- any other primitive runs as a (cached) partitioned jit of that one primitive
  (:mod:`spmd.shard.partition.eager`).

Every process of a mesh spread over processes must make the same calls in the
same order (they communicate where the shardings require it).

>>> x = spmd.device_put(np.ones((8, 4)), NamedSharding(mesh, P("data")))
>>> (snp.tanh(x) + 1).sharding.spec
PartitionSpec('data',)
"""

from __future__ import annotations

import weakref

from spmd.compiler.jit import jit_p, output_wrappers
from spmd.compiler.trace import eval_plain
from spmd.shard.sharded import ShardedArray, from_whole
from spmd.shard.spec import NamedSharding


def mesh_of(args):
    """The one mesh of more than one device that the arguments are placed on, or None
    (no such argument, or several meshes: then computed on whole values)."""
    mesh = None
    for a in args:
        s = a._sharding if isinstance(a, ShardedArray) else None
        if isinstance(s, NamedSharding) and s.mesh.size > 1:
            if mesh is not None and s.mesh != mesh:
                return None
            mesh = s.mesh
    return mesh


def eval_primitive(prim, args, params):
    """The results of ``prim`` on ``args`` as Arrays, or None to evaluate it plainly."""
    from spmd.shard.partition.eager import run_sharded
    from spmd.shard.shard_map import eval_shard_map, shard_map_p

    if prim is shard_map_p:
        return eval_shard_map(args, params)
    mesh = mesh_of(args)
    if mesh is None:
        return None
    if prim is jit_p:
        return _eval_jit(args, params, mesh)
    return run_sharded(prim, args, params, mesh)


# Per program: {(mesh, in specs): partitioned result}
_partitioned: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _in_specs(args, mesh) -> tuple:
    return tuple(a._sharding.spec if isinstance(a, ShardedArray)
                 and isinstance(a._sharding, NamedSharding) and a._sharding.mesh == mesh
                 else None for a in args)


def _partition(program, mesh, in_specs):
    from spmd.shard.partition.partitioner import partition

    per = _partitioned.get(program)
    if per is None:
        per = _partitioned[program] = {}
    key = (mesh, in_specs)
    hit = per.get(key)
    if hit is None:
        hit = per[key] = partition(program, mesh, list(in_specs),
                                   [None] * len(program.out_avals))
    return hit


def _eval_jit(args, params, mesh):
    """A jitted program on sharded arguments: partitioned with their shardings."""
    from spmd.errors import SpmdError
    from spmd.shard.execute import call

    program = params["program"]
    in_specs = _in_specs(args, mesh)
    if mesh.is_multi_process:
        part = _partition(program, mesh, in_specs)
        return call(part.body, mesh, part.in_specs, part.out_specs, args)
    # One process: the whole values are here, so the compiled program runs on them
    # as it is; the partitioner only says where its results are placed.
    outs = eval_plain(jit_p, args, params)
    try:
        out_specs = _partition(program, mesh, in_specs).out_specs
    except SpmdError:  # (PartitionError and the like)
        # No propagation for this program: its shard_map and constrained outputs
        # keep their placements, the others are left unplaced (whole values).
        wrappers = output_wrappers(program) or [None] * len(outs)
        return [o if w is None else w(o) for o, w in zip(outs, wrappers)]
    return [from_whole(o.value, o.aval, NamedSharding(mesh, s))
            for o, s in zip(outs, out_specs)]
