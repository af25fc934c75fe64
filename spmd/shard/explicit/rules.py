"""The sharding rules of explicit mode: each primitive's output shardings from its inputs'.

On a mesh whose axes are ``AxisType.Explicit`` an array's sharding is part of its
type (:mod:`spmd.shard.explicit.types`).  A rule computes the shardings of a primitive's
results from those of its operands, with JAX's rules (``jax._src.lax``'s
``sharding_rule``s): shardings that agree flow through, a reduction drops the
reduced dimensions' axes, a contraction over dimensions split on both sides is
ambiguous.  Where the result's sharding is ambiguous, or would need data moved
before the operation, the rule raises :class:`ShardingTypeError` naming the fix
(``reshard`` the operands, or say the result's sharding with ``out_sharding=``).

A type is a :class:`~spmd.shard.partition.placement.Placement` (the axes each
dimension is split over), or ``None``: an *untyped* value, whose placement the
partitioner chooses (the result of ``auto_axes`` before its ``out_sharding``, the
linear part of a ``custom_vjp``).  An operation with an untyped operand has untyped
results.

Every rule is declared in :data:`RULES`, keyed by the primitive object;
``tests/shard/test_explicit_rules.py`` checks that every primitive has one.  A rule
is ``rule(avals_in, types_in, avals_out, mesh, params) -> [types_out]`` and sees
no untyped operand.

>>> from spmd.compiler.ops.elementwise import add_p
>>> RULES[add_p].__name__
'broadcasting'
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from spmd.collectives import primitives as cp
from spmd.collectives.mpi import mpi_p
from spmd.collectives.nccl import nccl_p
from spmd.compiler.transforms import custom
from spmd.compiler.engine import fusion
from spmd.compiler.core import jit
from spmd.compiler.passes import overlap
from spmd.compiler.transforms import remat
from spmd.compiler.engine import rows
from spmd.compiler.core.ir import ClosedProgram, Literal
from spmd.compiler.ops import attention as attention_ops
from spmd.compiler.ops import conv, elementwise as ew, indexing as ix, linalg
from spmd.compiler.ops import linalg_decomp as ld, reduce as rd, slicing as sm, sort
from spmd.compiler.ops import structural as st
from spmd.compiler.ops.control_cond import cond_p
from spmd.compiler.ops.control_scan import scan_p
from spmd.compiler.ops.control_while import while_p
from spmd.compiler.ops.threefry import random_bits_p, rng_counter_p
from spmd.compiler.core.trace import abstract_eval
from spmd.errors import MissingExplicitRuleError, ShardingTypeError
from spmd.mesh.mesh import AxisType
from spmd.shard.partition.constraint import sharding_constraint_p
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import DECISIONS, Propagate

RULES: dict = {}

_RESHARD = "reshard the operands first (spmd.sharding.reshard(x, P(...)))"


def show(t: Placement | None) -> str:
    return "untyped" if t is None else repr(t.to_spec())


def parts(dims) -> tuple:
    """Dimensions' axes as a PartitionSpec writes them: None, a name, or a tuple."""
    return tuple(None if not a else a[0] if len(a) == 1 else tuple(a) for a in dims)


def replicated(ndim: int) -> Placement:
    return Placement.replicated(ndim)


def _checked(dims, what: str, ins) -> Placement:
    """``Placement(dims)``, or ShardingTypeError when a mesh axis splits two dimensions."""
    seen: list = []
    for axes in dims:
        for a in axes:
            if a in seen:
                raise ShardingTypeError(
                    f"{what}: the result would be split over mesh axis {a!r} twice "
                    f"({Placement(tuple(dims)).to_spec()!r}, from operands "
                    f"{', '.join(map(show, ins))}); {_RESHARD}, or give the result's "
                    "sharding with out_sharding=")
            seen.append(a)
    return Placement(tuple(dims))


# ------------------------------------------------------------ the rule families

