"""A stand-in for ``cupy.cuda.nccl`` over :mod:`tests.gpu.fake_cupy`, on the CPU.

``fake_cupy.install()`` makes it ``cupy.cuda.nccl`` when ``FAKE_CUPY_NCCL=1``.  Its
calls move the bytes behind the device pointers they are given, with mpi4py
between processes, and check what spmd passes the way NCCL and CuPy's binding
would fail on a GPU:

- a communicator of ``n`` members is made by exactly ``n`` processes calling
  ``NcclCommunicator(n, uid, rank)`` with the same id and distinct ranks; any
  subset of an MPI job's ranks can form one (the members meet through the id,
  which names its creator, and then form an MPI group of their own); two members
  on one GPU (same host and PCI bus id; with ``SPMD_SIMULATE_NODES`` each simulated
  node is a host of its own) are refused, as NCCL refuses them
  ("Duplicate GPU detected");
- a communicator is bound to the GPU current at its creation; a pointer that is
  not inside a live array of that GPU is an error (``NcclError``), as are counts
  that run past the array's memory, unknown datatypes or ops, and arguments that
  are not integers (CuPy's binding takes ``intptr_t``/``size_t``/``int``);
- ``send``/``recv`` must be inside ``groupStart``/``groupEnd`` (spmd always
  groups them), and a receive must get exactly the bytes it asked for;
- every call must be on CuPy's current stream (another stream would race with
  the CuPy work that makes and reads the buffers);
- calls on a destroyed communicator are errors; ``FAKE_NCCL_TRACE=path`` appends
  one line per creation and destruction (with whether MPI was already finalised)
  so a test can check that spmd destroys its communicators before MPI ends.

Every call is also appended to :data:`calls` (name, count, datatype, op) so a
test can check which NCCL operation spmd chose.  It runs synchronously: NCCL's
asynchrony (the host returns before the transfer) is not simulated.
"""

from __future__ import annotations

import operator
import os
import socket
import sys
import types

import numpy as np

# NCCL's enums (nccl.h).
SUM, PROD, MAX, MIN, AVG = range(5)
(INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16) = range(10)
_SIZES = {INT8: 1, UINT8: 1, INT32: 4, UINT32: 4, INT64: 8, UINT64: 8, FLOAT16: 2,
          FLOAT32: 4, FLOAT64: 8, BFLOAT16: 2}
_NUMPY = {INT8: np.int8, UINT8: np.uint8, INT32: np.int32, UINT32: np.uint32, INT64: np.int64,
          UINT64: np.uint64, FLOAT16: np.float16, FLOAT32: np.float32, FLOAT64: np.float64}

calls: list = []       # (call, count, datatype, op) of every call, in order
_pending: list = []    # grouped send/recv: (communicator, kind, buffer, peer)
_depth = [0]           # groupStart nesting
_uids = [0]            # unique ids made by this process


class NcclError(RuntimeError):
    """What CuPy raises for a failed NCCL call (``NCCL_ERROR_...: ...``)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"NCCL_ERROR_{kind} (fake NCCL): {detail}")


def _cupy():
    return sys.modules["cupy"]  # the installed fake_cupy (the one holding the arrays)


def _trace(line: str) -> None:
    path = os.environ.get("FAKE_NCCL_TRACE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {line}\n")


def _mpi_finalized() -> bool | None:
    mpi = sys.modules.get("mpi4py.MPI")
    return None if mpi is None else bool(mpi.Is_finalized())


def _int(value, what: str) -> int:
    """CuPy's binding converts arguments to C integers: anything else is a TypeError."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"fake NCCL: {what} must be an integer, got "
                        f"{type(value).__name__}") from None


def _world_rank() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 0
    return mpi.COMM_WORLD.Get_rank()


def get_unique_id() -> tuple:
    """128 signed bytes, as CuPy's: here they name the creating world rank and a counter."""
    _uids[0] += 1
    raw = list(_world_rank().to_bytes(4, "big")) + list(_uids[0].to_bytes(4, "big"))
    return tuple(b - 128 for b in raw) + (0,) * 120


def _decode(uid) -> tuple[int, int]:
    raw = bytes(int(b) + 128 for b in uid[:8])
    return int.from_bytes(raw[:4], "big"), int.from_bytes(raw[4:], "big")


def get_version() -> int:
    return 22800


def groupStart() -> None:
    _depth[0] += 1


