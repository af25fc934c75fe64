"""Partial-manual ``shard_map`` (``axis_names={...}``): the body, written on blocks
along the manual axes, is split by the partitioner along the other (automatic) axes.

The body is a program on values that are blocks along the manual axes and whole
along the automatic ones.  :func:`partition_partial_manual` partitions it over the
automatic axes exactly as ``jit`` with shardings partitions a global program (the
manual axes are left to the body's own collectives, which the partitioner keeps in
place), and returns an ordinary ``shard_map`` over all axes: its specs name the
manual axes first (as the user's specs do) and the automatic ones after, so each
device runs on its block along every axis.

Where the automatic placements come from, as in JAX.  Traced (under ``jit`` or a
transformation), the ``shard_map`` equation keeps its body whole along the automatic
axes (param ``manual``); where the program holding it is partitioned,
:func:`partition_in_program` splits it by the placements propagated to its operands
through the whole program.  Eagerly, or where the equation runs unpartitioned
(:func:`split_params`), by the arguments' ``NamedSharding`` (the automatic axes of
its spec).  In both, else a ``with_sharding_constraint`` in the body the argument
reaches through elementwise operations, else replicated; the results keep the
placement propagation gave them.

>>> f = shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})
>>> f(device_put(a, NamedSharding(mesh, P("x", "y")))).sharding.spec  # doctest: +SKIP
PartitionSpec('x', 'y')
"""

from __future__ import annotations

import weakref

from spmd.compiler.core.ir import ClosedProgram
from spmd.shard.partition.partitioner import (_backward_wants, _describe, Evaluator, partition,
                                              PartitionError)
from spmd.shard.partition.placement import Placement
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec
from spmd.compiler.passes.pipeline import inline_calls
from spmd.shard.partition.reshard import reshard


def merge_specs(manual: PartitionSpec, auto: PartitionSpec, ndim: int) -> PartitionSpec:
    """One spec over all axes: per dimension the manual axes (major), then the
    automatic ones: the manual block is cut further along the automatic axes.

    >>> merge_specs(P("x"), P(None, "y"), 2)
    PartitionSpec('x', 'y')
    """
    parts = []
    for d in range(ndim):
        axes = manual.axes_of(d) + auto.axes_of(d)
        parts.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    while parts and parts[-1] is None:
        parts.pop()
    return PartitionSpec(*parts)


def _auto_spec(x, block_shape, mesh, manual) -> PartitionSpec | None:
    """The automatic part of an argument's NamedSharding on ``mesh`` (None when it
    names no automatic axis, or does not divide the manual block)."""
    s = getattr(x, "_sharding", None)
    if not isinstance(s, NamedSharding) or s.mesh != mesh:
        return None
    dims = [tuple(a for a in s.spec.axes_of(d) if a not in manual)
            for d in range(len(block_shape))]
    if not any(dims):
        return None
    if any(a and n % mesh.axis_size(a) for n, a in zip(block_shape, dims)):
        return None
    return PartitionSpec(*[None if not a else a[0] if len(a) == 1 else a for a in dims])


def partition_partial_manual(closed: ClosedProgram, mesh, manual, args, in_specs,
                             out_specs) -> tuple[ClosedProgram, list, list]:
    """(per-device body, in_specs, out_specs) of the full-manual shard_map that runs a
    partial-manual one's ``closed`` body split along the automatic axes too.

    ``args``: the shard_map's array arguments (their shardings give the automatic
    placements of the inputs); ``in_specs``/``out_specs``: its specs (manual axes).
    """
    avals = closed.in_avals
    auto_in = [_auto_spec(x, a.shape, mesh, manual) for x, a in zip(args, avals)]
    part = partition(closed, mesh, auto_in, [None] * len(closed.out_avals), manual=manual)
    ins = [merge_specs(m, a, len(v.shape)) for m, a, v in zip(in_specs, part.in_specs, avals)]
    outs = [merge_specs(m, a, len(v.shape))
            for m, a, v in zip(out_specs, part.out_specs, closed.out_avals)]
    return part.body, ins, outs