def broadcasting(avals_in, types_in, avals_out, mesh, params, name="elementwise"):
    """Elementwise operations: per dimension, the one split its operands agree on (an
    operand of size 1 there, or a scalar, takes no part)."""
    shaped = [(a, t) for a, t in zip(avals_in, types_in) if a.shape]
    nd = len(avals_out[0].shape)
    if not shaped:
        return [replicated(len(o.shape)) for o in avals_out]
    dims = []
    for d in range(nd):
        splits = {t.dims[d] for a, t in shaped if t.dims[d] and a.shape[d] != 1}
        if len(splits) > 1:
            raise ShardingTypeError(
                f"{name} got incompatible shardings for broadcasting: "
                f"{', '.join(show(t) for _, t in shaped)} (dimension {d}); {_RESHARD}")
        dims.append(next(iter(splits)) if splits else ())
    out = _checked(dims, name, [t for _, t in shaped])
    return [out if len(o.shape) == nd else replicated(len(o.shape)) for o in avals_out]


def same_as_operand(avals_in, types_in, avals_out, mesh, params, what="operation"):
    """The operand's sharding (slicing, padding, reversing, sorting, cumulative sums,
    updates): a dimension whose size changes must still divide among its axes."""
    a, t = avals_in[0], types_in[0]
    outs = []
    for o in avals_out:
        for d, (n_in, n_out) in enumerate(zip(a.shape, o.shape)):
            axes = t.dims[d]
            if axes and n_in != n_out and n_out % mesh.axis_size(axes) != 0:
                raise ShardingTypeError(
                    f"{what} on dimension {d}, split over {axes}, to size {n_out}, which "
                    f"{mesh.axis_size(axes)} devices do not divide; reshard the operand "
                    "so that dimension is not split (spmd.sharding.reshard)")
        outs.append(t if len(o.shape) == len(a.shape) else replicated(len(o.shape)))
    return outs


def select(avals_in, types_in, avals_out, mesh, params):
    which, cases = types_in[0], types_in[1:]
    if any(c != cases[0] for c in cases[1:]):
        raise ShardingTypeError(f"select cases must have the same shardings, got "
                                f"[{', '.join(map(show, cases))}]; {_RESHARD}")
    if avals_in[0].shape and which != cases[0]:
        raise ShardingTypeError(f"select `which` must be scalar or have the same sharding as "
                                f"the cases, got {show(which)} and {show(cases[0])}; {_RESHARD}")
    return [cases[0]]


def concatenate(avals_in, types_in, avals_out, mesh, params):
    if any(t != types_in[0] for t in types_in[1:]):
        raise ShardingTypeError(f"concatenate: all operands should have the same sharding, got "
                                f"{', '.join(map(show, types_in))}; {_RESHARD}")
    return [types_in[0]]


def broadcast_in_dim(avals_in, types_in, avals_out, mesh, params):
    (t,), bd = types_in, params["broadcast_dimensions"]
    dims = [()] * len(params["shape"])
    for k, d in enumerate(bd):
        if avals_in[0].shape[k] == avals_out[0].shape[d]:
            dims[d] = t.dims[k]
    return [Placement(tuple(dims))]


def transpose(avals_in, types_in, avals_out, mesh, params):
    t = types_in[0]
    return [Placement(tuple(t.dims[k] for k in params["permutation"]))]


def squeeze(avals_in, types_in, avals_out, mesh, params):
    t, gone = types_in[0], set(params["dimensions"])
    return [Placement(tuple(a for d, a in enumerate(t.dims) if d not in gone))]


def reduction(avals_in, types_in, avals_out, mesh, params):
    """Reduced dimensions leave the type (the result is whole along their axes)."""
    t = types_in[0]
    gone = set(params["axes"]) if "axes" in params else {params["axis"]}
    return [Placement(tuple(a for d, a in enumerate(t.dims) if d not in gone))]


def _groups(a: list, b: list) -> list:
    """Consecutive dimensions of two shapes (no size 1 or 0) grouped into blocks of
    equal size: ``[(in dims, out dims), ...]``."""
    res, i, j = [], 0, 0
    while i < len(a):
        ins, outs, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa *= a[i]
                ins.append(i)
                i += 1
            else:
                pb *= b[j]
                outs.append(j)
                j += 1
        res.append((ins, outs))
    return res


