"""What the collectives inside a primitive's sub-programs reach.

A higher-order primitive (``cond``, ``scan``, a call) carries sub-programs in its
parameters; whether they hold collectives decides at which batch level the primitive
binds (:func:`spmd.compiler.core.trace.bind`) and whether a process may skip it while
its partners run it (``cond``).  Both read the primitives' declared rules only
(``rules.batch_needs_axis``, ``rules.communicates``), so this sits in the core, below
the transformations that ask it too.

>>> from spmd.compiler.core.ir import Program
>>> collective_axes({"program": Program([], [], [])}), communicates({})
(frozenset(), False)
"""

from __future__ import annotations

import weakref

from spmd.compiler.core.ir import ClosedProgram, Program

# ClosedProgram -> (the axis names its collectives, at any depth, communicate over;
# whether it holds a primitive that moves data between devices).
_summary_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def collective_axes(params) -> frozenset:
    """The axes of the collectives inside the sub-programs held by ``params`` (at any
    depth; cached per program).  A higher-order primitive with such a body belongs to
    the batch level of those axes even when none of its operands is batched."""
    return _params_summary(params)[0]


def communicates(params) -> bool:
    """Whether the sub-programs held by ``params`` (at any depth) hold a primitive that
    moves data between devices (``rules.communicates``, declared by the collectives:
    not ``pvary`` or ``axis_index``, which are local).  A process must not skip such a
    primitive while its partners run it."""
    return _params_summary(params)[1]


def _params_summary(params) -> tuple:
    axes, moves = frozenset(), False
    for v in params.values():
        a, m = _value_summary(v)
        axes, moves = axes | a, moves or m
    return axes, moves


def _value_summary(v) -> tuple:
    if isinstance(v, ClosedProgram):
        hit = _summary_cache.get(v)
        if hit is None:
            hit = _summary_cache[v] = _program_summary(v.program)
        return hit
    if isinstance(v, Program):
        return _program_summary(v)
    if isinstance(v, (tuple, list)):
        return _params_summary(dict(enumerate(v)))
    return frozenset(), False


def _program_summary(program) -> tuple:
    axes: set = set()
    moves = False
    for eqn in program.eqns:
        inner_axes, inner_moves = _params_summary(eqn.params)
        moves = moves or bool(eqn.primitive.rules.communicates) or inner_moves
        # Only primitives that receive the level (collectives, and the higher-order
        # ones that re-batch their bodies under it) carry communication along.
        if eqn.primitive.rules.batch_needs_axis:
            axes.update(a for a in eqn.params.get("axes", ()) if isinstance(a, str))
            axes |= inner_axes
    return frozenset(axes), moves
