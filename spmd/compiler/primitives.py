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
  may be :data:`spmd.compiler.ad.zero` instances.
- ``transpose(cts, *args, **params)``: ``args`` hold :class:`UndefinedPrimal`
  for linear inputs; returns one cotangent (or ``None``) per argument.
- ``batch(args, dims, **params) -> (outs, out_dims)``: ``dims`` are the batch
  axis of each argument or ``None``.
- ``emit(names, **params) -> str``: optional; a Python expression over the
  input names for the code generator (default: call ``impl``).
"""

from __future__ import annotations

from typing import Callable

PRIMITIVES: dict[str, "Primitive"] = {}


class Primitive:
    """An operation of the IR, with its rules as attributes.

    >>> add_p = Primitive("add")
    >>> add_p.def_impl(lambda xp, x, y: xp.add(x, y))  # doctest: +SKIP
    """

    def __init__(self, name: str, *, multiple_results: bool = False, linear: bool = False,
                 higher_order: bool = False, effectful: bool = False):
        if name in PRIMITIVES:
            raise ValueError(f"primitive {name!r} is defined twice")
        self.name = name
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
        # Extra rules of higher-order primitives (partial evaluation, DCE, ...).
        self.rules: dict[str, Callable] = {}
        PRIMITIVES[name] = self

    def bind(self, *args, **params):
        from spmd.compiler.trace import bind  # bind lives with the traces

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
