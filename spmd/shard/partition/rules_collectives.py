"""Partition decisions of the collectives and of the backends' transport primitives.

A global program (what the partitioner walks) never holds a collective: a
collective needs a mesh axis in scope, which only a ``shard_map`` body has, and the
partitioner keeps a nested ``shard_map`` whole (its specs are fixed points;
:meth:`Evaluator.nested_shard_map`).  The collectives the partitioner itself inserts
are bound into the per-device program it traces, never walked.  ``pvary`` is not
here: it is the identity on values, elementwise and linear, and has a rule
(:mod:`spmd.shard.partition.rules`).
"""

from __future__ import annotations

from spmd.collectives import mpi, nccl
from spmd.collectives import primitives as cp
from spmd.shard.partition import registry
from spmd.shard.partition.registry import Unreachable

_IN_BODIES = ("a collective is only traced inside a shard_map body (it needs a mesh axis "
              "in scope), and the partitioner keeps shard_map bodies whole")
_TRANSPORT = ("a backend's transport primitive appears only in the per-process program "
              "that runs a shard_map body across processes, after partitioning")

TABLE = {
    **{p: Unreachable(_IN_BODIES) for p in (
        cp.psum_p, cp.pmax_p, cp.pmin_p, cp.all_gather_p, cp.psum_scatter_p,
        cp.all_to_all_p, cp.ppermute_p, cp.axis_index_p)},
    mpi.mpi_p: Unreachable(_TRANSPORT),
    nccl.nccl_p: Unreachable(_TRANSPORT),
}
registry.register_all(TABLE)