def reshape(avals_in, types_in, avals_out, mesh, params):
    """A split dimension keeps its split when it is the major part of its block of
    dimensions, its axes taken by the block's output dimensions major first, each
    dividing: the same elements stay on each device, nothing moves."""
    (a,), (t,), new = avals_in, types_in, tuple(params["new_sizes"])
    if not t.axes or 0 in a.shape:
        return [replicated(len(new))]
    in_dims = [d for d, n in enumerate(a.shape) if n != 1]
    out_dims = [d for d, n in enumerate(new) if n != 1]
    dims = [()] * len(new)
    for ins, outs in _groups([a.shape[d] for d in in_dims], [new[d] for d in out_dims]):
        split = [k for k in ins if t.dims[in_dims[k]]]
        if not split:
            continue
        if split != [ins[0]]:
            raise ShardingTypeError(
                f"reshape of {a.str_short()} with sharding {show(t)} to {new}: a dimension "
                "other than the major one of a merged block is split, so the elements would "
                "have to move between devices; reshard the operand first, or give the "
                "result's sharding with reshape(..., out_sharding=)")
        axes = list(t.dims[in_dims[ins[0]]])
        for k in outs:
            n, took = new[out_dims[k]], []
            while n > 1 and axes:
                size = mesh.shape[axes[0]]
                if n % size:
                    break
                took.append(axes.pop(0))
                n //= size
            dims[out_dims[k]] = tuple(took)
            if n > 1 or not axes:
                break
        if axes:
            raise ShardingTypeError(
                f"reshape of {a.str_short()} with sharding {show(t)} to {new}: the split "
                f"over {t.dims[in_dims[ins[0]]]} does not divide the result's dimensions; "
                "reshard the operand first, or give the result's sharding with "
                "reshape(..., out_sharding=)")
    return [_checked(dims, "reshape", types_in)]


def dot_general(avals_in, types_in, avals_out, mesh, params):
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lt, rt = types_in
    lbs, rbs = [lt.dims[i] for i in lb], [rt.dims[i] for i in rb]
    lcs, rcs = [lt.dims[i] for i in lc], [rt.dims[i] for i in rc]
    for ls, rs, what in ((lbs, rbs, "lhs batch dimensions and rhs batch dimensions to have "
                                    "the consistent sharding"),
                         (lcs, rcs, "contracting dimensions to have consistent sharding")):
        if any(x and y and x != y for x, y in zip(ls, rs)):
            raise ShardingTypeError(f"dot_general requires {what}, got {parts(ls)} and "
                                    f"{parts(rs)}; {_RESHARD}")
    for x, y in zip(lcs, rcs):
        if x and y:
            raise ShardingTypeError(
                "Contracting dimensions are sharded and it is ambiguous how the output "
                "should be sharded. Please specify the output sharding via the "
                f"`out_sharding` parameter. Got lhs_contracting_spec={parts(lcs)} and "
                f"rhs_contracting_spec={parts(rcs)}")
    lfree = [lt.dims[i] for i in range(len(lt.dims)) if i not in lc and i not in lb]
    rfree = [rt.dims[i] for i in range(len(rt.dims)) if i not in rc and i not in rb]
    batch = [x or y for x, y in zip(lbs, rbs)]
    return [_checked(batch + lfree + rfree, "dot_general", types_in)]


def gather(avals_in, types_in, avals_out, mesh, params):
    """``x[idx...]`` on ``axes``: the indexed dimensions must be whole; the result's
    leading dimensions are split as the indices, the rest as ``x``'s other dimensions."""
    x, idx = types_in[0], types_in[1:]
    axes = params["axes"]
    for d in axes:
        if x.dims[d]:
            raise ShardingTypeError(
                f"indexing dimension {d} of an array split over {x.dims[d]} on it: the "
                "result's sharding is ambiguous (or needs a collective); reshard the array "
                "so that dimension is whole (spmd.sharding.reshard), or index inside "
                "spmd.sharding.auto_axes")
    lead = broadcasting(avals_in[1:], idx, avals_in[1:2], mesh, {}, "indexing")[0] if idx \
        else Placement(())
    rest = [a for d, a in enumerate(x.dims) if d not in axes]
    return [_checked(list(lead.dims) + rest, "indexing", types_in)]


def operand_only(avals_in, types_in, avals_out, mesh, params):
    """The first operand's sharding (an update or scatter into it)."""
    return [types_in[0]] * len(avals_out)


