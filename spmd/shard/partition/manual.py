"""Partial-manual ``shard_map`` (``axis_names={...}``): the body, written on blocks
along the manual axes, is split by the partitioner along the other (automatic) axes.

The body is a program on values that are blocks along the manual axes and whole
along the automatic ones.  :func:`partition_partial_manual` partitions it over the
automatic axes exactly as ``jit`` with shardings partitions a global program (the
manual axes are left to the body's own collectives, which the partitioner keeps in
place), and returns an ordinary ``shard_map`` over all axes: its specs name the
manual axes first (as the user's specs do) and the automatic ones after, so each
device runs on its block along every axis.

Where the automatic placements come from, as in JAX: an argument's ``NamedSharding``
(the automatic axes of its spec), else a ``with_sharding_constraint`` in the body
the argument reaches through elementwise operations, else replicated; the results
keep the placement propagation gave them.

>>> f = shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})
>>> f(device_put(a, NamedSharding(mesh, P("x", "y")))).sharding.spec  # doctest: +SKIP
PartitionSpec('x', 'y')
"""

from __future__ import annotations

import contextlib

from spmd.compiler.ir import ClosedProgram
from spmd.shard.partition.partitioner import partition
from spmd.shard.spec import NamedSharding, PartitionSpec


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


# id(tracer) -> NamedSharding of the arguments of the partitioned jit being traced:
# a partial-manual shard_map called on one of them takes its placement (the
# tracer itself carries no sharding).
_TRACED_SHARDINGS: dict = {}


@contextlib.contextmanager
def traced_shardings(pairs):
    """While a partitioned jit traces its function: ``(tracer, NamedSharding)`` pairs
    of its arguments, seen by the partial-manual shard_maps called on them."""
    added = {id(t): s for t, s in pairs if s is not None}
    old = {k: _TRACED_SHARDINGS[k] for k in added if k in _TRACED_SHARDINGS}
    _TRACED_SHARDINGS.update(added)
    try:
        yield
    finally:
        for k in added:
            _TRACED_SHARDINGS.pop(k, None)
        _TRACED_SHARDINGS.update(old)


def _auto_spec(x, block_shape, mesh, manual) -> PartitionSpec | None:
    """The automatic part of an argument's NamedSharding on ``mesh`` (None when it
    names no automatic axis, or does not divide the manual block)."""
    s = getattr(x, "_sharding", None) or _TRACED_SHARDINGS.get(id(x))
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


__all__ = ["merge_specs", "partition_partial_manual", "traced_shardings"]
