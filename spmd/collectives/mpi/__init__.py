"""The ``mpi`` backend: collectives between processes through mpi4py.

Communication happens in one effectful primitive, ``mpi``, whose ``kind``
says which MPI call it makes; a process's per-device program (its local
devices stacked, see :mod:`spmd.shard.maps.stacked`) is traced with these
equations where its collectives cross processes.  Buffers go through the
upper-case (buffer) mpi4py calls: no pickling on the data path.

Communicators are made once per ordered set of world ranks with
``Comm.Create_group`` (collective over the members only) and cached, each with
a duplicate for control traffic.  Every call runs inside
:class:`spmd.collectives.mpi.control.Collective` (thread rules, and a watchdog
that reports a collective past its deadline: :mod:`spmd.collectives.mpi.watchdog`).
When a communicator's members share one node, sums from 16 KiB and mid-sized
moves go through a shared window instead of MPI's calls
(:mod:`spmd.collectives.mpi.shm`: 1.5-2x faster there with the mpich wheel), and a
``ppermute``'s messages through shared outboxes (:mod:`spmd.collectives.mpi.p2p`).
When its members span several nodes (the same number on each), sums, reduce-scatters
and all-gathers from 64 KiB go through the nodes' hierarchy instead
(:mod:`spmd.collectives.mpi.hier`: within each node, then across nodes in parallel
slices, then within each node again).

Modules: :mod:`~spmd.collectives.mpi.communicators` (set-up and agreed settings),
:mod:`~spmd.collectives.mpi.buffers` (widened operands, reduction ops, pooled receive
buffers), :mod:`~spmd.collectives.mpi.calls` (the blocking collectives),
:mod:`~spmd.collectives.mpi.nonblocking` (send-receives, started exchanges and
all-reduces), :mod:`~spmd.collectives.mpi.primitive` (the ``mpi`` primitive and its
rules).  This package is the transport (:class:`spmd.collectives.backend.Transport`):
its names below are the interface the primitive dispatches through.
"""

from __future__ import annotations

from spmd.collectives.mpi import hier as mpi_hier, p2p as mpi_p2p, shm as mpi_shm  # noqa: F401
from spmd.collectives.mpi.buffers import (HUGE_BYTES, POOL_MAX_BYTES, POOL_MIN_BYTES,
                                          POOL_PER_SHAPE, clear_buffers)
from spmd.collectives.mpi.calls import allgather, allreduce, alltoall, reduce_scatter
from spmd.collectives.mpi.communicators import ALLREDUCE_SPLIT_BYTES, communicator, world
from spmd.collectives.mpi.control import (Collective, CollectiveThreadError,
                                          CollectiveTimeoutError, Site, site_here)
from spmd.collectives.mpi.nonblocking import (DEFERRED_SEND_MAX_BYTES, DEFERRED_SENDS_MAX,
                                              Exchange, Request, iallreduce, isendrecv,
                                              sendrecv, settle_sends)
from spmd.collectives.mpi.primitive import call, mpi_p

__all__ = ["ALLREDUCE_SPLIT_BYTES", "Collective", "CollectiveThreadError",
           "CollectiveTimeoutError", "DEFERRED_SEND_MAX_BYTES", "DEFERRED_SENDS_MAX",
           "Exchange", "HUGE_BYTES", "POOL_MAX_BYTES", "POOL_MIN_BYTES", "POOL_PER_SHAPE",
           "Request", "Site", "allgather", "allreduce", "alltoall", "call", "clear_buffers",
           "communicator", "iallreduce", "isendrecv", "mpi_p", "reduce_scatter", "sendrecv",
           "settle_sends", "site_here", "world"]
