"""The ``nccl`` backend: collectives between processes' GPUs through CuPy's NCCL.

The same five operations as :mod:`spmd.collectives.mpi` (``allreduce``,
``allgather``, ``reduce_scatter``, ``alltoall``, ``sendrecv``), on CuPy arrays,
in one effectful primitive, ``nccl``.  :class:`spmd.collectives.process_group.ProcessGroup`
binds it instead of ``mpi`` when the devices are GPUs and CuPy has NCCL
(``SPMD_GPU_BACKEND=mpi`` forces the host-staged ``mpi`` one).

- Communicators: one per ordered tuple of world ranks, made on first use and
  cached.  The group's first member creates the unique id and broadcasts it
  over the group's MPI communicator (setup only: no data goes through MPI).
  Before NCCL is asked, the members compare their GPUs (node and PCI bus id;
  the node is the host, or its simulated part with ``SPMD_SIMULATE_NODES``)
  so that two ranks on one GPU are a clear error, whatever ``CUDA_VISIBLE_DEVICES``
  each rank was given.  At exit (an ``atexit`` handler, which runs before
  mpi4py finalises MPI) the GPU is synchronised and every communicator
  destroyed: left to interpreter teardown, newer NCCL versions can block there.
- Every call is enqueued on the current CuPy stream, like the CuPy work that
  produces and consumes its buffers, so nothing waits on the host.
- Buffers: inputs are made C-contiguous; results are fresh arrays.  Data
  movement (gather, all-to-all, send/recv) moves bytes, so every dtype goes
  as it is; reductions run in the dtype when NCCL has it (int8/uint8,
  (u)int32/64, float16/32/64, bfloat16), else widened ((u)int16) and cast
  back; bools reduce as uint8 0/1 with max for sum (a sum cast back to bool is
  "any", and a uint8 sum would wrap to False at 256 members) and min/max as
  they are; complex sums run on the real and imaginary parts.
- Unlike the ``mpi`` backend, ``SPMD_COLLECTIVE_TIMEOUT`` is not applied:
  NCCL calls return before the transfer completes.

cupy is imported inside the functions only: importing this module on a
machine without CuPy costs nothing.
"""

from __future__ import annotations

import atexit
import functools
import sys

import numpy as np

from spmd.collectives.backend import run
from spmd.collectives.transport import define_rules
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind
from spmd.errors import SpmdError
from spmd.collectives import mpi
from spmd.launch import nodes


class NCCLError(SpmdError, RuntimeError):
    """NCCL is missing, or a collective failed (the message names it and its ranks)."""


def _modules():
    """``(cupy, cupy.cuda.nccl)``, or NCCLError saying what to install."""
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as e:
        raise NCCLError(f"the nccl backend needs CuPy with NCCL ({e}); install CuPy "
                        "(`pip install cupy-cuda12x` or `cupy-cuda13x`) and NCCL "
                        "(`pip install nvidia-nccl-cu12` / `nvidia-nccl-cu13`), or set "
                        "SPMD_GPU_BACKEND=mpi") from None
    if not getattr(nccl, "available", False):
        raise NCCLError("CuPy cannot load the NCCL library; install it (`pip install "
                        "nvidia-nccl-cu12` or `nvidia-nccl-cu13`, matching the CuPy package) "
                        "or set SPMD_GPU_BACKEND=mpi to stage collectives through host memory")
    return cupy, nccl


# Communicators made so far, by their ordered tuple of world ranks.
_communicators: dict = {}
_release_at_exit = [False]


def communicator(ranks: tuple):
    """The NCCL communicator over world ``ranks`` in that order (member i is ranks[i])."""
    comm = _communicators.get(ranks)
    if comm is None:
        comm = _communicators[ranks] = _make_communicator(ranks)
        if not _release_at_exit[0]:
            atexit.register(release)
            _release_at_exit[0] = True
    return comm


def _make_communicator(ranks: tuple):
    cp, nccl = _modules()
    n = len(ranks)
    if n == 1:
        return nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    what = "setting up the NCCL communicator"
    comm = mpi.communicator(ranks, what)
    me = comm.Get_rank()
    # Collective over the members (over MPI): watched like a collective, so that a
    # member that never comes is reported, not waited for (NCCL's own set-up after
    # it has no deadline).
    with mpi.Collective(ranks, what, control_traffic=True, checked=False):
        _check_distinct_gpus(cp, comm, ranks)
        uid = comm.bcast(nccl.get_unique_id() if me == 0 else None, root=0)
    return nccl.NcclCommunicator(n, uid, me)


