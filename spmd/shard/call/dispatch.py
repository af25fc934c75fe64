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
  its results carry the shardings the partitioner propagated;
- any other primitive runs as a (cached) partitioned jit of that one primitive
  (:mod:`spmd.shard.partition.eager`);
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

import warnings
import weakref

from spmd.compiler.core.jit import jit_p
from spmd.compiler.core.trace import eval_plain, eval_program, get_aval
from spmd.shard.arrays.sharded import ShardedArray, from_whole, placed
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec
from spmd.compiler.passes.pipeline import lower_for_execution, optimize
from spmd.errors import SpmdError
from spmd.shard.call import plan as call
from spmd.shard.call.plan import leaf_token
from spmd.shard.maps.stacked import _unclosed, process_program
from spmd.shard.partition.eager import run_sharded
from spmd.shard.partition.partitioner import partition
from spmd.shard.partition.registry import MissingPartitionRuleError
from spmd.shard.maps.shard_map_rules import _split, shard_map_p
from spmd.shard.call.spread import one_equation, output_wrappers, spread_equation, sub_programs


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


def eval_primitive(prim, args, params):
    """The results of an eager ``prim`` on ``args`` as Arrays, or None to evaluate it
    plainly (the compiler's ``EAGER_EVAL``: asked for a primitive with a sharded Array
    among its operands, and for every higher-order one, whose programs may hold a
    ``shard_map`` over processes)."""
    if prim is shard_map_p:
        return eval_shard_map(args, params)
    mesh = mesh_of(args)
    if prim is jit_p:
        return _eval_jit(args, params, mesh) if mesh is not None else \
            _eval_unplaced_jit(args, params)
    if mesh is not None:
        return run_sharded(prim, args, params, mesh)
    if prim.higher_order:
        return _eval_higher_order(prim, args, params)
    return None


def _eval_unplaced_jit(args, params):
    """A ``jit`` equation bound eagerly on unplaced values (the known part of a
    gradient, a nested jit run by equation): a program holding a shard_map over
    processes runs partitioned over its mesh; one whose results carry a placement
    (a shard_map's or a constraint's) runs compiled and places them; else None
    (compiled, unplaced)."""
    program = params["program"]
    eqn = spread_equation(program)
    if eqn is not None:
        return eval_jit_over(program, args, eqn.params["mesh"])
    wrappers = output_wrappers(program)
    if wrappers is None:
        return None
    return [a if w is None else w(a)
            for a, w in zip(eval_plain(jit_p, args, params), wrappers)]


def _eval_higher_order(prim, args, params):
    """An eager loop, cond, checkpoint or custom derivative whose programs hold a
    shard_map over processes (at any depth): the equation runs as a one-equation
    program partitioned over that mesh; None (compiled as usual) when none does.

    >>> lax.scan(body_calling_a_shard_map, x, ws)   # doctest: +SKIP
    """
    eqn = next((e for e in map(spread_equation, sub_programs(params)) if e is not None), None)
    if eqn is None:
        return None
    program = one_equation(prim, params, tuple(get_aval(a) for a in args))
    return eval_jit_over(program, args, eqn.params["mesh"], required=True)


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


def plan_for(program, leaves, mesh):
    """The call plan (:mod:`spmd.shard.call.plan`) of the jitted ``program`` on leaves like
    ``leaves`` placed on ``mesh``: partitioned with their shardings over processes;
    compiled on the whole values, its results placed as propagation says, in one."""
    in_specs = _in_specs(leaves, mesh)
    try:
        part = _partition(program, mesh, in_specs)
    except MissingPartitionRuleError:
        raise  # a primitive without a rule: a gap to fill, never worked around
    except SpmdError as e:
        # Said once per plan (a plan is built once per call signature).
        if mesh.is_multi_process:
            # Slower than one partitioned program; each equation's collectives agree
            # on their own.
            _say_fallback("a jitted program over processes runs equation by equation: the "
                          "partitioner cannot take it as a whole", e,
                          "Each equation is then an SPMD computation of its own (right, but "
                          "slower than one program)")
            return ByEquation(program, e)
        # The whole values are here: the program runs as it is, and its results are
        # left unplaced (a shard_map's keep its out specs).
        _say_fallback("a jitted call on placed arrays returns unplaced results: the "
                      "partitioner cannot take its program", e,
                      "The values are computed whole and are right")
        return call.unplaced(program, leaves, output_wrappers(program))
    return call.build(part, program, mesh, leaves)


