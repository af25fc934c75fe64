"""What a jitted program's equations say about arrays of upper layers' types.

Two primitive rules, read here for the jit (see :mod:`spmd.compiler.array` for
the Array side of the interface):

- ``rules["output_array"](eqn, i)``: a function turning the plain result ``i``
  of ``eqn`` into the upper layer's array (a ``shard_map`` result keeps its
  ``out_specs`` placement), or None;
- ``rules["needs_arrays"](params)``: True when the equation's eager results are
  not plain buffers (a ``shard_map`` over processes returns this process's
  blocks), so a jitted program holding it cannot be compiled as it is;
- ``rules["eval_program"](params, program, args)``: how such an equation's layer
  runs a whole program holding it (a ``shard_map`` over processes: the program
  partitioned over that mesh and run as one per-process program), or None to
  run it equation by equation; ``rules["executed_program"](params, program)``:
  the program that is then run, for printing.
"""

from __future__ import annotations

import weakref

from spmd.compiler.ir import ClosedProgram


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
    e.g. a ``shard_map`` over processes, which returns this process's blocks)."""
    hit = _needs_arrays.get(closed)
    if hit is None:
        hit = _needs_arrays[closed] = any(
            e.primitive.rules.get("needs_arrays") is not None
            and e.primitive.rules["needs_arrays"](e.params) for e in closed.program.eqns)
    return hit


_needs_arrays: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def output_wrappers(closed: ClosedProgram) -> tuple | None:
    """:func:`_output_wrappers`, cached per program."""
    hit = _wrappers.get(closed, False)
    if hit is False:
        hit = _wrappers[closed] = _output_wrappers(closed)
    return hit


_wrappers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def array_equation(closed: ClosedProgram):
    """The first equation of ``closed`` whose ``needs_arrays`` rule says so, or None."""
    for e in closed.program.eqns:
        rule = e.primitive.rules.get("needs_arrays")
        if rule is not None and rule(e.params):
            return e
    return None
