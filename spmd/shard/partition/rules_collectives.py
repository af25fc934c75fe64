"""Partition decisions of the collectives and of the backends' transport primitives.

A global program never holds a collective: a collective needs a mesh axis in
scope, which only a ``shard_map`` body has, and the partitioner keeps a nested
``shard_map`` whole (its specs are fixed points; :meth:`Evaluator.nested_shard_map`).
The one body it does walk is that of a partial-manual ``shard_map``
(``axis_names=...``; :mod:`spmd.shard.partition.manual`), split along the automatic
axes: there a collective over the manual axes works on each device's block along
the automatic ones, which it leaves in place, except that a gathered, scattered or
exchanged dimension must be whole along them (the rules below ask for that).  A
collective naming an axis the partitioner splits is an error.  The collectives the
partitioner itself inserts are bound into the per-device program it traces, never
walked.  ``pvary`` (a typed body's mark that a value varies along manual axes) is
the identity on values and is dropped: the partitioned body is untyped, where it
would transpose to a ``psum`` that the untyped ``shard_map`` transpose also adds.
"""

from __future__ import annotations

from spmd.collectives import local, mpi, nccl
from spmd.collectives import primitives as cp
from spmd.compiler.passes import overlap
from spmd.shard.partition import rules_explicit as typed
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import PartitionError, Structural, Unreachable

_IN_BODIES = ("a collective is only traced inside a shard_map body (it needs a mesh axis "
              "in scope), and the partitioner keeps shard_map bodies whole")
_TRANSPORT = ("a backend's transport primitive appears only in the per-process program "
              "that runs a shard_map body across processes, after partitioning")


def _keep(pls, avals_in, avals_out, mesh, **params):
    """Linear and elementwise across the automatic blocks (psum, ppermute)."""
    return [pls[0]], [pls[0]], params


def _reduced(pls, avals_in, avals_out, mesh, **params):
    """pmax/pmin are not linear: a pending sum is reduced first."""
    p = pls[0].without_partial()
    return [p], [p], params


def _whole(pl: Placement, *dims) -> Placement:
    return Placement(tuple(() if d in dims else a for d, a in enumerate(pl.dims)), pl.partial)


def _all_gather(pls, avals_in, avals_out, mesh, *, axis, tiled, **params):
    if tiled:  # the gathered dimension grows: whole along the automatic axes
        want = _whole(pls[0], axis)
        return [want], [want], dict(params, axis=axis, tiled=tiled)
    dims = pls[0].dims  # stacked along a new dimension
    out = Placement(dims[:axis] + ((),) + dims[axis:], pls[0].partial)
    return [pls[0]], [out], dict(params, axis=axis, tiled=tiled)


def _psum_scatter(pls, avals_in, avals_out, mesh, *, scatter_dimension, tiled, **params):
    d = scatter_dimension
    want = _whole(pls[0], d)
    out = want if tiled else Placement(want.dims[:d] + want.dims[d + 1:], want.partial)
    return [want], [out], dict(params, scatter_dimension=d, tiled=tiled)


def _all_to_all(pls, avals_in, avals_out, mesh, *, split_axis, concat_axis, **params):
    want = _whole(pls[0], split_axis, concat_axis)
    return [want], [want], dict(params, split_axis=split_axis, concat_axis=concat_axis)


def _axis_index(pls, avals_in, avals_out, mesh, **params):
    return [], [Placement(())], params


def _check_axes(ev, eqn):
    axes = eqn.params["axes"]
    auto = [a for a in axes if a not in ev.manual]
    if auto and not ev.manual:
        raise PartitionError(f"internal: {eqn.primitive.name} reached the partitioner, "
                             f"where it cannot occur: {_IN_BODIES}")
    if auto:
        raise PartitionError(
            f"{eqn.primitive.name} over mesh axis {auto[0]!r}, which is automatic in this "
            f"partial-manual shard_map (manual axes {sorted(ev.manual)}): collectives may "
            "name only the manual axes")


def _collective(prim, rule):
    """The decision of a collective: ``rule`` places it along the automatic axes.  In
    explicit mode (a partial-manual body typed along the explicit axes it leaves) its
    types are the placements ``rule`` gives, and a dimension it resizes must be whole
    along the typed axes already."""
    def fn(ev, eqn, vals, pls):
        _check_axes(ev, eqn)
        return ev.apply(eqn, vals, pls, rule=rule)
    return Structural(fn, typed.kept_whole(rule, prim.name))


def _pvary(ev, eqn, vals, pls):
    _check_axes(ev, eqn)
    return list(zip(vals, pls))


_OVERLAP = ("the overlap pass (spmd.compiler.passes.overlap) makes nonblocking starts and waits "
            "out of per-device programs as they are compiled, after partitioning")

_RULES = {cp.psum_p: _keep, cp.ppermute_p: _keep, cp.pmax_p: _reduced, cp.pmin_p: _reduced,
          cp.all_gather_p: _all_gather, cp.psum_scatter_p: _psum_scatter,
          cp.all_to_all_p: _all_to_all, cp.axis_index_p: _axis_index}

_MARKS = ("the trace's markers of a collective (spmd.collectives.local) are made when a "
          "shard_map body is stacked over its simulated devices, after partitioning")

TABLE = {p: _collective(p, rule) for p, rule in _RULES.items()}
TABLE.update({
    # (a mark, or a cast, of the varying axes: no data moves, the type is kept)
    cp.pvary_p: Structural(_pvary, typed.operand_only),
    cp.pcast_p: Structural(_pvary, typed.operand_only),
    mpi.mpi_p: Unreachable(_TRANSPORT),
    nccl.nccl_p: Unreachable(_TRANSPORT),
    overlap.collective_start_p: Unreachable(_OVERLAP),
    overlap.collective_wait_p: Unreachable(_OVERLAP),
    local.timeline_mark_p: Unreachable(_MARKS),
})
