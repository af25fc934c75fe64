"""Eager evaluation of primitives on placed values, or holding a shard_map over processes.

The compiler hands two kinds of eager primitive application to
:func:`eval_primitive` (through its extension point ``EAGER_EVAL``, which the
installer fills): one with a :class:`~spmd.shard.arrays.sharded.ShardedArray` among its
arguments, and every higher-order one (its programs may hold a ``shard_map`` over
processes, which the compiler cannot run).  As in JAX, an eager operation on
arrays placed on a mesh of several devices runs as an SPMD computation over that
mesh:

- ``shard_map`` runs its per-device program (:func:`eval_shard_map`);
- a jitted call (``jit``) is partitioned with its arguments' shardings: across
  processes it runs as the partitioned per-device program on this process's
  blocks; in one process it runs its compiled program on the whole values, and
  its results carry the shardings the partitioner propagated (the call plan
  that :func:`spmd.shard.call.route.route` decides, as for every call);
- any other primitive runs as a (cached) partitioned jit of that one primitive
  (:mod:`spmd.shard.partition.placed_ops`);
- on unplaced values, a ``jit``, loop, ``cond``, ``checkpoint`` or custom
  derivative whose programs hold a ``shard_map`` over processes
  (:func:`spmd.shard.call.spread.spread_equation`) runs partitioned over its mesh; any
  other is left to the compiler.

Every process of a mesh spread over processes must make the same calls in the
same order (they communicate where the shardings require it).

>>> x = spmd.device_put(np.ones((8, 4)), NamedSharding(mesh, P("data")))
>>> (snp.tanh(x) + 1).sharding.spec
PartitionSpec('data',)
"""

from __future__ import annotations

from spmd.compiler.core.jit import jit_p
from spmd.compiler.core.trace import get_aval
from spmd.shard.call.route import mesh_of, route
from spmd.shard.call.spread import one_equation, spread_equation, sub_programs
from spmd.shard.maps.shard_map_rules import _split, shard_map_p
from spmd.shard.partition.placed_ops import run_sharded
from spmd.shard.partition.partitioner import Partitioned


def eval_primitive(prim, args, params):
    """The results of an eager ``prim`` on ``args`` as Arrays, or None to evaluate it
    plainly (the compiler's ``EAGER_EVAL``: asked for a primitive with a sharded Array
    among its operands, and for every higher-order one, whose programs may hold a
    ``shard_map`` over processes)."""
    if prim is shard_map_p:
        return eval_shard_map(args, params)
    if prim is jit_p:  # (placed, holding a shard_map over processes, or neither)
        plan = route(params["program"], args)
        return None if plan is None else plan.run(args)
    mesh = mesh_of(args)
    if mesh is not None:
        return run_sharded(prim, args, params, mesh)
    if prim.higher_order:
        return _eval_higher_order(prim, args, params)
    return None


def _eval_higher_order(prim, args, params):
    """An eager loop, cond, checkpoint or custom derivative whose programs hold a
    shard_map over processes (at any depth): the equation runs as a one-equation
    program partitioned over that mesh; None (compiled as usual) when none does.

    >>> lax.scan(body_calling_a_shard_map, x, ws)   # doctest: +SKIP
    """
    if not any(spread_equation(p) is not None for p in sub_programs(params)):
        return None
    program = one_equation(prim, params, tuple(get_aval(a) for a in args))
    return route(program, args, required=True).run(args)


# ------------------------------------------------ shard_map on placed values
# How a shard_map runs on placed values is the call path's: these are its execution
# rules (its transformation rules are in spmd/shard/maps/shard_map_rules.py).  The shard
# package imports this module, so they are in place whenever shard_map is.

def eval_shard_map(args, params):
    """An eager shard_map: its one-equation program, partitioned as its body says, on
    the call path (results placed by ``out_specs``).  Over processes, each process
    runs its devices on its blocks; in one process the compiled program runs on the
    whole values."""
    params = _split(params, args)  # a partial-manual one: split by the args' shardings
    program = one_equation(shard_map_p, params, tuple(get_aval(a) for a in args))
    part = Partitioned(params["program"], tuple(params["in_specs"]),
                       tuple(params["out_specs"]), [])
    return route(program, args, params["mesh"], part).run(args)