# ClosedProgram -> {(mesh, manual, in_specs, out_specs, automatic specs): split}
_SPLIT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def split_params(params: dict, args=None) -> dict:
    """The params of the full-manual shard_map that runs a partial-manual equation
    (one bound under a trace, its body whole along the automatic axes) where no
    partitioner placed its operands: split by the arguments' shardings (Arrays) and
    the body's constraints, else replicated along the automatic axes.

    >>> split_params(eqn.params, [x])["in_specs"]  # doctest: +SKIP
    (PartitionSpec('x', 'y'),)
    """
    closed, mesh, manual = params["program"], params["mesh"], params["manual"]
    avals = closed.in_avals
    args = [None] * len(avals) if args is None else args
    auto = tuple(_auto_spec(x, a.shape, mesh, manual) for x, a in zip(args, avals))
    key = (mesh, manual, params["in_specs"], params["out_specs"], auto)
    per = _SPLIT.setdefault(closed, {})
    if key not in per:
        per[key] = partition_partial_manual(closed, mesh, manual, args, params["in_specs"],
                                            params["out_specs"])
    body, ins, outs = per[key]
    rest = {k: v for k, v in params.items() if k != "manual"}
    return {**rest, "program": body, "in_specs": tuple(ins), "out_specs": tuple(outs),
            "check_vma": False}


def _auto_of_placement(pl: Placement, manual, block_shape, mesh) -> PartitionSpec:
    """The automatic part of a placement the partitioner propagated to an operand
    (the axes that divide the manual block; a pending sum is resolved first)."""
    dims = []
    for d, n in enumerate(block_shape):
        axes = tuple(a for a in pl.dims[d] if a not in manual) if d < len(pl.dims) else ()
        dims.append(axes if axes and n % mesh.axis_size(axes) == 0 else ())
    return Placement(tuple(dims)).to_spec()


def partition_in_program(ev, eqn, vals, pls) -> list:
    """The partitioner's rule for a partial-manual shard_map equation inside a
    partitioned program: its body is split along the automatic axes by the placements
    propagated to its operands (as JAX's compiler does), and evaluated in place.

    Each operand is resharded to its manual spec merged with the automatic part of its
    placement, so each device holds its block along every axis; the body then runs
    under an evaluator that knows its manual axes (its collectives run over them)."""
    p = eqn.params
    # Nested in another partial-manual body (manual along ev.manual), the inner body is
    # manual along both: the outer's blocks are cut further along the inner's axes.
    mesh, manual = ev.mesh, frozenset(p["manual"]) | frozenset(ev.manual or ())
    body = inline_calls(p["program"])
    avals = body.in_avals
    inner_ins = []
    for x, pl, spec, a, atom in zip(vals, pls, p["in_specs"], avals, eqn.inputs):
        auto = _auto_of_placement(pl, manual, a.shape, mesh)
        nd = len(a.shape)
        target = Placement.from_spec(merge_specs(spec, auto, nd), nd)
        x = reshard(x, pl, target, ev.ctx, _describe(atom, "a partial-manual shard_map input"))
        inner_ins.append((x, Placement.from_spec(auto, nd)))
    inner = Evaluator(mesh, ev.ctx, _backward_wants(body.program, [None] * len(avals)),
                      manual)
    outs = inner.run(body, inner_ins)
    results = []
    for (x, pl), spec, a in zip(outs, p["out_specs"], body.out_avals):
        nd = len(a.shape)
        merged = Placement.from_spec(merge_specs(spec, pl.without_partial().to_spec(), nd), nd)
        results.append((x, Placement(merged.dims, pl.partial)))
    return results


__all__ = ["merge_specs", "partition_in_program", "partition_partial_manual", "split_params"]