def whole_only(name: str) -> Callable:
    """Only on whole (replicated) operands: the result is whole."""
    def rule(avals_in, types_in, avals_out, mesh, params):
        split = [show(t) for t in types_in if t.axes]
        if split:
            raise ShardingTypeError(
                f"{name} has no sharding rule for split operands in explicit mode (got "
                f"{', '.join(split)}); reshard them to P() first, or compute it inside "
                "spmd.sharding.auto_axes(f, out_sharding=...), where the partitioner places it")
        return [replicated(len(o.shape)) for o in avals_out]
    rule.__name__ = f"whole_only({name})"
    return rule


def attention(prim) -> Callable:
    """The attention kernel's primitives: the batch and head dimensions keep their
    splits (the key/value heads following the query heads'); the others are whole."""
    from spmd.shard.partition.rules_attention import placements

    def rule(avals_in, types_in, avals_out, mesh, params):
        wanted, outs = placements(prim, types_in[0].dims, avals_in, avals_out, mesh, params)
        for i, (w, t) in enumerate(zip(wanted, types_in)):
            if t.dims != w.dims:
                raise ShardingTypeError(
                    f"dot_product_attention: operand {i} is sharded {show(t)} where, with "
                    f"the query sharded {show(types_in[0])}, it must be {show(w)}: only the "
                    "batch and head dimensions may be split (query and key/value heads "
                    f"alike); {_RESHARD}")
        if any(o.partial for o in outs):
            raise ShardingTypeError(
                "dot_product_attention: the key/value (or bias) cotangent would be a "
                "pending sum over the query heads' or batch's axes, which explicit mode "
                "does not type; split the key/value heads as the query heads, or "
                f"replicate the heads; {_RESHARD}")
        return outs
    rule.__name__ = f"attention({prim.name})"
    return rule


def never(reason: str) -> Callable:
    def rule(avals_in, types_in, avals_out, mesh, params):
        raise ShardingTypeError(reason)
    rule.__name__ = "never"
    return rule


# -------------------------------------------- collectives in a partial-manual body
#
# A partial-manual shard_map body over explicit axes is traced with types along the
# axes it leaves (spmd.shard.maps.shard_map); its collectives act along the manual axes,
# which types never name: a value keeps its type, except where the collective
# reshapes a dimension, which must then be whole along the typed axes.

def _collective_dims(name, *dims_of):
    """A collective that resizes, adds or removes the dimensions ``dims_of(params,
    ndim)`` names: those must be untyped; the others keep their types."""
    def rule(avals_in, types_in, avals_out, mesh, params):
        t, a_in, a_out = types_in[0], avals_in[0], avals_out[0]
        if t is None:
            return [None]
        touched = sorted({f(params, a_in.ndim) for f in dims_of} - {None})
        split = [d for d in touched if d < len(t.dims) and t.dims[d]]
        if split:
            raise ShardingTypeError(
                f"{name} along dimension {split[0]} of {a_in.str_short()} with sharding "
                f"{show(t)}: that dimension is split over explicit axes; reshard it whole "
                "first (spmd.sharding.reshard)")
        dims = list(t.dims)
        if a_out.ndim > a_in.ndim:  # a new dimension (all_gather, tiled=False)
            dims.insert(params["axis"], ())
        elif a_out.ndim < a_in.ndim:  # one removed (psum_scatter, tiled=False)
            del dims[params["scatter_dimension"]]
        return [Placement(tuple(dims), t.partial)]
    rule.__name__ = f"collective({name})"
    return rule


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


HIGHER_ORDER = {"jit": _program_call(), "remat": _program_call(),
                "custom_jvp_call": _program_call(), "custom_vjp_call": _program_call(),
                "cond": cond, "scan": scan, "while": while_loop, "shard_map": shard_map}


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
            "arrays whose shardings are in their types; declare one in "
            "spmd.shard.explicit.rules.RULES, or compute it inside "
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
    """``prim``'s rule, or None.  The elementwise family is the one the partitioner
    declares elementwise (an input of the output's shape takes its spec: ``Propagate``
    with ``specs_flow_back``), so that both tables name the same primitives; it is read
    at first use, when every partition decision is registered."""
    rule = RULES.get(prim)
    if rule is None and prim.name == "shard_map":
        # shard_map's module sits above this one (its bodies are typed by
        # spmd.shard.explicit.types): its primitive is known by name here.
        rule = RULES[prim] = shard_map
    if rule is None:
        d = DECISIONS.get(prim)
        if isinstance(d, Propagate) and d.specs_flow_back:
            rule = RULES[prim] = broadcasting
    return rule


