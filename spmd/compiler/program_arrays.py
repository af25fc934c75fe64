"""What a jitted program's equations say about arrays of upper layers' types.

Two primitive rules, read here for the jit (see :mod:`spmd.compiler.array` for
the Array side of the interface):

- ``rules["output_array"](eqn, i)``: a function turning the plain result ``i``
  of ``eqn`` into the upper layer's array (a ``shard_map`` result keeps its
  ``out_specs`` placement), or None;
- ``rules["needs_arrays"](params)``: True when the equation's eager results are
  not plain buffers (a ``shard_map`` over processes returns this process's
  blocks), so a jitted program holding it cannot be compiled as it is; also
  when it sits in a sub-program (a loop or ``cond`` body, a ``checkpoint``, a
  custom derivative), which is then compiled with it;
- ``rules["eval_program"](params, program, args, required=False)``: how such
  an equation's layer runs a whole program holding it (a ``shard_map`` over
  processes: the program partitioned over that mesh and run as one per-process
  program), or None to run it equation by equation (with ``required=True`` it
  raises instead: the program is one higher-order equation, see
  :func:`eval_higher_order`); ``rules["executed_program"](params, program,
  leading=())``: the program that is then run, for printing (``leading``: the
  values of the program's first arguments where known, e.g. Arrays a jitted
  function closed over).
"""

from __future__ import annotations

import weakref

from spmd.compiler.ir import ClosedProgram
from spmd.errors import SpreadOverProcessesError
from spmd.compiler.trace import bind, get_aval, trace_to_program


def _output_wrappers(closed) -> tuple | None:
    """Per output, the ``output_array`` rule of the equation that made it, if any: a
    function that turns the plain result into an array of an upper layer's type (a
    ``shard_map`` result keeps its ``out_specs`` placement); None when no output has
    one."""
    producer = {o: e for e in closed.program.eqns for o in e.outputs}
    found = []
    for a in closed.program.out_atoms:
        e = producer.get(a)
        rule = e.primitive.rules.get("output_array") if e is not None else None
        found.append(rule(e, e.outputs.index(a)) if rule is not None else None)
    return tuple(found) if any(w is not None for w in found) else None


def needs_arrays(closed: ClosedProgram) -> bool:
    """Whether ``closed`` has an equation that must be evaluated on Arrays rather than
    compiled (a primitive whose ``needs_arrays`` rule says so for its parameters,
    e.g. a ``shard_map`` over processes, which returns this process's blocks), at
    any depth of its sub-programs."""
    hit = _needs_arrays.get(closed)
    if hit is None:
        hit = _needs_arrays[closed] = any(_eqn_needs_arrays(e.primitive, e.params)
                                          for e in closed.program.eqns)
    return hit


def _eqn_needs_arrays(prim, params) -> bool:
    rule = prim.rules.get("needs_arrays")
    if rule is not None and rule(params):
        return True
    return prim.higher_order and any(needs_arrays(p) for p in sub_programs(params))


def sub_programs(params: dict):
    """The closed programs among an equation's parameters (a body, a tuple of
    ``cond`` branches)."""
    for v in params.values():
        if isinstance(v, ClosedProgram):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from (x for x in v if isinstance(x, ClosedProgram))


_needs_arrays: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def output_wrappers(closed: ClosedProgram) -> tuple | None:
    """:func:`_output_wrappers`, cached per program."""
    hit = _wrappers.get(closed, False)
    if hit is False:
        hit = _wrappers[closed] = _output_wrappers(closed)
    return hit


_wrappers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def array_equation(closed: ClosedProgram):
    """The first equation of ``closed`` (at any depth of its sub-programs) whose
    ``needs_arrays`` rule says so and whose layer runs a whole program holding it
    (an ``eval_program`` rule), or None."""
    for e in closed.program.eqns:
        if not _eqn_needs_arrays(e.primitive, e.params):
            continue
        if e.primitive.rules.get("eval_program") is not None:
            rule = e.primitive.rules.get("needs_arrays")
            if rule is not None and rule(e.params):
                return e
        for p in sub_programs(e.params):
            found = array_equation(p)
            if found is not None:
                return found
    return None


def eval_higher_order(prim, args, params) -> list | None:
    """An eager higher-order primitive whose sub-programs hold an equation that needs
    Arrays (a ``shard_map`` over processes in a ``scan`` body): the primitive runs as
    a one-equation program through that equation's ``eval_program`` rule (the
    shard_map's layer partitions it over its mesh), or None when no sub-program
    needs Arrays (then it is compiled as usual).

    >>> lax.scan(body_calling_a_shard_map, x, ws)   # doctest: +SKIP
    """
    if not any(needs_arrays(p) for p in sub_programs(params)):
        return None
    program = _wrapped_equation(prim, params, tuple(get_aval(a) for a in args))
    eqn = array_equation(program)
    rule = eqn.primitive.rules.get("eval_program") if eqn is not None else None
    outs = rule(eqn.params, program, args, required=True) if rule is not None else None
    if outs is None:
        raise SpreadOverProcessesError(
            f"{prim.name}: its body holds an equation that runs on arrays spread over "
            "processes, and no layer runs it as one program here; call that equation "
            f"outside the {prim.name}, or put the {prim.name} inside it")
    return outs


def _wrapped_equation(prim, params, avals) -> ClosedProgram:
    """``bind(prim, *args, **params)`` as a program (cached, so that what its layer
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
