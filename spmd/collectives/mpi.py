"""The ``mpi`` backend: collectives between processes through mpi4py.

Communication happens in one effectful primitive, ``mpi``, whose ``kind``
says which MPI call it makes; a process's per-device program (its local
devices stacked, see :mod:`spmd.shard.execute`) is traced with these
equations where its collectives cross processes.  Buffers go through the
upper-case (buffer) mpi4py calls: no pickling on the data path.

Communicators are made once per ordered set of world ranks with
``Comm.Create_group`` (collective over the members only) and cached.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from spmd.compiler.avals import ShapedArray
from spmd.compiler.primitives import Primitive
from spmd.compiler.trace import bind
from spmd.errors import SpmdError


class CollectiveTimeoutError(SpmdError, RuntimeError):
    """A collective did not complete within SPMD_COLLECTIVE_TIMEOUT seconds."""


def world():
    from spmd.launch.mpi import world as _world

    return _world()


@functools.lru_cache(maxsize=None)
def communicator(ranks: tuple):
    """A communicator over world ``ranks`` in that order (rank i of it is ranks[i])."""
    comm = world()
    if len(ranks) == comm.Get_size() and ranks == tuple(range(len(ranks))):
        return comm
    group = comm.Get_group().Incl(list(ranks))
    return comm.Create_group(group)


# MPI has no reduction over these types: reduce in a wider one.
_WIDEN = {np.dtype(np.float16): np.dtype(np.float32), np.dtype(np.bool_): np.dtype(np.uint8)}


def _widen(x):
    dt = _WIDEN.get(x.dtype)
    if dt is None and x.dtype.kind == "V":  # bfloat16 and other extension types
        dt = np.dtype(np.float32)
    return (x.astype(dt), x.dtype) if dt is not None else (np.ascontiguousarray(x), None)


def _bytes(x):
    """A contiguous byte view of ``x`` (data movement needs no MPI datatype)."""
    return np.ascontiguousarray(x).view(np.uint8)


def _op(name):
    from mpi4py import MPI

    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[name]


def _timeout() -> float | None:
    raw = os.environ.get("SPMD_COLLECTIVE_TIMEOUT", "").strip()
    return float(raw) if raw else None


def _wait(req, comm, what: str):
    """Wait for a non-blocking request, aborting the job after the timeout."""
    limit = _timeout()
    if limit is None:
        req.Wait()
        return
    deadline = time.monotonic() + limit
    while not req.Test():
        if time.monotonic() > deadline:
            me = world().Get_rank()
            import sys

            sys.stderr.write(
                f"[spmd] rank {me}: collective {what} over world ranks {list(_ranks_of(comm))} "
                f"did not complete within SPMD_COLLECTIVE_TIMEOUT={limit:g}s: at least one of "
                "those ranks did not arrive (it is stuck, failed or runs a different program); "
                "aborting the job\n")
            sys.stderr.flush()
            world().Abort(3)
        time.sleep(0.0005)


def _ranks_of(comm):
    g = comm.Get_group()
    return g.Translate_ranks(list(range(comm.Get_size())), world().Get_group())


# ---------------------------------------------------------------- the calls

def allreduce(x, ranks, op):
    comm = communicator(ranks)
    buf, orig = _widen(x)
    out = np.empty_like(buf)
    if _timeout() is None:
        comm.Allreduce(buf, out, op=_op(op))
    else:
        _wait(comm.Iallreduce(buf, out, op=_op(op)), comm, f"allreduce({op})")
    return out.astype(orig) if orig is not None else out


def allgather(x, ranks):
    comm = communicator(ranks)
    n = len(ranks)
    src = _bytes(x)
    out = np.empty((n,) + src.shape, np.uint8)
    if _timeout() is None:
        comm.Allgather(src, out)
    else:
        _wait(comm.Iallgather(src, out), comm, "allgather")
    return out.view(x.dtype).reshape((n,) + x.shape)


def reduce_scatter(x, ranks, op="sum"):
    """``x`` has the member count as its leading axis; member k gets the sum of row k."""
    comm = communicator(ranks)
    buf, orig = _widen(x)
    out = np.empty(buf.shape[1:], buf.dtype)
    if _timeout() is None:
        comm.Reduce_scatter_block(buf, out, op=_op(op))
    else:
        _wait(comm.Ireduce_scatter_block(buf, out, op=_op(op)), comm, "reduce_scatter")
    return out.astype(orig) if orig is not None else out


def alltoall(x, ranks):
    """``x`` has the member count as its leading axis; row j goes to member j."""
    comm = communicator(ranks)
    src = _bytes(x)
    out = np.empty_like(src)
    if _timeout() is None:
        comm.Alltoall(src, out)
    else:
        _wait(comm.Ialltoall(src, out), comm, "alltoall")
    return out.view(x.dtype).reshape(x.shape)


def sendrecv(x, ranks, dst, src):
    """Send ``x`` to member ``dst`` and receive from member ``src`` (either may be None)."""
    comm = communicator(ranks)
    out = np.zeros_like(x)
    reqs = []
    if src is not None:
        reqs.append(comm.Irecv(out.view(np.uint8).reshape(-1), source=src, tag=11))
    if dst is not None:
        reqs.append(comm.Isend(_bytes(x).reshape(-1), dest=dst, tag=11))
    for r in reqs:
        _wait(r, comm, "ppermute")
    return out


# --------------------------------------------------------- the primitive

mpi_p = Primitive("mpi", effectful=True)


@mpi_p.def_impl
def _mpi_impl(xp, x, *, kind, ranks, op=None, dst=None, src=None):
    # GPU arrays are staged through host memory (NCCL is the GPU path).
    host = np.asarray(x) if xp is np else xp.asnumpy(x)
    if kind == "allreduce":
        out = allreduce(host, ranks, op)
    elif kind == "allgather":
        out = allgather(host, ranks)
    elif kind == "reduce_scatter":
        out = reduce_scatter(host, ranks, op)
    elif kind == "alltoall":
        out = alltoall(host, ranks)
    elif kind == "sendrecv":
        out = sendrecv(host, ranks, dst, src)
    else:  # pragma: no cover - the binders below only make the kinds above
        raise ValueError(f"mpi: unknown kind {kind!r}")
    return out if xp is np else xp.asarray(out)


@mpi_p.def_abstract_eval
def _mpi_aval(x, *, kind, ranks, op=None, dst=None, src=None):
    n = len(ranks)
    if kind == "allgather":
        return ShapedArray((n,) + x.shape, x.dtype, x.weak_type)
    if kind == "reduce_scatter":
        return ShapedArray(x.shape[1:], x.dtype, x.weak_type)
    return ShapedArray(x.shape, x.dtype, x.weak_type)


@mpi_p.def_jvp
def _mpi_jvp(primals, tangents, **params):
    # Execution programs are never differentiated (AD happens before lowering);
    # the linear kinds still have the obvious rule.
    from spmd.compiler.ad_util import Zero

    if params["kind"] == "allreduce" and params.get("op") != "sum":
        raise NotImplementedError("mpi allreduce(max/min) is not differentiable")
    out = bind(mpi_p, *primals, **params)
    (t,) = tangents
    return out, t if isinstance(t, Zero) else bind(mpi_p, t, **params)


@mpi_p.def_batch
def _mpi_batch(args, dims, **params):
    raise NotImplementedError("the mpi execution primitive is not batched: vmap applies "
                              "before a program is lowered for execution")


def call(kind, x, ranks, **params):
    return bind(mpi_p, x, kind=kind, ranks=tuple(int(r) for r in ranks), **params)