def groupEnd() -> None:
    if _depth[0] == 0:
        raise NcclError("INVALID_USAGE", "groupEnd without groupStart")
    _depth[0] -= 1
    if _depth[0]:
        return
    ops, _pending[:] = list(_pending), []
    remote = [op for op in ops if op[0]._mpi is not None]
    local = [op for op in ops if op[0]._mpi is None]
    # One member: each send to itself meets its receive, in order.
    sends = [b for _, k, b, _ in local if k == "send"]
    recvs = [b for _, k, b, _ in local if k == "recv"]
    if len(sends) != len(recvs):
        raise NcclError("INVALID_USAGE", f"{len(sends)} send(s) but {len(recvs)} recv(s) "
                        "to oneself in one group")
    for src, dst in zip(sends, recvs):
        _check_size(dst.nbytes, src.nbytes)
        dst[...] = src
    if remote:
        from mpi4py import MPI

        reqs = [(comm._mpi.Isend(buf.copy(), dest=peer, tag=21) if kind == "send" else
                 comm._mpi.Irecv(buf, source=peer, tag=21), kind, buf)
                for comm, kind, buf, peer in remote]
        for req, kind, buf in reqs:
            status = MPI.Status()
            req.Wait(status)
            if kind == "recv":
                _check_size(buf.nbytes, status.Get_count(MPI.BYTE))


def _check_size(want: int, got: int) -> None:
    if want != got:
        raise NcclError("INVALID_USAGE", f"a recv of {want} bytes met a send of {got} bytes")


def _memory(ptr, count, datatype, device: int, what: str):
    """The host view of ``count`` elements of ``datatype`` at device pointer ``ptr``."""
    import ctypes

    ptr, count, datatype = _int(ptr, what), _int(count, "count"), _int(datatype, "datatype")
    if datatype not in _SIZES:
        raise NcclError("INVALID_ARGUMENT", f"unknown datatype {datatype}")
    nbytes = count * _SIZES[datatype]
    found = _cupy().allocation_of(ptr, nbytes)
    if found is None:
        raise NcclError("INVALID_ARGUMENT", f"{what} 0x{ptr:x} ({nbytes} bytes) is not inside "
                        "a live device array")
    if found[0] != device:
        raise NcclError("INVALID_ARGUMENT", f"{what} 0x{ptr:x} is memory of device "
                        f"{found[0]}, but the communicator's device is {device}")
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr)) if nbytes else \
        np.zeros(0, np.uint8)
    if datatype == BFLOAT16:
        import ml_dtypes

        return raw.view(ml_dtypes.bfloat16)
    return raw.view(_NUMPY[datatype])


class NcclCommunicator:
    """A communicator of ``ndev`` members; this process is member ``rank``."""

    def __init__(self, ndev, commId, rank):
        ndev, rank = _int(ndev, "ndev"), _int(rank, "rank")
        if len(commId) != 128 or not 0 <= rank < ndev:
            raise NcclError("INVALID_ARGUMENT", f"rank {rank} of {ndev}, id of {len(commId)} "
                            "bytes")
        self._n, self._rank, self._mpi, self._destroyed = ndev, rank, None, False
        self._device = _cupy().cuda.runtime.getDevice()
        if ndev > 1:
            self._mpi = _join(ndev, commId, rank)
            _check_distinct_gpus(self._mpi, self._device)
        _trace(f"create size={ndev} rank={rank}")

    def size(self) -> int:
        return self._n

    def rank_id(self) -> int:
        return self._rank

    def device_id(self) -> int:
        return self._device

    def destroy(self) -> None:
        if not self._destroyed:
            self._destroyed = True
            _trace(f"destroy size={self._n} mpi_finalized={_mpi_finalized()}")
            if self._mpi is not None and not _mpi_finalized():
                self._mpi.Free()

    abort = destroy

    def _live(self, call: str, stream) -> None:
        if self._destroyed:
            raise NcclError("INVALID_USAGE", f"{call} on a destroyed communicator")
        current = _cupy().cuda.get_current_stream().ptr
        if _int(stream, "stream") != current:
            # NCCL would accept it, but the call would race with the CuPy work that
            # makes and reads its buffers (queued on the current stream).
            raise NcclError("INVALID_USAGE", f"{call} on stream {stream}, not on CuPy's "
                            f"current stream {current} (fake NCCL: a race on a GPU)")
        if _cupy().cuda.runtime.getDevice() != self._device:
            raise NcclError("INVALID_USAGE", f"{call} while device "
                            f"{_cupy().cuda.runtime.getDevice()} is current; the communicator "
                            f"was made on device {self._device}")

    def _op(self, op):
        op = _int(op, "op")
        if op not in (SUM, PROD, MAX, MIN):
            raise NcclError("INVALID_ARGUMENT", f"unknown reduction op {op}")
        from mpi4py import MPI

        return {SUM: MPI.SUM, PROD: MPI.PROD, MAX: MPI.MAX, MIN: MPI.MIN}[op]

    def _reduce(self, src, dst, op, scatter: bool):
        if self._mpi is None:
            dst[...] = src
            return
        wide = src.dtype.itemsize == 2 and src.dtype.kind == "V"  # bfloat16: in float32
        send = src.astype(np.float32) if wide else src.copy()
        out = np.empty(dst.shape, np.float32) if wide else dst
        if scatter:
            self._mpi.Reduce_scatter_block(send, out, op=self._op(op))
        else:
            self._mpi.Allreduce(send, out, op=self._op(op))
        if wide:
            dst[...] = out.astype(dst.dtype)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        self._live("allReduce", stream)
        calls.append(("allReduce", count, datatype, op))
        src = _memory(sendbuf, count, datatype, self._device, "sendbuff")
        dst = _memory(recvbuf, count, datatype, self._device, "recvbuff")
        self._op(op) if self._mpi is not None else _int(op, "op")
        self._reduce(src, dst, op, scatter=False)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        self._live("reduceScatter", stream)
        calls.append(("reduceScatter", recvcount, datatype, op))
        src = _memory(sendbuf, _int(recvcount, "recvcount") * self._n, datatype, self._device,
                      "sendbuff")
        dst = _memory(recvbuf, recvcount, datatype, self._device, "recvbuff")
        self._reduce(src, dst, op, scatter=True)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        self._live("allGather", stream)
        calls.append(("allGather", count, datatype, None))
        src = _memory(sendbuf, count, datatype, self._device, "sendbuff").copy()
        dst = _memory(recvbuf, _int(count, "count") * self._n, datatype, self._device,
                      "recvbuff")
        if self._mpi is None:
            dst[...] = src
        else:
            self._mpi.Allgather(src, dst)

    def _p2p(self, kind, buf, count, datatype, peer, stream):
        self._live(kind, stream)
        calls.append((kind, count, datatype, None))
        peer = _int(peer, "peer")
        if _depth[0] == 0:
            raise NcclError("INVALID_USAGE", f"{kind} outside groupStart/groupEnd (spmd "
                            "groups every send and recv)")
        if not 0 <= peer < self._n:
            raise NcclError("INVALID_ARGUMENT", f"{kind} peer {peer} of {self._n} members")
        what = "sendbuff" if kind == "send" else "recvbuff"
        _pending.append((self, kind, _memory(buf, count, datatype, self._device, what), peer))

    def send(self, sendbuf, count, datatype, peer, stream):
        self._p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._p2p("recv", recvbuf, count, datatype, peer, stream)