def _check_distinct_gpus(cp, comm, ranks) -> None:
    """NCCL cannot put two members on one GPU: compare the members' (node, PCI bus
    id) over MPI and say which ranks collide (NCCL's own error is less clear).  The
    node is the host, and with ``SPMD_SIMULATE_NODES`` its simulated node too
    (``host/node1``: :func:`spmd.launch.nodes.node_name`), whose GPUs are its own."""
    read = nodes.reading()  # never raises: every member must reach the exchange
    node = nodes.node_name() if read[0] == "ok" else None
    gathered = comm.allgather((read, node, cp.cuda.Device().pci_bus_id))
    nodes.check_agreed([g[0] for g in gathered], ranks)  # raises on every member alike
    everyone = [g[1:] for g in gathered]
    for i, who in enumerate(everyone):
        first = everyone.index(who)
        if first != i:
            raise NCCLError(
                f"world ranks {ranks[first]} and {ranks[i]} both use GPU {who[1]} on host "
                f"{who[0]}: NCCL cannot put two ranks on one GPU. Give each rank of a node its "
                "own GPU (at most as many ranks per node as GPUs; with CUDA_VISIBLE_DEVICES, a "
                "different one per rank), or set SPMD_GPU_BACKEND=mpi to share GPUs and stage "
                "collectives through host memory")


def release() -> None:
    """Wait for the GPU, then destroy every NCCL communicator (registered with
    ``atexit`` when the first one is made; also safe to call earlier, after which
    communicators are made again on demand).

    >>> release()
    """
    comms = list(_communicators.values())
    _communicators.clear()
    if not comms:
        return
    try:
        import cupy

        cupy.cuda.Device().synchronize()  # no NCCL call may still be queued on the GPU
    finally:  # (a CUDA error of earlier work is raised after the destruction)
        for comm in comms:
            comm.destroy()


@functools.lru_cache(maxsize=None)
def _tables():
    """(NCCL datatype by numpy dtype, NCCL op by name), built once."""
    _, nccl = _modules()
    types = {np.dtype(np.int8): nccl.NCCL_INT8, np.dtype(np.uint8): nccl.NCCL_UINT8,
             np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.uint32): nccl.NCCL_UINT32,
             np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint64): nccl.NCCL_UINT64,
             np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
             np.dtype(np.float64): nccl.NCCL_FLOAT64}
    try:
        import ml_dtypes

        # NCCL >= 2.10 has bfloat16 (its enum value is 9 where CuPy lacks the name).
        types[np.dtype(ml_dtypes.bfloat16)] = getattr(nccl, "NCCL_BFLOAT16", 9)
    except ImportError:
        pass
    ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}
    return types, ops


# Reductions on types NCCL lacks run in a wider one (and are cast back).
_WIDEN = {np.dtype(np.bool_): np.dtype(np.uint8), np.dtype(np.int16): np.dtype(np.int32),
          np.dtype(np.uint16): np.dtype(np.uint32)}
_COMPLEX_PARTS = {np.dtype(np.complex64): np.dtype(np.float32),
                  np.dtype(np.complex128): np.dtype(np.float64)}


def _contiguous(cp, x):
    return x if x.flags.c_contiguous else cp.ascontiguousarray(x)


def _reducible(cp, x, op: str, what):
    """``(buffer, NCCL datatype, elements per value, dtype to cast back to or None,
    NCCL op)``."""
    types, ops = _tables()
    dt = x.dtype
    back = None
    if dt == np.bool_ and op == "sum":
        op = "max"  # cast back to bool, a sum is "any"; a uint8 sum wraps at 256 members
    if dt in _WIDEN:
        x, back = x.astype(_WIDEN[dt]), dt
    elif dt in _COMPLEX_PARTS:
        if op != "sum":
            raise NCCLError(f"{what or 'allreduce'}: NCCL cannot take the {op} of complex "
                            f"values ({dt})")
        return _contiguous(cp, x), types[_COMPLEX_PARTS[dt]], 2, None, ops[op]
    nccl_type = types.get(x.dtype)
    if nccl_type is None:
        raise NCCLError(f"{what or 'allreduce'}: NCCL has no reduction over {x.dtype}; use "
                        "SPMD_GPU_BACKEND=mpi, or convert the values first")
    return _contiguous(cp, x), nccl_type, 1, back, ops[op]


def _failed(call: str, ranks, what, e):
    return NCCLError(f"{what or call} (NCCL {call}) over world ranks {list(ranks)} failed: "
                     f"{type(e).__name__}: {e}")


def _stream(cp) -> int:
    return cp.cuda.get_current_stream().ptr


# ---------------------------------------------------------------- the calls

