"""The sharding types of explicit mode: each primitive's result types from its operands'.

On a mesh whose axes are ``AxisType.Explicit`` an array's sharding is part of its
type (:mod:`spmd.shard.explicit.types`).  A rule computes the shardings of a primitive's
results from those of its operands, with JAX's rules (``jax._src.lax``'s
``sharding_rule``s).  Where the result's sharding is ambiguous, or would need data
moved before the operation, the rule raises :class:`ShardingTypeError` naming the fix
(``reshard`` the operands, or say the result's sharding with ``out_sharding=``).

A primitive's sharding rule is written once, as its partition decision
(:mod:`spmd.shard.partition.registry`): :func:`rule_for` derives the explicit rule
from it (a ``Propagate`` rule's result placements, a ``Replicate`` primitive's whole
results, the decision's ``explicit`` extension where it names one:
:mod:`spmd.shard.partition.rules_explicit`).  Only primitives whose decision cannot
say their types are declared here with :func:`register`: the higher-order ones,
whose sub-programs are typed by :func:`infer`, and an upper layer's (``spmd.host``).
``tests/partition/test_rules_explicit.py`` checks that every primitive has exactly one.

A type is a :class:`~spmd.shard.partition.placement.Placement` (the axes each
dimension is split over), or ``None``: an *untyped* value, whose placement the
partitioner chooses (the result of ``auto_axes`` before its ``out_sharding``, the
linear part of a ``custom_vjp``).  An operation with an untyped operand has untyped
results.  A rule is ``rule(avals_in, types_in, avals_out, mesh, params) ->
[types_out]`` and sees no untyped operand.

>>> from spmd.compiler.ops.elementwise import add_p
>>> rule_for(add_p).__name__
'broadcasting'
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from spmd.compiler.transforms import custom
from spmd.compiler.core import jit
from spmd.compiler.transforms import remat
from spmd.compiler.core.ir import ClosedProgram, Literal
from spmd.compiler.ops.control_cond import cond_p
from spmd.compiler.ops.control_scan import scan_p
from spmd.compiler.ops.control_while import while_p
from spmd.compiler.core.trace import abstract_eval
from spmd.errors import MissingExplicitRuleError, ShardingTypeError
from spmd.mesh.mesh import AxisType
from spmd.shard.partition.constraint import sharding_constraint_p
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import DECISIONS, Propagate, Replicate, Unreachable
# (rule_for derives from the partition decisions, which spmd.shard.register() fills.)
from spmd.shard.partition.rules_explicit import from_outputs, never, replicated, show, whole_only
# (untyped: the rule upper layers register for results the partitioner places)
from spmd.shard.partition.rules_explicit import untyped  # noqa: F401

# The explicit rules declared by register (the decisions' are derived into _DERIVED).
RULES: dict = {}
_DERIVED: dict = {}


def free_axes(mesh) -> frozenset:
    """The axes of ``mesh`` that types do not name (its automatic ones)."""
    return frozenset(a for a, t in zip(mesh.axis_names, mesh.axis_types)
                     if t != AxisType.Explicit)


def explicit_only(pl: Placement, mesh) -> Placement:
    """``pl`` with the mesh's automatic axes left out: a type names explicit axes only
    (a mesh may mix the two)."""
    auto = free_axes(mesh)
    if not auto:
        return pl
    return Placement(tuple(tuple(a for a in d if a not in auto) for d in pl.dims),
                     frozenset(a for a in pl.partial if a not in auto),
                     frozenset(a for a in pl.reduced if a not in auto))


def from_spec_param(avals_in, types_in, avals_out, mesh, params):
    """``sharding_constraint``: the constrained spec (whatever the operand's type)."""
    return [explicit_only(Placement.from_spec(params["spec"], len(avals_out[0].shape)),
                          mesh)]


from_spec_param.reads_types = False


# ------------------------------------------------- higher-order primitives

def infer(program, types_in: list, mesh, lenient: bool = False) -> list:
    """The types of ``program``'s results from its arguments' (``types_in``; its
    constants are whole)."""
    if isinstance(program, ClosedProgram):
        consts, program = program.consts, program.program
    else:
        consts = []
    env: dict = {}
    for v, t in zip(program.in_vars, [replicated(len(v.aval.shape)) for v in
                                      program.in_vars[:len(consts)]] + list(types_in)):
        env[v] = t

    def read(x):
        return replicated(len(x.aval.shape)) if isinstance(x, Literal) else env[x]

    # A result the program constrains right away (an out_sharding=, a type pinned when
    # the body was traced) may be ambiguous before it: the constraint types it.
    pinned = {e.inputs[0] for e in program.eqns if e.primitive is sharding_constraint_p}
    for eqn in program.eqns:
        ease = lenient or all(v in pinned for v in eqn.outputs)
        outs = out_types(eqn.primitive, [x.aval for x in eqn.inputs],
                         [read(x) for x in eqn.inputs], eqn.params, mesh, ease,
                         [v.aval for v in eqn.outputs])
        for v, t in zip(eqn.outputs, outs):
            env[v] = t
    return [read(x) for x in program.out_atoms]


def _program_call(key: str = "program") -> Callable:
    def rule(avals_in, types_in, avals_out, mesh, params, lenient=False):
        return infer(params[key], list(types_in), mesh, lenient)
    rule.__name__ = "program_call"
    return rule


def cond(avals_in, types_in, avals_out, mesh, params, lenient=False):
    if types_in[0].axes:
        raise ShardingTypeError(f"cond: the branch index is split ({show(types_in[0])}); "
                                "reshard it to P()")
    per_branch = [infer(b, list(types_in[1:]), mesh, lenient) for b in params["branches"]]
    outs = per_branch[0]
    for other in per_branch[1:]:
        for k, (x, y) in enumerate(zip(outs, other)):
            if x != y:
                raise ShardingTypeError(
                    f"cond branches must give their outputs one sharding; output {k} is "
                    f"{show(x)} in one branch and {show(y)} in another: reshard it in the "
                    "branches to the same sharding (spmd.sharding.reshard)")
    return outs


def _loop_check(what: str, ins, outs):
    for k, (x, y) in enumerate(zip(ins, outs)):
        if x != y:
            raise ShardingTypeError(
                f"{what} carry {k} enters with sharding {show(x)} and the body returns "
                f"{show(y)}: a carry keeps one type; reshard the initial value or the "
                "body's result so they agree (spmd.sharding.reshard)")


def scan(avals_in, types_in, avals_out, mesh, params, lenient=False):
    nc, nk = params["num_consts"], params["num_carry"]
    consts, carry, xs = types_in[:nc], types_in[nc:nc + nk], types_in[nc + nk:]
    xs_body = [None if t is None else Placement(t.dims[1:]) for t in xs]
    outs = infer(params["program"], list(consts) + list(carry) + xs_body, mesh, lenient)
    _loop_check("scan", carry, outs[:nk])
    ys = [None if t is None else Placement(((),) + t.dims) for t in outs[nk:]]
    return list(carry) + ys


def while_loop(avals_in, types_in, avals_out, mesh, params, lenient=False):
    cn, bn = params["cond_nconsts"], params["body_nconsts"]
    bconsts, carry = types_in[cn:cn + bn], types_in[cn + bn:]
    outs = infer(params["body_program"], list(bconsts) + list(carry), mesh, lenient)
    _loop_check("while_loop", carry, outs)
    return list(carry)


def shard_map(avals_in, types_in, avals_out, mesh, params, lenient=False):
    outs = [explicit_only(Placement.from_spec(s, len(a.shape)), mesh)
            for s, a in zip(params["out_specs"], avals_out)]
    if params.get("manual") is None:
        return outs
    # A partial-manual body's results are typed along the explicit axes it leaves: its
    # pins say how (spmd.shard.maps.shard_map); each block's split is minor to the manual one.
    body = params["program"].program
    made = {o: e for e in body.eqns for o in e.outputs}
    merged = []
    for pl, atom in zip(outs, body.out_atoms):
        e = made.get(atom)
        if e is None or e.primitive is not sharding_constraint_p:
            merged.append(pl)
            continue
        inner = explicit_only(Placement.from_spec(e.params["spec"], len(pl.dims)), mesh)
        merged.append(Placement(tuple(a + b for a, b in zip(pl.dims, inner.dims)),
                                pl.partial | inner.partial))
    return merged


# ------------------------------------------------------------ the entry point

def out_types(prim, avals_in, types_in, params, mesh, lenient: bool = False,
              avals_out=None) -> list:
    """The types of ``prim``'s results.  ``lenient`` (inside an ``out_sharding=``):
    an ambiguous result is untyped instead of an error."""
    if avals_out is None:
        avals_out = abstract_eval(prim, list(avals_in), params)
    n = len(avals_out)
    rule = rule_for(prim)
    if rule is None:
        raise MissingExplicitRuleError(
            f"primitive {prim.name!r} has no explicit-sharding rule, so it cannot run on "
            "arrays whose shardings are in their types; declare one with its partition "
            "decision (spmd.shard.partition.registry, explicit=) or "
            "spmd.shard.explicit.rules.register, or compute it inside "
            "spmd.sharding.auto_axes(f, out_sharding=...)")
    if prim.higher_order:
        try:
            return list(rule(avals_in, types_in, avals_out, mesh, params, lenient=lenient))
        except ShardingTypeError:
            if lenient:
                return [None] * n
            raise
    reads = getattr(rule, "reads_types", True)
    if any(t is None for t in types_in) and reads:
        return [None] * n
    try:
        keep = frozenset()
        if reads and any(t.partial for t in types_in):
            keep = _unreduced(prim, avals_in, types_in, params)
            types_in = [Placement(t.dims) for t in types_in]
        outs = list(rule(avals_in, types_in, avals_out, mesh, params))
        return [Placement(o.dims, keep) for o in outs] if keep else outs
    except ShardingTypeError:
        if lenient:
            return [None] * n
        raise


def _unreduced(prim, avals_in, types_in, params) -> frozenset:
    """The unreduced axes of ``prim``'s result, or ShardingTypeError.  An unreduced
    operand (each device along the axes holding a summand) passes only through maps
    linear in it, as the primitive's ``unreduced`` policy declares (JAX's unreduced
    rules)."""
    policy = prim.unreduced
    got = ", ".join(show(t) for t in types_in)
    if policy is None:
        raise ShardingTypeError(
            f"{prim.name} got an unreduced operand ({got}): it is not linear in it, so the "
            "summands must be added first; reshard it to a spec without unreduced= "
            "(spmd.sharding.reshard)")
    parts = [t.partial for t in types_in]
    if policy == "joint":  # add, sub: every operand the same summands
        shaped = [p for p, a in zip(parts, avals_in)]
        if any(p != shaped[0] for p in shaped):
            raise ShardingTypeError(
                f"{prim.name}: operands unreduced over different axes ({got}); reshard them "
                "to one set of unreduced axes, or to none")
        return shaped[0]
    if policy == "one":  # mul: linear in each operand, not in both
        u = [p for p in parts if p]
        if len(u) > 1:
            raise ShardingTypeError(f"{prim.name}: both operands are unreduced ({got}); reduce "
                                    "one of them first (spmd.sharding.reshard)")
        return u[0]
    if policy == "first":  # div: linear in its numerator only
        if any(parts[1:]):
            raise ShardingTypeError(f"{prim.name}: the divisor is unreduced ({got}); reduce it "
                                    "first (spmd.sharding.reshard)")
        return parts[0]
    if policy == "float":  # convert_element_type: linear only between inexact types
        if not np.issubdtype(np.dtype(params["new_dtype"]), np.inexact):
            raise ShardingTypeError(f"{prim.name} to an integer type got an unreduced operand "
                                    f"({got}); reduce it first (spmd.sharding.reshard)")
    return frozenset().union(*parts)  # "keep": a linear map of one operand


def rule_for(prim):
    """``prim``'s rule, or None: the one :func:`register` declared, else the one its
    partition decision declares or derives (read at first use, when every decision is
    registered)."""
    rule = RULES.get(prim) or _DERIVED.get(prim)
    if rule is None and prim.name == "shard_map":
        # shard_map's module sits above this one (its bodies are typed by
        # spmd.shard.explicit.types): its primitive is known by name here.
        rule = RULES[prim] = shard_map
    if rule is None and prim in DECISIONS:
        rule = derived(prim, DECISIONS[prim])
        if rule is not None:
            _DERIVED[prim] = rule
    return rule


def derived(prim, decision) -> Callable | None:
    """The explicit rule ``prim``'s partition ``decision`` declares: its ``explicit``
    extension, else the placements a ``Propagate`` rule gives the results, whole results
    where it is computed whole, an error where it cannot occur; None for a
    ``Structural`` decision without one (declared by :func:`register`)."""
    if isinstance(decision, Unreachable):
        return never(f"{prim.name} exists only in per-device programs, made after the "
                     f"types are checked ({decision.reason})")
    if decision.explicit is not None:
        return decision.explicit
    if isinstance(decision, Propagate):
        return from_outputs(decision.rule)
    if isinstance(decision, Replicate):
        return whole_only(prim.name)
    return None


def declares(decision) -> bool:
    """Whether a partition decision says its primitive's explicit rule (so that
    :func:`register` may not say it again)."""
    return isinstance(decision, (Propagate, Unreachable)) or (
        decision is not None and decision.explicit is not None)


# ------------------------------------------------------------------ declared here

def register(prim, rule: Callable) -> None:
    """Declare ``prim``'s explicit-sharding rule, where its partition decision does not
    (a higher-order primitive; an upper layer's primitive computed whole whose results
    are untyped, as ``spmd.debug`` declares).  Once per primitive.

    >>> register(my_p, untyped)  # doctest: +SKIP
    """
    old = RULES.get(prim)
    if old is not None and old is not rule:
        raise ValueError(f"register: {prim.name} already has an explicit-sharding rule")
    if declares(DECISIONS.get(prim)):
        raise ValueError(f"register: {prim.name}'s partition decision already declares its "
                         "explicit-sharding rule (spmd.shard.partition.registry)")
    RULES[prim] = rule
    _DERIVED.pop(prim, None)


def _untyped_higher(avals_in, types_in, avals_out, mesh, params, lenient=False):
    return [None] * len(avals_out)


def _table() -> None:
    register(sharding_constraint_p, from_spec_param)
    register(remat.remat_lin_p, _untyped_higher)
    for p in (jit.jit_p, remat.remat_p, custom.custom_jvp_call_p, custom.custom_vjp_call_p):
        register(p, _program_call())
    register(cond_p, cond)
    register(scan_p, scan)
    register(while_p, while_loop)


_table()