def _join(n: int, uid, rank: int):
    """The members meet: each tells the id's creator its world rank, which answers with
    all of them in member order; then they form an MPI group (collective over the
    members only, like NCCL's communicator creation)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    root, serial = _decode(uid)
    tag = 20000 + serial % 10000
    me = world.Get_rank()
    if rank == 0:
        if me != root:
            raise NcclError("INVALID_USAGE", f"member 0 is world rank {me}, but the id was made "
                            f"by world rank {root}")
        members = {0: me}
        for _ in range(n - 1):
            r, w = world.recv(source=MPI.ANY_SOURCE, tag=tag)
            if r in members:
                raise NcclError("INVALID_USAGE", f"two processes claim member rank {r}")
            members[r] = w
        order = [members[i] for i in range(n)]
        for w in order[1:]:
            world.send(order, dest=w, tag=tag)
    else:
        world.send((rank, me), dest=root, tag=tag)
        order = world.recv(source=root, tag=tag)
    group = world.Get_group().Incl(order)
    comm = world.Create_group(group, tag=tag)
    group.Free()
    return comm


def _machine() -> str:
    """The machine this process pretends to be on: the host, or with
    ``SPMD_SIMULATE_NODES=K`` its simulated node (K contiguous blocks of world ranks,
    the first ``n % K`` one longer), whose fake GPUs are its own, as a real node's
    are.  Worked out here, not by spmd: the stand-in checks spmd's numbering."""
    from mpi4py import MPI

    raw = os.environ.get("SPMD_SIMULATE_NODES", "").strip()
    n, me = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    if not raw or n == 1:
        return socket.gethostname()
    k = int(raw)
    sizes = [n // k + (i < n % k) for i in range(k)]
    node = next(i for i in range(k) if me < sum(sizes[:i + 1]))
    return f"{socket.gethostname()} (simulated node {node})"


def _check_distinct_gpus(comm, device: int) -> None:
    mine = (_machine(), _cupy().cuda.Device(device).pci_bus_id)
    everyone = comm.allgather(mine)
    for i, who in enumerate(everyone):
        j = everyone.index(who)
        if j != i:
            raise NcclError("INVALID_USAGE", f"Duplicate GPU detected: rank {j} and rank {i} "
                            f"both on GPU {who[1]} of {who[0]}")


def module() -> types.ModuleType:
    """This module, as ``cupy.cuda.nccl`` (CuPy's names for the enums)."""
    mod = sys.modules[__name__]
    mod.available = True
    for name, value in (("SUM", SUM), ("PROD", PROD), ("MAX", MAX), ("MIN", MIN),
                        ("AVG", AVG), ("INT8", INT8), ("UINT8", UINT8), ("INT32", INT32),
                        ("UINT32", UINT32), ("INT64", INT64), ("UINT64", UINT64),
                        ("FLOAT16", FLOAT16), ("FLOAT32", FLOAT32), ("FLOAT64", FLOAT64),
                        ("BFLOAT16", BFLOAT16)):
        setattr(mod, "NCCL_" + name, value)
    calls.clear()
    _pending.clear()
    _depth[0] = 0
    return mod
