"""How a call on placed values runs: the one routing decision and its one cache.

Every front door turns what it is given into a program and hands it here with
the call's leaves: ``spmd.jit`` its traced program (:mod:`spmd.shard.call.jit`; a
jit with shardings also the partition it made at trace time), an eager ``jit``
equation its program, an eager loop, ``cond``, ``checkpoint`` or custom
derivative its one-equation program, an eager ``shard_map`` its one-equation
program with its body as the partition (:mod:`spmd.shard.call.dispatch`; an eager
primitive on a sharded array is a jit of that primitive,
:mod:`spmd.shard.partition.placed_ops`).  :func:`route` decides once per program and
call signature which call plan (:mod:`spmd.shard.call.plan`) runs it:

- **given partition** (a jit with shardings, a shard_map's body): over
  processes each process runs its blocks; in one process the whole program runs
  on the whole values, its results placed by the out specs (:func:`call.build`);
- **placed on a mesh** (a leaf on a mesh of several devices, or a ``shard_map``
  over processes inside, :mod:`spmd.shard.call.spread`): the program is
  partitioned with the leaves' shardings, then as above; where the partitioner
  cannot take it, over processes each equation runs as an SPMD computation of
  its own (:class:`ByEquation`; an error where the program is that one equation),
  and in one process the program runs on the whole values, unplaced -- either
  said once, with the partitioner's error;
- **results placed by their equations** (a ``shard_map``'s or a constraint's):
  the compiled program, its results placed by those equations' rules;
- **none** (``None``): the compiler runs it as any program.

The cache is keyed on the program (weakly: it lives as long as the program),
the given mesh and partition, and each leaf's token (:func:`call.leaf_token`:
a placed Array's placement token, a numpy array's shape and dtype, else type
and aval), which fix everything the decision reads.

>>> plan = route(program, leaves)            # doctest: +SKIP
>>> outs = plan.run(leaves)                  # (None: the compiler's own run)
"""

from __future__ import annotations

import warnings
import weakref

from spmd.compiler.core.trace import eval_program
from spmd.compiler.passes.pipeline import lower_for_execution, optimize
from spmd.errors import SpmdError, SpreadOverProcessesError
from spmd.shard.arrays.sharded import ShardedArray
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec
from spmd.shard.call import plan as call
from spmd.shard.call.plan import leaf_token
from spmd.shard.call.spread import output_wrappers, spread_equation
from spmd.shard.maps.stacked import _unclosed, process_program
from spmd.shard.partition.partitioner import partition
from spmd.shard.partition.registry import MissingPartitionRuleError

# Per program: {(mesh, partition, required, the leaves' tokens): call plan or None}.
_routes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_NONE = object()


def route(program, leaves, mesh=None, part=None, required: bool = False):
    """The call plan of ``program`` on leaves like ``leaves`` (decided on a miss, see
    the module docstring), or None where the compiler runs it.  ``mesh`` and ``part``:
    the mesh and partition (``body``, ``in_specs``, ``out_specs``) it was partitioned
    with already; ``required``: ``program`` is one loop, cond, checkpoint or
    custom-derivative equation whose body holds a shard_map over processes, which
    cannot run equation by equation (it is that equation)."""
    per = _routes.get(program)
    if per is None:
        per = _routes[program] = {}
    given = None if part is None else (part.body, tuple(part.in_specs), tuple(part.out_specs))
    key = (mesh, given, required, tuple(map(leaf_token, leaves)))
    plan = per.get(key, _NONE)
    if plan is _NONE:  # (a failed decision raises, and is not kept)
        plan = per[key] = decide(program, leaves, mesh, part, required)
    return plan


def decide(program, leaves, mesh=None, part=None, required: bool = False):
    """The one decision of :func:`route` (uncached): which plan runs ``program``."""
    if part is not None:
        return call.build(part, program, mesh, leaves)
    mesh = mesh_of(leaves)
    if mesh is None:
        eqn = spread_equation(program)  # a shard_map over processes inside
        mesh = None if eqn is None else eqn.params["mesh"]
    if mesh is None:
        wrappers = output_wrappers(program)
        # Results placed by a shard_map's out specs or a constraint; else the compiler's.
        return None if wrappers is None else call.unplaced(program, leaves, wrappers)
    try:
        part = _partition(program, mesh, _in_specs(leaves, mesh))
    except MissingPartitionRuleError:
        raise  # a primitive without a rule: a gap to fill, never worked around
    except SpmdError as e:
        return _fallback(program, leaves, mesh, e, required)
    return call.build(part, program, mesh, leaves)