def allreduce(x, ranks, op, what=None):
    """Sum/max/min of ``x`` over the members; every member gets the result."""
    cp, _ = _modules()
    comm = communicator(ranks)
    buf, nccl_type, per, back, nccl_op = _reducible(cp, x, op, what)
    out = cp.empty(buf.shape, buf.dtype)
    if buf.size:
        try:
            comm.allReduce(buf.data.ptr, out.data.ptr, buf.size * per, nccl_type, nccl_op,
                           _stream(cp))
        except Exception as e:  # noqa: BLE001 - NcclError and CUDA errors alike
            raise _failed(f"allReduce({op})", ranks, what, e) from None
    return out.astype(back) if back is not None else out


def allgather(x, ranks, what=None):
    """``(members, *x.shape)``: row i is member i's ``x``."""
    cp, nccl = _modules()
    comm = communicator(ranks)
    src = _contiguous(cp, x)
    out = cp.empty((len(ranks),) + src.shape, src.dtype)
    if src.nbytes:
        try:
            comm.allGather(src.data.ptr, out.data.ptr, src.nbytes, nccl.NCCL_UINT8,
                           _stream(cp))
        except Exception as e:  # noqa: BLE001
            raise _failed("allGather", ranks, what, e) from None
    return out


def reduce_scatter(x, ranks, op="sum", what=None):
    """``x`` has the member count as its leading axis; member k gets the sum of row k."""
    cp, _ = _modules()
    comm = communicator(ranks)
    buf, nccl_type, per, back, nccl_op = _reducible(cp, x, op, what)
    out = cp.empty(buf.shape[1:], buf.dtype)
    if out.size:
        try:
            comm.reduceScatter(buf.data.ptr, out.data.ptr, out.size * per, nccl_type, nccl_op,
                               _stream(cp))
        except Exception as e:  # noqa: BLE001
            raise _failed(f"reduceScatter({op})", ranks, what, e) from None
    return out.astype(back) if back is not None else out


def alltoall(x, ranks, what=None):
    """``x`` has the member count as its leading axis; row j goes to member j, and row
    i of the result comes from member i (grouped point-to-point calls)."""
    cp, nccl = _modules()
    comm = communicator(ranks)
    src = _contiguous(cp, x)
    out = cp.empty(src.shape, src.dtype)
    n = len(ranks)
    block = src.nbytes // n if n else 0
    if block:
        stream = _stream(cp)
        try:
            nccl.groupStart()
            try:
                for j in range(n):
                    comm.send(src.data.ptr + j * block, block, nccl.NCCL_UINT8, j, stream)
                    comm.recv(out.data.ptr + j * block, block, nccl.NCCL_UINT8, j, stream)
            finally:
                nccl.groupEnd()
        except Exception as e:  # noqa: BLE001
            raise _failed("send/recv (all-to-all)", ranks, what, e) from None
    return out


def sendrecv(x, ranks, dst, src, what=None):
    """Send ``x`` to member ``dst`` and receive from member ``src`` (either may be
    None; without a source the result is zeros)."""
    cp, nccl = _modules()
    comm = communicator(ranks)
    buf = _contiguous(cp, x)
    out = cp.zeros(buf.shape, buf.dtype) if src is None else cp.empty(buf.shape, buf.dtype)
    if buf.nbytes and (dst is not None or src is not None):
        stream = _stream(cp)
        try:
            nccl.groupStart()
            try:
                if dst is not None:
                    comm.send(buf.data.ptr, buf.nbytes, nccl.NCCL_UINT8, dst, stream)
                if src is not None:
                    comm.recv(out.data.ptr, out.nbytes, nccl.NCCL_UINT8, src, stream)
            finally:
                nccl.groupEnd()
        except Exception as e:  # noqa: BLE001
            raise _failed("send/recv", ranks, what, e) from None
    return out


# --------------------------------------------------------- the primitive

nccl_p = Primitive("nccl", traits=(), effectful=True)
nccl_p.rules.communicates = True


@nccl_p.def_impl
def _nccl_impl(xp, x, *, kind, ranks, op=None, dst=None, src=None, what=None):
    cp, _ = _modules()
    dev = x if type(x) is cp.ndarray else cp.asarray(x)  # host values (xp numpy) move
    out = run(sys.modules[__name__], kind, dev, ranks,
              {"op": op, "dst": dst, "src": src, "what": what})
    return out if xp is cp else cp.asnumpy(out)


define_rules(nccl_p, "nccl")


def call(kind, x, ranks, **params):
    """Bind the ``nccl`` primitive (the interface of :func:`spmd.collectives.mpi.call`):
    ``kind`` is one of allreduce, allgather, reduce_scatter, alltoall, sendrecv."""
    return bind(nccl_p, x, kind=kind, ranks=tuple(int(r) for r in ranks), **params)
