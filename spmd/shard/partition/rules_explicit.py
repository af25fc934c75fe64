"""The explicit-mode extensions of the propagation rules: where a typed operand may not move.

On ``AxisType.Explicit`` mesh axes an array's sharding is its type, and a
primitive's result type follows from its operands' with JAX's rules
(``jax._src.lax``'s ``sharding_rule``s).  A primitive's partition decision
(:mod:`spmd.shard.partition.registry`) is its one sharding declaration: where the
type is the placement its propagation rule gives the result, explicit mode derives
it (:func:`from_outputs`).  The rules here are the extensions a decision names in
its ``explicit`` field where the type cannot be read off the propagation rule,
because propagation would move an operand and a type may not: splits that agree
flow through (:func:`broadcasting`), a dimension sliced to a size its axes still
divide keeps them (:func:`same_as_operand`), and where the result's sharding is
ambiguous, or would need data moved first, the rule raises
:class:`ShardingTypeError` naming the fix (``reshard`` the operands, or say the
result's sharding with ``out_sharding=``).

A rule is ``rule(avals_in, types_in, avals_out, mesh, params) -> [types_out]``; its
types are :class:`Placement` without pending sums (``spmd.shard.explicit.rules``
handles unreduced operands and untyped ones before it).

>>> broadcasting.__name__
'broadcasting'
"""

from __future__ import annotations

from typing import Callable

from spmd.errors import ShardingTypeError
from spmd.shard.partition.placement import Placement

RESHARD = "reshard the operands first (spmd.sharding.reshard(x, P(...)))"


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
                    f"{', '.join(map(show, ins))}); {RESHARD}, or give the result's "
                    "sharding with out_sharding=")
            seen.append(a)
    return Placement(tuple(dims))


def from_outputs(prop_rule: Callable) -> Callable:
    """The type a propagation rule gives: its results' placements for operands placed as
    typed (a reduction's pending sum is reduced: the type is whole along those axes)."""
    def rule(avals_in, types_in, avals_out, mesh, params):
        outs = prop_rule(list(types_in), list(avals_in), list(avals_out), mesh, **params)[1]
        return [Placement(o.dims) for o in outs]
    rule.__name__ = f"from_outputs({getattr(prop_rule, '__name__', prop_rule)})"
    return rule


def kept_whole(prop_rule: Callable, name: str) -> Callable:
    """:func:`from_outputs` where the rule keeps the operands as typed; where it would
    make a split dimension whole (a collective resizing it), that is an error: a type
    may not move."""
    def rule(avals_in, types_in, avals_out, mesh, params):
        wanted, outs = prop_rule(list(types_in), list(avals_in), list(avals_out), mesh,
                                 **params)[:2]
        for a, t, w in zip(avals_in, types_in, wanted):
            moved = [d for d, (x, y) in enumerate(zip(t.dims, w.dims)) if x != y]
            if moved:
                raise ShardingTypeError(
                    f"{name} along dimension {moved[0]} of {a.str_short()} with sharding "
                    f"{show(t)}: that dimension is split over explicit axes; reshard it "
                    "whole first (spmd.sharding.reshard)")
        return [Placement(o.dims) for o in outs]
    rule.__name__ = f"kept_whole({name})"
    return rule


# ------------------------------------------------------------ the extensions

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
                f"{', '.join(show(t) for _, t in shaped)} (dimension {d}); {RESHARD}")
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
                                f"[{', '.join(map(show, cases))}]; {RESHARD}")
    if avals_in[0].shape and which != cases[0]:
        raise ShardingTypeError(f"select `which` must be scalar or have the same sharding as "
                                f"the cases, got {show(which)} and {show(cases[0])}; {RESHARD}")
    return [cases[0]]


def concatenate(avals_in, types_in, avals_out, mesh, params):
    if any(t != types_in[0] for t in types_in[1:]):
        raise ShardingTypeError(f"concatenate: all operands should have the same sharding, got "
                                f"{', '.join(map(show, types_in))}; {RESHARD}")
    return [types_in[0]]


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
                                    f"{parts(rs)}; {RESHARD}")
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


def never(reason: str) -> Callable:
    def rule(avals_in, types_in, avals_out, mesh, params):
        raise ShardingTypeError(reason)
    rule.__name__ = "never"
    return rule


def untyped(avals_in, types_in, avals_out, mesh, params):
    """Results the partitioner places (the linear part of a ``custom_vjp``: an opaque
    backward rule over saved residuals, from which no type can be read)."""
    return [None] * len(avals_out)