def _fallback(program, leaves, mesh, error: Exception, required: bool):
    """The plan of a program the partitioner cannot take as a whole (said once per plan,
    with the partitioner's ``error``)."""
    if mesh.is_multi_process:
        if required:
            what = program.program.eqns[0].primitive.name if program.program.eqns \
                else "program"
            raise SpreadOverProcessesError(
                f"{what}: its body holds a shard_map over {mesh!r}, spread over processes, "
                "which runs only as part of one program partitioned over that mesh (each "
                f"process computes its own blocks), and this {what} cannot be partitioned "
                f"over it: {error}. Fix that (e.g. use one mesh for every shard_map and "
                f"sharding in it), or call the shard_map outside the {what}") from error
        # Slower than one partitioned program; each equation's collectives agree on
        # their own.
        _say_fallback("a jitted program over processes runs equation by equation: the "
                      "partitioner cannot take it as a whole", error,
                      "Each equation is then an SPMD computation of its own (right, but "
                      "slower than one program)")
        return ByEquation(program, error)
    # The whole values are here: the program runs as it is, and its results are left
    # unplaced (a shard_map's keep its out specs).
    _say_fallback("a jitted call on placed arrays returns unplaced results: the "
                  "partitioner cannot take its program", error,
                  "The values are computed whole and are right")
    return call.unplaced(program, leaves, output_wrappers(program))


def _say_fallback(what: str, reason: Exception, consequence: str) -> None:
    """The one warning of a plan that falls back (``what``), with the partitioner's
    error and what the fallback means."""
    warnings.warn(f"{what} ({type(reason).__name__}: {reason}). {consequence}; see "
                  "docs/architecture.md, 'The one call path'", UserWarning, stacklevel=8)


class ByEquation:
    """The plan of a program over processes that the partitioner cannot take as a
    whole (e.g. a ``shard_map`` over another mesh of the same devices): each equation
    runs as an SPMD computation of its own.  ``reason``: the partitioner's error."""

    __slots__ = ("program", "reason")

    def __init__(self, program, reason: Exception):
        self.program = program
        self.reason = reason

    def __call__(self, leaves) -> list:
        return eval_program(self.program, *leaves)

    run = __call__


def mesh_of(args):
    """The one mesh of more than one device that the arguments are placed on, or None
    (no such argument, or several meshes: then computed on whole values)."""
    mesh = None
    for a in args:
        s = a._sharding if isinstance(a, ShardedArray) else None
        if isinstance(s, NamedSharding) and s.mesh.size > 1:
            if mesh is not None and s.mesh is not mesh and s.mesh != mesh:
                return None
            mesh = s.mesh
    return mesh


# Per program: {(mesh, in specs): partitioned result}
_partitioned: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _in_specs(args, mesh) -> tuple:
    return tuple(a._sharding.spec if isinstance(a, ShardedArray)
                 and isinstance(a._sharding, NamedSharding) and a._sharding.mesh == mesh
                 else None for a in args)


def _partition(program, mesh, in_specs):
    """``program`` partitioned over ``mesh`` for these input specs (cached per program;
    a failure raises, and is not cached: the caller's plan keeps what it decided)."""
    per = _partitioned.get(program)
    if per is None:
        per = _partitioned[program] = {}
    key = (mesh, in_specs)
    hit = per.get(key)
    if hit is None:
        hit = per[key] = partition(program, mesh, list(in_specs),
                                   [None] * len(program.out_avals))
    return hit


def executed_program(program, mesh, leading=()):
    """The per-process program that runs ``program`` over ``mesh`` for inputs this
    process holds whole (numpy values), as lowered for execution (for printing).
    ``leading``: the values of its first arguments where known (Arrays a jitted
    function closed over, passed with their shardings)."""
    n_rest = len(program.in_avals) - len(leading)
    part = _partition(program, mesh, _in_specs(leading, mesh) + (None,) * n_rest)
    body = part.body
    in_specs = tuple(part.in_specs)
    if body.consts:
        in_specs = (PartitionSpec(),) * len(body.consts) + in_specs
        body = _unclosed(body)
    # An Array spread over processes comes as this process's blocks (see call.over_processes).
    n_whole = len(in_specs) - len(program.in_avals)
    kinds = ("whole",) * n_whole + tuple(
        "blocks" if isinstance(x, ShardedArray) and x._value is None else "whole"
        for x in leading) + ("whole",) * n_rest
    return lower_for_execution(optimize(process_program(body, mesh, in_specs,
                                                         tuple(part.out_specs), kinds)))
