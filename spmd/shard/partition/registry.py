"""The partition decision of every primitive, keyed by the primitive object.

The partitioner (:mod:`spmd.shard.partition.partitioner`) looks each equation's
primitive up here and nowhere else: there is no list of names and no fallback.
A primitive without a decision is an error at partition time
(:class:`MissingPartitionRuleError`), and ``tests/partition/test_registry.py``
fails while any registered primitive lacks one.  A decision is one of:

- :class:`Propagate`: a propagation rule (see :mod:`spmd.shard.partition.rules`
  for its signature) that maps the inputs' placements to the placements it wants
  them in, its outputs' placements and its local parameters;
- :class:`Replicate`: inputs gathered, every device computes the whole result;
  always correct, so it is the explicit choice where splitting is not worth a
  rule, and its ``reason`` says why;
- :class:`Structural`: a primitive with sub-programs (calls, control flow, a
  nested ``shard_map``, the sharding constraint), partitioned by a function that
  sees the evaluator itself;
- :class:`Unreachable`: a primitive that cannot occur in a global program (a
  collective lives only in ``shard_map`` bodies, which the partitioner keeps
  whole); meeting one is an internal error naming ``reason``.

A decision is also the primitive's one sharding declaration for explicit mode
(``AxisType.Explicit`` axes, where a sharding is part of an array's type): its
``explicit`` field is the rule's explicit-mode extension, and where it is None the
type is derived from the decision itself (:func:`spmd.shard.explicit.rules.rule_for`):
a ``Propagate`` result's type is the placement its rule gives the result from
operands placed as typed, a ``Replicate`` result is whole, an ``Unreachable``
primitive is an error.  An extension (``rules_explicit.py``) exists where a typed
operand may not move as propagation would move it, and the type must say so: JAX's
merge of agreeing splits, or an error naming the fix (``reshard``, or
``out_sharding=`` where the result would be ambiguous).

Decisions are registered beside the rules they use (``rules.py``,
``rules_index.py``, ``control.py``, ``partitioner.py``, ``api.py``,
``rules_collectives.py``); importing :mod:`spmd.shard.partition` registers them all.

>>> from spmd.compiler.ops.elementwise import tanh_p
>>> type(decision(tanh_p)).__name__
'Propagate'
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Union

from spmd.compiler.core.primitives import Primitive
from spmd.errors import SpmdError


class PartitionError(SpmdError, ValueError):
    """Shardings that cannot be honoured (wrong count, mesh, rank...)."""


class MissingPartitionRuleError(PartitionError, NotImplementedError):
    """A primitive reached the partitioner without a partition decision."""


class Propagate(NamedTuple):
    """``rule(pls, avals_in, avals_out, mesh, **params)`` decides the placements.

    ``specs_flow_back``: an input of the output's shape may take the output's
    spec when the partitioner infers unspecified input shardings backward
    (elementwise primitives).  ``source``: see below."""

    rule: Callable
    specs_flow_back: bool = False
    # ``source(ev, eqn, vals, pls, wanted_spec)``: for a primitive with no operand of
    # its output's shape (random_bits), computes only the block where the output is
    # wanted; None falls back to ``rule``.
    source: Callable | None = None
    # The explicit-mode extension ``explicit(avals_in, types_in, avals_out, mesh,
    # params) -> [types_out]``; None: the placements ``rule`` gives the results.
    explicit: Callable | None = None


class Replicate(NamedTuple):
    """Computed whole on every device; ``reason`` says why no rule splits it.
    ``explicit``: the results' types (None: whole)."""

    reason: str
    explicit: Callable | None = None


class Structural(NamedTuple):
    """``fn(evaluator, eqn, vals, pls) -> [(value, placement), ...]``.  ``explicit``:
    the results' types, where the decision's module can say them (None: declared by
    :func:`spmd.shard.explicit.rules.register`, beside the typing of sub-programs)."""

    fn: Callable
    explicit: Callable | None = None


class Unreachable(NamedTuple):
    """Never in a global program; ``reason`` says why."""

    reason: str


Decision = Union[Propagate, Replicate, Structural, Unreachable]

# The table: one decision per primitive object.
DECISIONS: dict[Primitive, Decision] = {}


def register(prim: Primitive, decision: Decision) -> None:
    """Declare how ``prim`` is partitioned (once per primitive).

    >>> register(my_p, Replicate("a sequential scan over the whole array"))  # doctest: +SKIP
    """
    if not isinstance(prim, Primitive):
        raise TypeError(f"register: prim must be a Primitive, got {prim!r}")
    if not isinstance(decision, (Propagate, Replicate, Structural, Unreachable)):
        raise TypeError(f"register: the decision for {prim.name} must be Propagate, "
                        f"Replicate, Structural or Unreachable, got {decision!r}")
    if isinstance(decision, (Replicate, Unreachable)) and not decision.reason:
        raise ValueError(f"register: the {type(decision).__name__} decision for {prim.name} "
                         "needs a reason (why no rule splits it)")
    old = DECISIONS.get(prim)
    if old is not None and old != decision:
        raise ValueError(f"register: {prim.name} already has a partition decision ({old}); "
                         "a primitive has exactly one")
    DECISIONS[prim] = decision


def register_all(table: dict) -> None:
    """``register`` each ``{primitive: decision}`` of ``table``."""
    for prim, decision in table.items():
        register(prim, decision)


def decision(prim: Primitive) -> Decision:
    """The decision for ``prim``, or MissingPartitionRuleError naming the fix."""
    d = DECISIONS.get(prim)
    if d is None:
        raise MissingPartitionRuleError(
            f"primitive {prim.name!r} has no partition decision, so jit with shardings (and "
            "eager operations on sharded Arrays) cannot place it; register one with "
            "spmd.shard.partition.registry.register(prim, Propagate(rule)) or, where "
            "computing it whole is right, register(prim, Replicate('why'))")
    return d


def missing(prims) -> list[str]:
    """The names of ``prims`` without a decision (for the registry test)."""
    return sorted(p.name for p in prims if p not in DECISIONS)
