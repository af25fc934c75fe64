"""What a traced program holds that the compiler cannot run by itself.

Two facts about a program, read by the shard layer's call path
(:mod:`spmd.shard.call.jit`, :mod:`spmd.shard.call.dispatch`) and by nothing below it:

- :func:`spread_equation`: the first ``shard_map`` over a mesh spread over
  processes, at any depth of its sub-programs (a loop or ``cond`` body, a
  ``checkpoint``, a custom derivative, a nested ``jit``).  Its eager results are
  this process's blocks, not plain buffers, so a program holding one cannot be
  compiled as it is: it runs partitioned over that mesh, as one per-process
  program;
- :func:`output_wrappers`: per output, how the plain result becomes a placed
  Array (``rules.output_array(eqn, i)`` of the equation that made it: a
  ``shard_map`` result keeps its ``out_specs`` placement, a sharding constraint
  its spec).

Both are cached per program (programs are keys by identity).

>>> spread_equation(jit(step).trace(x).jaxpr)     # doctest: +SKIP
shard_map[mesh=Mesh('d': 2, over 2 processes), ...]
"""

from __future__ import annotations

import weakref

from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.trace import bind, trace_to_program
from spmd.shard.maps.shard_map_rules import shard_map_p


def spread_equation(closed: ClosedProgram):
    """The first ``shard_map`` equation of ``closed`` over processes, at any depth of
    its sub-programs, or None."""
    hit = _spread.get(closed, False)
    if hit is False:
        hit = _spread[closed] = _find_spread(closed)
    return hit


def _find_spread(closed: ClosedProgram):
    for e in closed.program.eqns:
        if e.primitive is shard_map_p and e.params["mesh"].is_multi_process:
            return e
        if e.primitive.higher_order:
            for p in sub_programs(e.params):
                found = spread_equation(p)
                if found is not None:
                    return found
    return None


_spread: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def sub_programs(params: dict):
    """The closed programs among an equation's parameters (a body, a tuple of
    ``cond`` branches)."""
    for v in params.values():
        if isinstance(v, ClosedProgram):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from (x for x in v if isinstance(x, ClosedProgram))


def output_wrappers(closed: ClosedProgram) -> tuple | None:
    """Per output, the ``output_array`` rule's function for the equation that made it
    (None where it has none), or None when no output has one."""
    hit = _wrappers.get(closed, False)
    if hit is False:
        hit = _wrappers[closed] = _output_wrappers(closed)
    return hit


def _output_wrappers(closed) -> tuple | None:
    producer = {o: e for e in closed.program.eqns for o in e.outputs}
    found = []
    for a in closed.program.out_atoms:
        e = producer.get(a)
        rule = e.primitive.rules.output_array if e is not None else None
        found.append(rule(e, e.outputs.index(a)) if rule is not None else None)
    return tuple(found) if any(w is not None for w in found) else None


_wrappers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def one_equation(prim, params, avals) -> ClosedProgram:
    """``bind(prim, *args, **params)`` as a program (cached, so that what the call path
    builds for it, e.g. a partitioned program, is cached too)."""
    try:
        key = (prim, tuple(sorted(params.items())), avals)
        hit = _wrapped.get(key)
    except TypeError:  # unhashable parameters: traced anew each call
        key, hit = None, None
    if hit is None:
        def one(*xs):
            out = bind(prim, *xs, **params)
            return list(out) if prim.multiple_results else [out]

        hit = trace_to_program(one, list(avals))
        if key is not None:
            if len(_wrapped) >= 1024:
                _wrapped.clear()
            _wrapped[key] = hit
    return hit


_wrapped: dict = {}
