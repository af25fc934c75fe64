"""Unreduced and reduced manual-axes types (JAX's ``P(unreduced=...)`` and
``P(reduced=...)`` in ``shard_map`` bodies), beside the varying axes of JEP 17111.

Along each manual mesh axis a body value is one of:

| type      | the devices hold               | its cotangent is | ``ShapedArray`` fields        |
| --------- | ------------------------------ | ---------------- | ----------------------------- |
| invariant | the same value                 | invariant        | (none)                        |
| varying   | different values               | varying          | ``a in vma``                  |
| unreduced | summands of the value          | reduced          | ``a in unreduced`` (and vma)  |
| reduced   | the same value                 | unreduced        | ``a in reduced``              |

An unreduced value's blocks differ between devices, so it is in ``vma`` too: every
rule that only asks whether blocks may differ (residuals, out_specs) treats it as
varying, which is right for its data.  A reduced value's blocks are equal; only
reverse mode reads the mark: the cotangent of a reduced value is left as summands,
with no psum, which is what makes FSDP's gradient a reduce-scatter where it is
consumed instead of an all-reduce where it is made.

Operands meeting in one operation are cast as JEP 17111 casts them (``pvary`` where
an invariant or reduced operand meets a varying one; ``pcast(to='reduced')`` where an
invariant one meets a reduced one); an unreduced operand passes only through an
operation linear in it (the primitive's ``unreduced`` policy), else
:class:`UnreducedRuleError`.

>>> default_types(add_p, [f32_unreduced_x, f32_unreduced_x], {})  # doctest: +SKIP
(frozenset({'x'}), frozenset({'x'}), frozenset())
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core.avals import tangent_aval
from spmd.errors import SpmdError

_EMPTY = frozenset()


class UnreducedRuleError(SpmdError, NotImplementedError):
    """An unreduced (or reduced) operand given to an operation not linear in it, which
    has no rule for it (a NotImplementedError, as JAX's missing unreduced rules)."""


class ManualTypeError(SpmdError, TypeError):
    """Operands whose manual-axes types cannot meet (an unreduced operand and a varying
    one along the same axis)."""


def varying(aval) -> frozenset:
    """The axes along which ``aval``'s value varies (not counting its summands)."""
    return aval.vma - aval.unreduced


def has_marks(avals) -> bool:
    """Whether any of ``avals`` is unreduced or reduced somewhere (the slow path)."""
    return any(a.unreduced or a.reduced for a in avals)


def _show(avals) -> str:
    return ", ".join(str(a) for a in avals)


def unreduced_out(prim, avals_in, params) -> frozenset:
    """The unreduced axes of the result of ``prim`` (no manual-axes rule of its own),
    by its ``unreduced`` policy; an operation not linear in an unreduced operand raises."""
    parts = [a.unreduced for a in avals_in]
    if not any(parts):
        return _EMPTY
    every = frozenset().union(*parts)
    policy = prim.unreduced
    if policy is None:
        raise UnreducedRuleError(
            f"unreduced rule for {prim.name} is not implemented: an operand is unreduced "
            f"({_show(avals_in)}) and {prim.name} is not linear in it; sum it first "
            "(lax.psum, or lax.psum_scatter)")
    clash = [a for a in avals_in if varying(a) & every]
    if clash:
        raise ManualTypeError(
            f"{prim.name}: an operand unreduced along {sorted(every)} meets one varying "
            f"along {sorted(varying(clash[0]) & every)} ({_show(avals_in)}); sum the "
            "unreduced one first (lax.psum or lax.psum_scatter)")
    if policy == "joint" and any(p != parts[0] for p in parts):
        raise ManualTypeError(
            f"{prim.name}: its operands must be unreduced along the same axes, got "
            f"{_show(avals_in)}; pcast the others to='unreduced', or sum first")
    if policy == "one" and sum(1 for p in parts if p) > 1:
        raise ManualTypeError(f"{prim.name}: more than one operand is unreduced "
                              f"({_show(avals_in)}); sum one of them first (lax.psum)")
    if policy == "first" and any(parts[1:]):
        raise ManualTypeError(f"{prim.name}: only its first operand may be unreduced, got "
                              f"{_show(avals_in)}; sum the others first (lax.psum)")
    if policy == "float" and not np.issubdtype(np.dtype(params["new_dtype"]), np.inexact):
        raise ManualTypeError(f"{prim.name} to {np.dtype(params['new_dtype'])}: an unreduced "
                              "operand converts only to an inexact dtype; sum it first")
    return every


def default_types(prim, avals_in, params) -> tuple:
    """``(vma, unreduced, reduced)`` of the results of a primitive without a manual-axes
    rule of its own, from operands already cast to meet (:func:`casts`)."""
    if not avals_in:
        return _EMPTY, _EMPTY, _EMPTY
    var = frozenset().union(*(varying(a) for a in avals_in))
    unred = unreduced_out(prim, avals_in, params)
    red = frozenset().union(*(a.reduced for a in avals_in)) - var - unred
    return var | unred, unred, red


def rule_types(prim, avals_in, params, n_out: int) -> list:
    """``(unreduced, reduced)`` per result of a primitive with a varying-axes rule of its
    own: its ``manual_types`` rule's, else none (and an unreduced or reduced operand,
    whose mark it would drop, is an error: a dropped mark is a wrong cotangent)."""
    rule = prim.rules.manual_types
    if rule is not None:
        return rule(*avals_in, **params)
    if has_marks(avals_in):
        raise UnreducedRuleError(
            f"unreduced rule for {prim.name} is not implemented: it has an unreduced or "
            f"reduced operand ({_show(avals_in)}); sum an unreduced one first (lax.psum), or "
            "pcast a reduced one to='varying'")
    return [(_EMPTY, _EMPTY)] * n_out


def casts(avals) -> list:
    """Per operand, ``(axes to pvary, axes to pcast to='reduced')`` so that operands of
    different manual-axes types meet (JEP 17111's implicit pvary, extended to reduced):
    an operand invariant or reduced where another varies is made varying (a reduced
    one's pvary transposes to summands, not a psum); one invariant where another is
    reduced is made reduced.  An operand's own unreduced axes are left to the
    primitive's policy."""
    var = frozenset().union(*(varying(a) for a in avals))
    red = frozenset().union(*(a.reduced for a in avals)) - var
    out = []
    for a in avals:
        mine = varying(a) | a.unreduced
        out.append((tuple(sorted(var - mine)), tuple(sorted(red - mine - a.reduced))))
    return out


def ct_aval(aval):
    """The type of a cotangent of a value of type ``aval``: its tangent type with the
    unreduced and reduced axes swapped (a reduced value's cotangent is summands)."""
    t = tangent_aval(aval)
    if not (t.unreduced or t.reduced):
        return t
    return t.update(vma=(t.vma - t.unreduced) | t.reduced, unreduced=t.reduced,
                    reduced=t.unreduced)
