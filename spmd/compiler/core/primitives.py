"""Primitives and the registry of their rules.

A :class:`Primitive` is one object; every rule about it that this layer knows
(implementation, abstract evaluation, jvp, transpose, batching, varying-axes
typing, code emission) is registered on it beside its definition, and the
registry ``PRIMITIVES`` lets a test walk all of them and check that none lacks a
rule.  How a primitive is partitioned is decided by the sharding layer, in its own
table keyed by the primitive (:mod:`spmd.shard.partition.registry`): its rules
speak of placements on a mesh, which this layer does not know.

Rule signatures (``params`` are the equation's static keyword parameters):

- ``impl(xp, *arrays, **params)``: compute on concrete arrays of the array
  module ``xp`` (numpy or cupy); returns an array, or a sequence when
  ``multiple_results``.
- ``abstract_eval(*avals, **params)``: the output aval(s).  Avals' ``vma`` is
  handled by the ``vma`` rule, not here (default: the union of the inputs').
- ``jvp(primals, tangents, **params) -> (primal_out, tangent_out)``: tangents
  may be :data:`spmd.compiler.transforms.ad.zero` instances.
- ``transpose(cts, *args, **params)``: ``args`` hold :class:`UndefinedPrimal`
  for linear inputs; returns one cotangent (or ``None``) per argument.
- ``batch(args, dims, **params) -> (outs, out_dims)``: ``dims`` are the batch
  axis of each argument or ``None``.
- ``emit(names, **params) -> str``: optional; a Python expression over the
  input names for the code generator (default: call ``impl``).
- ``unreduced``: how an unreduced operand (each device holding a summand of it: JAX's
  ``P(unreduced=...)``) passes through, for a primitive linear in it (one of
  :data:`UNREDUCED_POLICIES`); None (the default) refuses such an operand.  Read by the
  manual-axes typing of ``shard_map`` bodies and by the explicit-sharding types.

Traits: each primitive declares, where it is created, the properties the generic
passes (code generation, overlap, remat policies, tracing) act on:
``Primitive("reshape", traits=("view",))``, or ``traits=()`` for none.  The passes
read ``prim.traits``, never a primitive's name, so a new primitive gets a pass's
treatment by declaring the trait.  The vocabulary is :data:`TRAITS` (an unknown
trait is an error); a primitive created without ``traits=`` has
``traits_declared`` False, which ``tests/compiler/test_traits.py`` reports.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

# Binding finds the trace of the arguments; the traces know no primitive's rules.
from spmd.compiler.core.trace import bind as trace_bind

PRIMITIVES: dict[str, "Primitive"] = {}

# The vocabulary of traits: name -> what a primitive declaring it promises, and which
# pass acts on it (docs/architecture.md, "Primitives and their rules", has the table).
UNREDUCED_POLICIES: dict[str, str] = {
    "keep": "linear in its one array operand: the result has the operand's summands",
    "joint": "linear in all operands together (add): they are unreduced over the same axes",
    "one": "linear in each operand apart (mul): at most one operand is unreduced",
    "first": "linear in its first operand only (div): the others are not unreduced",
    "float": "linear between inexact dtypes (convert_element_type): not to an integer",
}

TRAITS: dict[str, str] = {
    "view": "its code may return a view of its operand rather than a new buffer "
            "(codegen never writes its result into a flat buffer; overlap never counts "
            "it as heavy)",
    "implicit_broadcast": "its code is a numpy-broadcasting elementwise function of its "
                          "operands (a ufunc, xp.where): codegen may pass an operand with "
                          "size-1 axes in place of a broadcast_in_dim of it",
    "broadcast": "it broadcasts its one operand to params['shape'], operand axis k going "
                 "to result axis params['broadcast_dimensions'][k] (broadcast_in_dim's "
                 "params): codegen may leave it implicit, and a pvary of its result is "
                 "applied to its operand instead",
    "fresh_result": "its code returns a new buffer that nothing else references, though "
                    "it is no ufunc call (codegen may reuse the buffer, or write into a "
                    "dead one through its emit_avals rule's out=)",
    "same_order": "its result is its one operand's elements in the same order, in another "
                  "shape (row kernels and recomputation look through it)",
    "sum": "it sums its one operand over params['axes'] (a row kernel loops over the rows "
           "of a sum over the trailing axes)",
    "dot": "a matrix product with dot_general's dimension_numbers param: the checkpoint "
           "policies dots_saveable and dots_with_no_batch_dims_saveable save its result",
}



@dataclasses.dataclass(slots=True)
class Rules:
    """A primitive's further rules, beyond the ones every primitive has.

    A typed record: each field is ``None`` (or ``False``) until the primitive's own
    module sets it, and a misspelt name raises ``AttributeError`` instead of going
    unread.  Flags (``bool``) declare a property; the rest are callables or data
    whose signature the reading pass documents.

    >>> from spmd.compiler.core.primitives import Rules
    >>> Rules().partial_eval is None
    True
    """

    # Transformations of higher-order primitives (the traces and passes read them).
    partial_eval: Callable | None = None     # transforms/ad.py: split known and unknown
    dce: Callable | None = None              # passes: drop unused outputs of the body
    inline: Callable | None = None           # passes/pipeline.inline_calls: the body
    lower: Callable | None = None            # passes/pipeline: the program it lowers to
    # Batching.
    batch_needs_axis: bool = False           # the batch rule reads the named axis
    batch_reads_level: bool = False          # the batch rule reads the batch level
    batch_always: bool = False               # batched even with unbatched operands
    # Typing of manual axes (shard_map's unreduced/reduced types).
    manual_types: Callable | None = None
    # Execution and generated code (engine/codegen.py, engine/buffers.py).
    bind_impl: Callable | None = None        # an impl bound once to its params
    donated_impl: Callable | None = None     # an impl that may reuse a donated operand
    in_place: Callable | None = None         # updates an operand in place
    results_into: Callable | None = None     # which results may be written into
    aliased_operands: Callable | None = None  # operands its outputs alias
    emit_avals: Callable | None = None       # code from the operands' avals
    emit_globals: dict | None = None         # names the emitted code refers to
    emit_numpy_only: bool = False            # its emit rule holds for numpy only
    kernel_op: Any = None                    # engine/fusion.py: the ufunc it computes
    # Collectives: communication, overlap and combining.
    communicates: bool = False               # moves data between devices
    start: Callable | None = None            # passes/overlap.py: start without waiting
    starts: bool = False                     # a start equation (its wait comes later)
    waits: bool = False                      # a wait equation
    starts_alone: Callable | None = None     # started even with no partner to combine
    combine_key: Callable | None = None      # passes/combine.py: which ones combine
    combine_params: Callable | None = None   # passes/combine.py: the combined params
    # Randomness and placement.
    never_recompute: bool = False            # remat never recomputes it
    output_array: Callable | None = None     # shard/call/spread.py: the placed output

    def names(self) -> list:
        """The rules set (for registry tests)."""
        return [f.name for f in dataclasses.fields(self)
                if getattr(self, f.name) not in (None, False)]

class Primitive:
    """An operation of the IR, with its rules as attributes.

    >>> add_p = Primitive("add", traits=("implicit_broadcast",))
    >>> add_p.def_impl(lambda xp, x, y: xp.add(x, y))  # doctest: +SKIP
    """

    def __init__(self, name: str, *, traits: Iterable[str] | None = None,
                 multiple_results: bool = False, linear: bool = False,
                 higher_order: bool = False, effectful: bool = False):
        if name in PRIMITIVES:
            raise ValueError(f"primitive {name!r} is defined twice")
        self.name = name
        # The properties the generic passes act on (see TRAITS); ``traits=()`` declares
        # none, and leaving it out is reported by tests/compiler/test_traits.py.
        self.traits: frozenset[str] = frozenset(() if traits is None else traits)
        self.traits_declared = traits is not None
        unknown = sorted(self.traits - TRAITS.keys())
        if unknown:
            raise ValueError(f"primitive {name!r}: unknown trait(s) {unknown}; the "
                             f"vocabulary is {sorted(TRAITS)} (spmd.compiler.core.primitives)")
        self.multiple_results = multiple_results
        # Linear in all its array inputs (it then needs a transpose rule).
        self.linear = linear
        self.higher_order = higher_order
        # Effectful primitives (collectives, callbacks) are never removed by DCE
        # or merged by CSE.
        self.effectful = effectful
        self.impl: Callable | None = None
        self.abstract_eval: Callable | None = None
        self.jvp: Callable | None = None
        self.transpose: Callable | None = None
        self.batch: Callable | None = None
        self.vma: Callable | None = None
        self.emit: Callable | None = None
        self.unreduced: str | None = None  # a key of UNREDUCED_POLICIES
        # The further rules, a typed record (partial evaluation, DCE, ...).
        self.rules = Rules()
        PRIMITIVES[name] = self

    def bind(self, *args, **params):
        return trace_bind(self, *args, **params)

    # Registration decorators: ``@prim.def_impl`` etc. return the function.
    def _setter(attr):
        def setter(self, fn):
            setattr(self, attr, fn)
            return fn

        setter.__name__ = "def_" + attr
        return setter

    def_impl = _setter("impl")
    def_abstract_eval = _setter("abstract_eval")
    def_jvp = _setter("jvp")
    def_transpose = _setter("transpose")
    def_batch = _setter("batch")
    def_vma = _setter("vma")
    def_emit = _setter("emit")
    del _setter

    def __repr__(self):
        return self.name

    __str__ = __repr__