def untyped(avals_in, types_in, avals_out, mesh, params):
    """Results the partitioner places (the linear part of a ``custom_vjp``: an opaque
    backward rule over saved residuals, from which no type can be read)."""
    return [None] * len(avals_out)


# ------------------------------------------------------------------ the table

def register(prim, rule: Callable) -> None:
    """Declare ``prim``'s explicit-sharding rule (once; an upper layer's primitive is
    declared by its own module, as ``spmd.debug`` does).

    >>> register(my_p, whole_only("my_op"))  # doctest: +SKIP
    """
    old = RULES.get(prim)
    if old is not None and old is not rule:
        raise ValueError(f"register: {prim.name} already has an explicit-sharding rule")
    RULES[prim] = rule


def _untyped_higher(avals_in, types_in, avals_out, mesh, params, lenient=False):
    return [None] * len(avals_out)


def _table() -> None:

    register(ew.select_n_p, select)  # (elementwise, but its cases must agree)
    for p in (rd.reduce_sum_p, rd.reduce_max_p, rd.reduce_min_p, rd.reduce_prod_p,
              rd.reduce_and_p, rd.reduce_or_p, rd.argmax_p, rd.argmin_p):
        register(p, reduction)
    for p in (rd.cumsum_p, rd.cumprod_p, rd.cummax_p, rd.cummin_p, sm.slice_p, sm.pad_p,
              ix.dynamic_slice_p, sm.rev_p, sort.sort_p):
        register(p, same_as_operand)
    for p in (ix.dynamic_update_slice_p, ix.scatter_p):
        register(p, operand_only)
    register(st.broadcast_in_dim_p, broadcast_in_dim)
    register(st.reshape_p, reshape)
    register(st.transpose_p, transpose)
    register(st.squeeze_p, squeeze)
    register(st.iota_p, whole_only("iota"))
    register(sm.concatenate_p, concatenate)
    register(linalg.dot_general_p, dot_general)
    register(ix.gather_p, gather)
    register(conv.conv_p, whole_only("conv_general_dilated"))
    for p in (attention_ops.attention_p, attention_ops.attention_tangent_p,
              attention_ops.attention_grad_p):
        register(p, attention(p))
    for p in (ld.cholesky_p, ld.solve_p, ld.slogdet_p, ld.qr_p, ld.eigh_p, ld.svd_p):
        register(p, whole_only(p.name))
    register(random_bits_p, whole_only("random_bits"))
    register(rng_counter_p, whole_only("rng_counter"))
    register(sharding_constraint_p, from_spec_param)
    register(custom.custom_lin_p, untyped)
    register(remat.remat_lin_p, _untyped_higher)
    for p in (jit.jit_p, remat.remat_p, custom.custom_jvp_call_p, custom.custom_vjp_call_p,
              cond_p, scan_p, while_p):
        register(p, HIGHER_ORDER[p.name])
    # Collectives meet an explicit trace only in a partial-manual body (typed along the
    # axes it leaves); a full-manual body is untyped.
    for p in (cp.psum_p, cp.pmax_p, cp.pmin_p, cp.pvary_p, cp.pcast_p, cp.ppermute_p):
        register(p, operand_only)
    register(cp.axis_index_p, whole_only("axis_index"))
    register(cp.all_gather_p, _collective_dims(  # (untiled, it adds a dimension)
        "all_gather", lambda q, n: q["axis"] if q["tiled"] else None))
    register(cp.psum_scatter_p, _collective_dims(
        "psum_scatter", lambda q, n: q["scatter_dimension"]))
    register(cp.all_to_all_p, _collective_dims(
        "all_to_all", lambda q, n: q["split_axis"], lambda q, n: q["concat_axis"]))
    late = "{} exists only in per-device programs, made after the types are checked"
    for p in (mpi_p, nccl_p, fusion.fused_p, rows.fused_rows_p, overlap.collective_start_p,
              overlap.collective_wait_p):
        register(p, never(late.format(p.name)))


_table()