def _say_fallback(what: str, reason: Exception, consequence: str) -> None:
    """The one warning of a plan that falls back (``what``), with the partitioner's
    error and what the fallback means."""
    warnings.warn(f"{what} ({type(reason).__name__}: {reason}). {consequence}; see "
                  "docs/architecture.md, 'The one call path'", UserWarning, stacklevel=6)


# Per program: {the leaves' key: plan} for jit equations bound eagerly on placed values.
_bound_plans: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _eval_jit(args, params, mesh):
    """A jitted program on sharded arguments, bound eagerly (a jit of the compiler
    alone, an equation evaluated by itself): the same plans as ``spmd.jit``'s."""
    program = params["program"]
    per = _bound_plans.get(program)
    if per is None:
        per = _bound_plans[program] = {}
    key = (mesh, tuple(map(leaf_token, args)))
    plan = per.get(key)
    if plan is None:
        plan = per[key] = plan_for(program, args, mesh)
    return plan(args)


def eval_jit_over(program, args, mesh, required: bool = False):
    """``program`` (a jitted program holding a shard_map over the processes of
    ``mesh``) run partitioned over ``mesh`` on this process's data, or None when the
    partitioner cannot take it (then it runs equation by equation).  With
    ``required`` (``program`` is one loop, cond, checkpoint or custom-derivative
    equation whose body holds the shard_map: equation by equation is itself) that
    case raises :class:`~spmd.errors.SpreadOverProcessesError` instead.  Either way
    the fallback is said, as :func:`plan_for`'s is, and a primitive without a
    partition rule raises (a gap to fill, never worked around)."""
    try:
        _partition(program, mesh, _in_specs(args, mesh))
    except MissingPartitionRuleError:
        raise
    except SpmdError as e:
        if not required:
            _say_fallback("a jitted program holding a shard_map over processes runs equation "
                          "by equation: the partitioner cannot take it as a whole", e,
                          "Each equation is then an SPMD computation of its own (right, but "
                          "slower than one program)")
            return eval_program(program, *args)
        from spmd.errors import SpreadOverProcessesError

        what = program.program.eqns[0].primitive.name if program.program.eqns else "program"
        raise SpreadOverProcessesError(
            f"{what}: its body holds a shard_map over {mesh!r}, spread over processes, "
            "which runs only as part of one program partitioned over that mesh (each "
            f"process computes its own blocks), and this {what} cannot be partitioned "
            f"over it: {e}. Fix that (e.g. use one mesh for every shard_map and "
            f"sharding in it), or call the shard_map outside the {what}") from e
    return _eval_jit(args, {"program": program}, mesh)


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


# ------------------------------------------------ shard_map on placed values
# How a shard_map runs on placed values is the call path's: these are its execution
# rules (its transformation rules are in spmd/shard/maps/shard_map_rules.py).  The shard
# package imports this module, so they are in place whenever shard_map is.

# Per body program: {(mesh, specs, the leaves' tokens): call plan} of shard_map
# equations evaluated eagerly over processes.
_eager_plans: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def eval_shard_map(args, params):
    """An eager shard_map: results placed by ``out_specs``.  Over processes, each
    process runs its devices on its blocks (a call plan of :mod:`spmd.shard.call.plan`,
    kept per body and leaves); in one process the compiled program runs on the whole
    values."""
    params = _split(params, args)  # a partial-manual one: split by the args' shardings
    mesh, out_specs = params["mesh"], params["out_specs"]
    if mesh.is_multi_process:
        body, in_specs = params["program"], tuple(params["in_specs"])
        per = _eager_plans.get(body)
        if per is None:
            per = _eager_plans[body] = {}
        key = (mesh, in_specs, tuple(out_specs), tuple(map(leaf_token, args)))
        plan = per.get(key)
        if plan is None:
            plan = per[key] = call.over_processes(body, in_specs, out_specs, mesh, args)
        return plan.run(args)
    outs = eval_plain(shard_map_p, args, params)
    return [from_whole(o.value, o.aval, NamedSharding(mesh, s)) for o, s in zip(outs, out_specs)]


def _output_array(eqn, i):
    """A jitted shard_map returns Arrays placed by its out_specs, as the eager one does
    (and as in JAX)."""
    s = NamedSharding(eqn.params["mesh"], eqn.params["out_specs"][i])
    return lambda a: placed(a, s)


# A jitted shard_map's results keep their out_specs placement (spmd.shard.call.spread).
shard_map_p.rules.output_array = _output_array
