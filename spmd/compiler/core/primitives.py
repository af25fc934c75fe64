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

from typing import Callable, Iterable

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
    "dot": "a matrix product with dot_general's dimension_numbers param: the checkpoint "
           "policies dots_saveable and dots_with_no_batch_dims_saveable save its result",
}


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
        # Extra rules of higher-order primitives (partial evaluation, DCE, ...).
        self.rules: dict[str, Callable] = {}
        PRIMITIVES[name] = self

    def bind(self, *args, **params):
        from spmd.compiler.core.trace import bind  # bind lives with the traces

        return bind(self, *args, **params)

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
