"""The blocking collectives of the MPI transport: all-reduce, all-gather,
reduce-scatter and all-to-all, each through a node's shared window, the nodes'
hierarchy, or MPI's own call, whichever its size and members choose.

>>> from spmd.collectives import mpi
>>> mpi.allreduce(np.ones(4, np.float32), (0, 1), "sum")  # doctest: +SKIP
array([2., 2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from spmd.collectives.mpi import communicators, hier as mpi_hier, shm as mpi_shm
from spmd.collectives.mpi.buffers import as_bytes, recv_buffer, reduce_op, widen
from spmd.collectives.mpi.communicators import communicator
from spmd.collectives.mpi.control import Collective, control as control_comm


def split_slice(comm, buf, out, n: int):
    """This member's slice of ``out`` when the all-reduce of ``buf`` over ``n`` members
    runs as reduce-scatter + all-gather (from ``ALLREDUCE_SPLIT_BYTES``, when it divides
    evenly), else None: the one choice of algorithm, blocking or started."""
    if buf.nbytes < communicators.split_bytes() or buf.size % n:
        return None
    k, me = buf.size // n, comm.Get_rank()
    return out.reshape(-1)[me * k:(me + 1) * k]


_plans = mpi_hier.plans  # ranks -> its Plan, or None: flat (decided once per communicator)


def hier_plan(ranks, comm, nbytes: int, what):
    """The hierarchical plan for an operand of ``nbytes`` over ``ranks``
    (:mod:`spmd.collectives.mpi.hier`), or None: the flat call.  Decided once per
    communicator (collective over its members, at its first operand in range); a
    communicator decided flat (every one on one node) costs one lookup per call."""
    plan = _plans.get(ranks, False)
    if plan is None or nbytes < mpi_hier.min_bytes():
        return None
    return plan if plan is not False else mpi_hier.plan_for(ranks, comm, what)


def allreduce(x, ranks, op, what=None):
    comm = communicator(ranks, what)
    buf, orig = widen(x)
    if (plan := hier_plan(ranks, comm, buf.nbytes, what)) is not None:
        out = plan.allreduce(buf, op, what)
        return out.astype(orig) if orig is not None else out
    out = recv_buffer(buf.shape, buf.dtype)
    with Collective(ranks, what) as c:
        c.nbytes = buf.nbytes
        shm = op == "sum" and mpi_shm.segment_for(ranks, comm, buf.nbytes, "allreduce")
        if shm:
            shm.allreduce_sum(buf, out)
        elif (mine := split_slice(comm, buf, out, len(ranks))) is not None:
            # Reduce-scatter into this member's slice of `out`, then gather the slices.
            from mpi4py import MPI

            comm.Reduce_scatter_block(buf, mine, op=reduce_op(op))
            comm.Allgather(MPI.IN_PLACE, out.reshape(-1))
        else:
            comm.Allreduce(buf, out, op=reduce_op(op))
    return out.astype(orig) if orig is not None else out


def allgather(x, ranks, what=None, *, control=False):
    """Every member's ``x`` stacked along a new leading axis (``control=True``: over the
    control communicator, for agreement checks that must not pair with data)."""
    comm = control_comm(ranks, what) if control else communicator(ranks, what)
    n = len(ranks)
    src = as_bytes(x)
    if not control and (plan := hier_plan(ranks, comm, src.nbytes, what)) is not None:
        return plan.allgather(src, what).view(x.dtype).reshape((n,) + x.shape)
    out = recv_buffer((n,) + src.shape, np.uint8)
    with Collective(ranks, what, control_traffic=control) as c:
        c.nbytes = src.nbytes
        shm = not control and mpi_shm.segment_for(ranks, comm, src.nbytes, "move")
        if shm:
            shm.allgather(src, out)
        else:
            comm.Allgather(src, out)
    return out.view(x.dtype).reshape((n,) + x.shape)


def reduce_scatter(x, ranks, op="sum", what=None):
    """``x`` has the member count as its leading axis; member k gets the sum of row k."""
    comm = communicator(ranks, what)
    buf, orig = widen(x)
    if (plan := hier_plan(ranks, comm, buf.nbytes, what)) is not None:
        out = plan.reduce_scatter(buf, op, what)
        return out.astype(orig) if orig is not None else out
    out = recv_buffer(buf.shape[1:], buf.dtype)
    with Collective(ranks, what) as c:
        c.nbytes = buf.nbytes
        shm = op == "sum" and mpi_shm.segment_for(ranks, comm, buf.nbytes,
                                                  "reduce_scatter")
        if shm:
            shm.reduce_scatter_sum(buf, out)
        else:
            comm.Reduce_scatter_block(buf, out, op=reduce_op(op))
    return out.astype(orig) if orig is not None else out


def alltoall(x, ranks, what=None):
    """``x`` has the member count as its leading axis; row j goes to member j."""
    comm = communicator(ranks, what)
    n = len(ranks)
    src = as_bytes(x)
    out = recv_buffer(src.shape, np.uint8)
    with Collective(ranks, what) as c:
        c.nbytes = src.nbytes
        shm = mpi_shm.segment_for(ranks, comm, src.nbytes, "move")
        if shm:  # (rows of bytes: a 1-d x's byte view has n * itemsize entries)
            shm.alltoall(src.reshape(n, -1), out.reshape(n, -1))
        else:
            comm.Alltoall(src, out)
    return out.view(x.dtype).reshape(x.shape)


# A ppermute's send of at most this many bytes is not waited for: the sender goes on
# as soon as what it receives has come (a pipeline stage runs ahead of a slower
# neighbour instead of meeting it at every tick).  The message is copied first (the
