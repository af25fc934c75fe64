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
"""

from __future__ import annotations

import collections
import functools
import math
import mmap
import os
import sys
import threading
import weakref

import numpy as np

from spmd.collectives.mpi import hier as mpi_hier, p2p as mpi_p2p, shm as mpi_shm
from spmd.collectives.mpi.control import (Collective, CollectiveThreadError,  # noqa: F401
                                          CollectiveTimeoutError, Site, complete_within,
                                          register, site_here)
from spmd.collectives.transport import define_rules
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind
from spmd.errors import ArgumentError
from spmd.collectives.backend import bound
from spmd.collectives.mpi.control import checking, control as control_comm
from spmd.launch import nodes
from spmd.launch.mpi import world as _world


def world():
    return _world()


_comms: dict = {}  # ranks -> the data communicator of that group


def communicator(ranks: tuple, what=None):
    """A communicator over world ``ranks`` in that order (rank i of it is ranks[i]),
    made by the first collective over them (``what``: that collective, for reports)."""
    comm = _comms.get(ranks)
    return comm if comm is not None else _make_communicator(ranks, what)


def _make_communicator(ranks: tuple, what):
    """Make the data and control communicators of ``ranks``, collectively over them.

    Watched like a collective (the deadline and ``spmd-run``'s check for ranks that
    finished): a member that exits or skips its first call would otherwise leave the
    others in ``MPI_Comm_dup`` for ever, with no report."""
    site = what.setting_up() if isinstance(what, Site) else \
        Site(str(what or "a collective"), phase="setting up the communicator of its ranks")
    with Collective(ranks, site, control_traffic=True, checked=False):
        comm = _comms.get(ranks)
        if comm is not None:  # another thread of this process made it meanwhile
            return comm
        comm = world()
        if len(ranks) != comm.Get_size() or ranks != tuple(range(len(ranks))):
            comm = comm.Create_group(comm.Get_group().Incl(list(ranks)))
        ctl = register(ranks, comm)  # its control twin (spmd.collectives.mpi.control)
        _agree_settings(ranks, ctl)
        _comms[ranks] = comm
    return comm


def _settings() -> tuple:
    """The environment settings that choose a collective's algorithm (every member must
    choose alike), or the error reading them gave."""
    try:
        return ("ok", mpi_shm.size_range(), _split_bytes(), checking(), nodes.simulated(),
                mpi_hier.min_bytes())
    except ArgumentError as e:
        return ("error", str(e))


def _agree_settings(ranks: tuple, ctl) -> None:
    """Check, once per communicator, that its members read the same algorithm settings
    (``SPMD_MPI_SHM_MIN_BYTES``, ``SPMD_MPI_SHM_MAX_BYTES``,
    ``SPMD_MPI_ALLREDUCE_SPLIT_BYTES``, ``SPMD_CHECK_COLLECTIVES``,
    ``SPMD_SIMULATE_NODES``, ``SPMD_MPI_HIER_MIN_BYTES``): members choosing
    differently would pair one member's shared-memory barrier, or collective check,
    with another's MPI call.  Every member raises alike."""
    every = ctl.allgather(_settings())
    if all(e == every[0] for e in every) and every[0][0] == "ok":
        return
    lines = "\n".join(f"  rank {r}: " + (f"(min, slot) = {e[1]}, split = {e[2]}, check = {e[3]}, "
                                          f"simulated nodes = {e[4]}, hierarchy from = {e[5]}"
                                          if e[0] == "ok" else e[1])
                      for r, e in zip(ranks, every))
    raise ArgumentError(
        f"the MPI ranks {list(ranks)} read different or invalid collective settings:\n{lines}\n"
        "Give every rank the same SPMD_MPI_SHM_MIN_BYTES, SPMD_MPI_SHM_MAX_BYTES, "
        "SPMD_MPI_ALLREDUCE_SPLIT_BYTES, SPMD_CHECK_COLLECTIVES, SPMD_SIMULATE_NODES and "
        "SPMD_MPI_HIER_MIN_BYTES (or leave them unset)")


# MPI has no reduction over these types: reduce in a wider one.
_WIDEN = {np.dtype(np.float16): np.dtype(np.float32), np.dtype(np.bool_): np.dtype(np.uint8)}


def _widen(x):
    dt = _WIDEN.get(x.dtype)
    if dt is None and x.dtype.kind == "V":  # bfloat16 and other extension types
        dt = np.dtype(np.float32)
    if dt is None and type(x) is np.ndarray and x.flags.c_contiguous:
        return x, None  # the common case: MPI reads it as it is
    # C order: MPI reads the buffer's memory (astype would keep a transposed layout).
    # (np.ascontiguousarray makes 0-d arrays 1-d: keep the shape.)
    buf = np.ascontiguousarray(x, dtype=dt).reshape(x.shape)
    return (buf, x.dtype) if dt is not None else (buf, None)


def _bytes(x):
    """A contiguous byte view of ``x`` (data movement needs no MPI datatype)."""
    return np.ascontiguousarray(x).view(np.uint8)


_OPS: dict = {}


def _op(name):
    op = _OPS.get(name)
    if op is None:  # built once: this sits on every reduction's path
        from mpi4py import MPI

        _OPS.update(sum=MPI.SUM, max=MPI.MAX, min=MPI.MIN)
        op = _OPS[name]
    return op


# ------------------------------------------------------- receive buffers
#
# A fresh large numpy buffer is fresh memory from the kernel: every page
# faults (and is zeroed) when MPI first writes it, which cost as much as the
# transfer itself (32 MiB: ~10 ms of faults).  So receive buffers of
# POOL_MIN_BYTES or more are kept and reused -- but only once nothing refers to
# them any more: every numpy view holds a reference to its base, so a buffer
# whose only reference is the pool's list is dead and may be overwritten.

POOL_MIN_BYTES = 64 * 1024
POOL_PER_SHAPE = 4           # buffers kept per (shape, dtype)
POOL_MAX_BYTES = 1 << 30     # all kept buffers together
_pool: dict = {}
_pool_bytes = [0]


def _refs_when_free() -> int:
    """What sys.getrefcount reports, in _recv_buffer's loop, for a buffer only the pool
    holds (3 on CPython 3.11: the list, the loop variable, the call's argument);
    measured the same way, so an interpreter that counts differently is followed."""
    kept = [np.empty(1)]
    for buf in kept:
        return sys.getrefcount(buf)
    raise AssertionError  # pragma: no cover


_FREE_REFS = _refs_when_free()


def _recv_buffer(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array to receive into: a dead pooled one when there is one.

    The pool keeps each buffer's memory owner; every array made from it (the result,
    the caller's views of it) holds that owner as its ``base``, so an owner only the
    pool refers to is dead, whatever views were handed out."""
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes < POOL_MIN_BYTES:
        return np.empty(shape, dtype)
    kept = _pool.setdefault((shape, dtype), [])
    for owner in kept:
        if sys.getrefcount(owner) == _FREE_REFS:
            return _in(owner, shape, dtype, nbytes)
    owner = np.empty(shape, dtype) if nbytes < HUGE_BYTES else _huge_owner(nbytes)
    if len(kept) < POOL_PER_SHAPE and _pool_bytes[0] + owner.nbytes <= POOL_MAX_BYTES:
        kept.append(owner)
        _pool_bytes[0] += owner.nbytes
    return _in(owner, shape, dtype, nbytes)


# Receive buffers of HUGE_BYTES or more are backed by transparent huge pages: each
# is its own private anonymous mapping, advised MADV_HUGEPAGE, used from its first
# 2 MiB boundary.  MPI's shared-memory copies into such a buffer were 1.2-1.4x
# faster at 4 MiB on 2 ranks (reduce-scatter + all-gather: 550-620 against
# 760-950 us, the input and everything else the same; no difference at 256 KiB),
# 2026-12-02.  np.empty is not enough: once a process has freed large blocks,
# glibc serves the next ones from memory it already mapped with small pages, and
# numpy's advice comes too late for those -- a pool buffer made mid-run had 0 of 22
# sampled pages huge (/proc/self/pagemap), one made at start-up 16 of 18.
HUGE_BYTES = 2 * 1024 * 1024


def _huge_owner(nbytes: int) -> np.ndarray:
    """A fresh uint8 array of ``nbytes + HUGE_BYTES`` in its own private mapping,
    advised for huge pages (np.empty where the platform has no such mapping)."""
    size = nbytes + HUGE_BYTES
    try:
        mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError):  # no MAP_PRIVATE (Windows), or no mapping left
        return np.empty(size, np.uint8)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mem.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: small pages, still right
            pass
    # The array keeps the mapping alive (its base); every view's base is the array.
    return np.frombuffer(mem, np.uint8)


def _in(owner: np.ndarray, shape: tuple, dtype, nbytes: int) -> np.ndarray:
    """The receive array in ``owner`` (itself, or its 2 MiB-aligned part)."""
    if nbytes < HUGE_BYTES:
        return owner
    off = (-owner.__array_interface__["data"][0]) % HUGE_BYTES
    return owner[off:off + nbytes].view(dtype).reshape(shape)


def clear_buffers() -> None:
    """Drop the kept receive buffers (their memory goes back once no result uses it)."""
    _pool.clear()
    _pool_bytes[0] = 0


# ---------------------------------------------------------------- the calls

# From this many bytes on, an all-reduce that MPI runs (members on several
# nodes, shared memory off, or an all-reduce started without waiting past a
# slot of spmd.collectives.mpi.shm) is a reduce-scatter + all-gather (in place,
# into one buffer).  Measured with the PyPI mpich wheel (5.0) on 2 and
# 4 ranks (benchmarks/results/mpi_n2.json, mpi_n4.json, 2026-12-01, quiet machine):
# Allreduce is 2.1-2.5x slower at 32 MiB (it maps fresh scratch memory on every
# large call) and 1.2-1.3x slower at 4 MiB; the two are even at 256 KiB on 2 ranks
# and Allreduce is faster there on 4.
# SPMD_MPI_ALLREDUCE_SPLIT_BYTES overrides it (0: never split).
ALLREDUCE_SPLIT_BYTES = 2 * 1024 * 1024


@functools.lru_cache(maxsize=None)
def _split_bytes() -> int:
    raw = os.environ.get("SPMD_MPI_ALLREDUCE_SPLIT_BYTES", "").strip()
    try:
        value = int(raw) if raw else ALLREDUCE_SPLIT_BYTES
    except ValueError:
        raise ArgumentError(f"SPMD_MPI_ALLREDUCE_SPLIT_BYTES={raw!r} is not a number of "
                            f"bytes; unset it for the default ({ALLREDUCE_SPLIT_BYTES}), or "
                            "0 to never split") from None
    return value if value > 0 else 1 << 62


def _split_slice(comm, buf, out, n: int):
    """This member's slice of ``out`` when the all-reduce of ``buf`` over ``n`` members
    runs as reduce-scatter + all-gather (from ``ALLREDUCE_SPLIT_BYTES``, when it divides
    evenly), else None: the one choice of algorithm, blocking or started."""
    if buf.nbytes < _split_bytes() or buf.size % n:
        return None
    k, me = buf.size // n, comm.Get_rank()
    return out.reshape(-1)[me * k:(me + 1) * k]


_plans = mpi_hier.plans  # ranks -> its Plan, or None: flat (decided once per communicator)


def _hier(ranks, comm, nbytes: int, what):
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
    buf, orig = _widen(x)
    if (plan := _hier(ranks, comm, buf.nbytes, what)) is not None:
        out = plan.allreduce(buf, op, what)
        return out.astype(orig) if orig is not None else out
    out = _recv_buffer(buf.shape, buf.dtype)
    with Collective(ranks, what):
        shm = op == "sum" and mpi_shm.segment_for(ranks, comm, buf.nbytes, "allreduce")
        if shm:
            shm.allreduce_sum(buf, out)
        elif (mine := _split_slice(comm, buf, out, len(ranks))) is not None:
            # Reduce-scatter into this member's slice of `out`, then gather the slices.
            from mpi4py import MPI

            comm.Reduce_scatter_block(buf, mine, op=_op(op))
            comm.Allgather(MPI.IN_PLACE, out.reshape(-1))
        else:
            comm.Allreduce(buf, out, op=_op(op))
    return out.astype(orig) if orig is not None else out


def allgather(x, ranks, what=None, *, control=False):
    """Every member's ``x`` stacked along a new leading axis (``control=True``: over the
    control communicator, for agreement checks that must not pair with data)."""
    comm = control_comm(ranks, what) if control else communicator(ranks, what)
    n = len(ranks)
    src = _bytes(x)
    if not control and (plan := _hier(ranks, comm, src.nbytes, what)) is not None:
        return plan.allgather(src, what).view(x.dtype).reshape((n,) + x.shape)
    out = _recv_buffer((n,) + src.shape, np.uint8)
    with Collective(ranks, what, control_traffic=control):
        shm = not control and mpi_shm.segment_for(ranks, comm, src.nbytes, "move")
        if shm:
            shm.allgather(src, out)
        else:
            comm.Allgather(src, out)
    return out.view(x.dtype).reshape((n,) + x.shape)


def reduce_scatter(x, ranks, op="sum", what=None):
    """``x`` has the member count as its leading axis; member k gets the sum of row k."""
    comm = communicator(ranks, what)
    buf, orig = _widen(x)
    if (plan := _hier(ranks, comm, buf.nbytes, what)) is not None:
        out = plan.reduce_scatter(buf, op, what)
        return out.astype(orig) if orig is not None else out
    out = _recv_buffer(buf.shape[1:], buf.dtype)
    with Collective(ranks, what):
        shm = op == "sum" and mpi_shm.segment_for(ranks, comm, buf.nbytes,
                                                  "reduce_scatter")
        if shm:
            shm.reduce_scatter_sum(buf, out)
        else:
            comm.Reduce_scatter_block(buf, out, op=_op(op))
    return out.astype(orig) if orig is not None else out


def alltoall(x, ranks, what=None):
    """``x`` has the member count as its leading axis; row j goes to member j."""
    comm = communicator(ranks, what)
    n = len(ranks)
    src = _bytes(x)
    out = _recv_buffer(src.shape, np.uint8)
    with Collective(ranks, what):
        shm = mpi_shm.segment_for(ranks, comm, src.nbytes, "move")
        if shm:  # (rows of bytes: a 1-d x's byte view has n * itemsize entries)
            shm.alltoall(src.reshape(n, -1), out.reshape(n, -1))
        else:
            comm.Alltoall(src, out)
    return out.view(x.dtype).reshape(x.shape)


# A ppermute's send of at most this many bytes is not waited for: the sender goes on
# as soon as what it receives has come (a pipeline stage runs ahead of a slower
# neighbour instead of meeting it at every tick).  The message is copied first (the
# generated code may write into the operand's buffer as soon as the call returns);
# larger ones are sent from the operand and waited for.
DEFERRED_SEND_MAX_BYTES = 16 << 20
# Sends in flight at most (their copies are held until MPI has sent them).
DEFERRED_SENDS_MAX = 8
_sends: collections.deque = collections.deque()  # (request, the bytes it sends)
_sends_lock = threading.Lock()  # (threads on different groups of ranks share them)


def sendrecv(x, ranks, dst, src, what=None):
    """Send ``x`` to member ``dst`` and receive from member ``src`` (either may be None).

    Returns when the message from ``src`` has come; a send of up to
    :data:`DEFERRED_SEND_MAX_BYTES` completes later (MPI keeps a message's order
    between two ranks, so the receiver gets them in the order they were sent).
    """
    from mpi4py import MPI

    comm = communicator(ranks, what or "ppermute")
    with Collective(ranks, what or "ppermute"):
        out, reqs, _ = _post(comm, x, ranks, dst, src)
        if reqs and isinstance(reqs[0], mpi_p2p.Receive):
            reqs[0].Wait()
        else:
            MPI.Request.Waitall(reqs)
        settle_sends()
    return out


def _post(comm, x, ranks, dst, src) -> tuple:
    """Post the receive from ``src`` and the send to ``dst``: ``(receive buffer, the
    requests to wait for, the buffer a waited-for send reads)``.  Between members of
    one node, through their shared outboxes (:mod:`spmd.collectives.mpi.p2p`: the
    send is done when this returns); else a send of up to
    :data:`DEFERRED_SEND_MAX_BYTES` is of a copy and is not waited for."""
    # C order whatever x's layout (zeros_like would keep a transposed x's strides, and
    # MPI receives into the buffer's bytes as one run); zeros where nothing arrives (a
    # ppermute's result there), else every byte is written: a pooled buffer (fresh
    # pages cost their faults: a 256 KiB ppermute in a hot loop took 138 us into fresh
    # pages and 31 us into pooled ones, on two ranks through the outboxes).
    out = np.zeros(x.shape, x.dtype) if src is None else _recv_buffer(x.shape, x.dtype)
    chan = mpi_p2p.channel_for(ranks, comm, x.nbytes)
    if chan is not None:
        # (A send never waits for its reader: see mpi_p2p.Channel.send.)
        reqs = [chan.receive(src, out)] if src is not None else []
        overflow = chan.send(_bytes(x).reshape(-1), dst) if dst is not None else None
        if overflow is not None:  # (its outbox was full: by MPI, like a deferred send)
            _settled_at_exit()
            with _sends_lock:
                _sends.append(overflow)
        return out, reqs, None
    reqs, keep = [], None
    if src is not None:
        # (reshape first: a 0-d array cannot be viewed as bytes)
        reqs.append(comm.Irecv(out.reshape(-1).view(np.uint8), source=src, tag=11))
    if dst is not None and x.nbytes <= DEFERRED_SEND_MAX_BYTES:
        data = _bytes(x).reshape(-1).copy()  # (a 0-d x too: _bytes makes it 1-d)
        _settled_at_exit()
        with _sends_lock:
            _sends.append((comm.Isend(data, dest=dst, tag=11), data))
    elif dst is not None:
        keep = _bytes(x).reshape(-1)
        reqs.append(comm.Isend(keep, dest=dst, tag=11))
    return out, reqs, keep


class Exchange:
    """A started :func:`isendrecv`: ``test()`` lets MPI move its data, ``wait()``
    returns what came from ``src`` (zeros where nothing comes)."""

    __slots__ = ("_reqs", "_out", "_keep", "_ranks", "_what", "_xp", "__weakref__")

    def __init__(self, reqs, out, keep, ranks, what, xp=np):
        self._reqs, self._out, self._keep = reqs, out, keep
        self._ranks, self._what, self._xp = ranks, what, xp
        if reqs:
            _settled_at_exit()
            _live_exchanges.add(self)

    def test(self) -> bool:
        return all([r.Test() for r in self._reqs])  # (each tested: each moves on)

    def wait(self):
        # A wait is a collective for the watchdog (a hang here gets the deadline report),
        # on every member alike, whether it receives or not.
        with Collective(self._ranks, self._what):
            for r in self._reqs:
                r.Wait()
            self._reqs, self._keep = [], None
            settle_sends()
        out = self._out
        return out if self._xp is np else self._xp.asarray(out)

    def __del__(self):
        if self._reqs:
            # Never waited for (the program raised between start and wait): MPI may
            # still write the receive buffer and read the send, kept until it is done.
            _abandoned.extend((r, self._out, self._keep) for r in self._reqs)


_live_exchanges = weakref.WeakSet()  # started exchanges not yet waited for


def isendrecv(x, ranks, dst, src, what=None, xp=np) -> Exchange:
    """Start :func:`sendrecv` and return its :class:`Exchange` at once: the receive is
    posted and the message sent, so the caller computes while it travels and waits
    where it needs what comes (a pipeline stage sends a cotangent back as soon as it
    has it and takes the next one only at the end of its tick: the overlap pass,
    ``spmd.compiler.passes.overlap``, places the wait).

    >>> r = isendrecv(y, (0, 1), dst=1, src=None); ...; got = r.wait()  # doctest: +SKIP
    """
    what = what or "ppermute"
    comm = communicator(ranks, what)
    with Collective(ranks, what):
        out, reqs, keep = _post(comm, x, ranks, dst, src)
    return Exchange(reqs, out, keep, ranks, what, xp)


def settle_sends(wait: bool = False) -> None:
    """Drop the deferred sends MPI has finished (all of them, waiting, if ``wait``),
    and wait for the oldest beyond :data:`DEFERRED_SENDS_MAX`."""
    with _sends_lock:
        while _sends and (wait or len(_sends) > DEFERRED_SENDS_MAX or _sends[0][0].Test()):
            _sends.popleft()[0].Wait()


# ------------------------------------------------- nonblocking all-reduce

class Request:
    """A started all-reduce (:func:`iallreduce`).  ``test()`` lets MPI move its data
    (the PyPI ``mpich`` wheel has no progress thread: data moves only inside MPI
    calls); ``wait()`` completes it and returns the result."""

    __slots__ = ("_req", "_out", "_orig", "_keep", "_ranks", "_what", "_xp", "_gather",
                 "__weakref__")

    def __init__(self, req, out, orig, keep, ranks, what, xp=np, gather=None):
        self._req, self._out, self._orig, self._keep = req, out, orig, keep
        self._ranks, self._what, self._xp, self._gather = ranks, what, xp, gather
        if keep is not None:  # an MPI request: completed at exit if never waited for
            _settled_at_exit()
            _live.add(self)

    def test(self) -> bool:
        return self._req.Test()

    def wait(self):
        # A wait is a collective for the watchdog: a hang here gets the deadline report.
        with Collective(self._ranks, self._what):
            self._req.Wait()
            if self._gather is not None:  # the split all-reduce's second half
                from mpi4py import MPI

                self._gather.Allgather(MPI.IN_PLACE, self._out.reshape(-1))
        self._keep = None  # MPI no longer reads the send buffer
        out = self._out if self._orig is None else self._out.astype(self._orig)
        return out if self._xp is np else self._xp.asarray(out)

    def __del__(self):
        # (A shared-memory sum keeps nothing: its segment finishes it at the next start
        # of its ring slot, spmd.collectives.mpi.shm.)
        if self._keep is not None:
            # Never waited for (the program raised between start and wait): MPI may
            # still read and write these buffers, so they are kept until MPI is done.
            _abandoned.append((self._req, self._out, self._keep))


_abandoned: list = []
_live = weakref.WeakSet()  # started MPI requests not yet waited for (or abandoned)
_exit_hook: list = []


def _settled_at_exit() -> None:
    """Have :func:`_settle_at_exit` run at exit (once)."""
    if not _exit_hook:
        import atexit

        atexit.register(_settle_at_exit)  # (after MPI's own: so it runs first)
        _exit_hook.append(True)


def _settle_at_exit(limit_s: float = 5.0) -> None:
    """At exit, before MPI finalises: complete the started all-reduces never waited
    for, dropped or still referenced, and the deferred sends."""
    complete_within([a[0] for a in _abandoned]
                    + [r._req for r in list(_live) if r._keep is not None]
                    + [r for e in list(_live_exchanges) for r in e._reqs]
                    + [r for r, _ in _sends], limit_s)


def iallreduce(x, ranks, op, what=None, xp=np) -> Request:
    """Start an all-reduce of ``x`` over world ``ranks`` and return its :class:`Request`
    at once.  From ``ALLREDUCE_SPLIT_BYTES`` on, as the blocking :func:`allreduce`, it
    is a reduce-scatter (started now) and an all-gather, issued by ``wait()``: a
    point of the program, the same on every rank (``test()`` could issue it at
    different moments on different ranks, out of order with other collectives).
    ``Iallreduce`` was as slow as ``Allreduce`` at 32 MiB, ``Ireduce_scatter_block`` +
    ``Allgather`` as fast as the blocking pair (2 ranks, 2026-12-01).  Over several
    nodes it is hierarchical (:meth:`spmd.collectives.mpi.hier.Plan.start`).

    >>> r = iallreduce(g, (0, 1), "sum"); ...; total = r.wait()  # doctest: +SKIP
    """
    comm = communicator(ranks, what)
    buf, orig = _widen(x)
    if (plan := _hier(ranks, comm, buf.nbytes, what)) is not None:
        return plan.start(buf, op, what, orig, xp)  # (step 1 now, step 2 started)
    out = _recv_buffer(buf.shape, buf.dtype)
    mine, gather = _split_slice(comm, buf, out, len(ranks)), None
    with Collective(ranks, str(what) if what is not None else None):
        shm = op == "sum" and mpi_shm.segment_for(ranks, comm, buf.nbytes, "started")
        if shm:
            # The operand is copied into shared memory now: nothing to keep alive.
            return Request(shm.start_sum(buf, out), out, orig, None, ranks, what, xp)
        if mine is not None:
            req = comm.Ireduce_scatter_block(buf, mine, op=_op(op))
            gather = comm
        else:
            req = comm.Iallreduce(buf, out, op=_op(op))
    return Request(req, out, orig, buf, ranks, what, xp, gather)


def _mpi_start(xp, x, *, kind, ranks, op=None, dst=None, src=None, what=None):
    """The ``start`` rule (spmd.compiler.passes.overlap) of the ``mpi`` primitive: an
    all-reduce or a send-receive (a ``ppermute``) started without waiting."""
    host = np.asarray(x) if xp is np else xp.asnumpy(x)
    if kind == "sendrecv":
        return isendrecv(host, ranks, dst, src, what, xp)
    if kind != "allreduce":
        raise ValueError(f"mpi: only an all-reduce or a send-receive can be started "
                         f"without waiting, not {kind!r}")
    return iallreduce(host, ranks, op, what, xp)


# --------------------------------------------------------- the primitive

mpi_p = Primitive("mpi", traits=(), effectful=True)


@mpi_p.def_impl
def _mpi_impl(xp, x, *, kind, ranks, op=None, dst=None, src=None, what=None):
    # GPU arrays are staged through host memory (NCCL is the GPU path).
    host = np.asarray(x) if xp is np else xp.asnumpy(x)
    from spmd.collectives.backend import run  # the kinds' table and shared dispatch

    out = run(sys.modules[__name__], kind, host, ranks,
              {"op": op, "dst": dst, "src": src, "what": what})
    return out if xp is np else xp.asarray(out)


define_rules(mpi_p, "mpi")
mpi_p.rules.start = _mpi_start  # its all-reduces may overlap compute
# A send-receive starts on its own (it is never combined with another): the overlap
# pass waits for it where its result is first needed.
mpi_p.rules.starts_alone = lambda eqn: eqn.params["kind"] == "sendrecv"

# The blocking kinds, whose impl on host arrays is exactly the backend call.
_DIRECT_KINDS = frozenset({"allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv"})


class _BoundAllreduce:
    """:func:`allreduce` with its parameters bound, for one equation of generated code.

    Its first call of an operand's shape and dtype runs :func:`allreduce` and notes
    whether that was MPI's own ``Allreduce`` into a fresh array (a contiguous operand of
    a type MPI reduces, below the shared-memory, split and pool sizes: choices fixed by
    the size and the settings, read once).  Later calls of that shape and dtype make
    just that call, inside the same bookkeeping (:class:`Collective`, reused: a call
    sets every field it reads), so the per-call cost is the deadline's and thread
    rules' record and the array, not the choosing."""

    __slots__ = ("ranks", "op", "what", "fast", "record")

    def __init__(self, ranks: tuple, op: str, what):
        self.ranks, self.op, self.what = ranks, op, what
        self.fast = None    # (shape, dtype, communicator, MPI op) once known
        self.record = None  # the Collective reused by the fast calls

    def __call__(self, x):
        fast = self.fast
        if fast is None or x.__class__ is not np.ndarray or x.shape != fast[0] \
                or x.dtype is not fast[1] or not x.flags.c_contiguous:
            return self._first(x)
        out = np.empty(fast[0], fast[1])
        with self.record:
            fast[2].Allreduce(x, out, op=fast[3])
        return out

    def _first(self, x):
        out = allreduce(x, self.ranks, self.op, self.what)
        if self.fast is None and type(x) is np.ndarray and x.flags.c_contiguous \
                and x.dtype not in _WIDEN \
                and x.dtype.kind != "V" and x.nbytes < POOL_MIN_BYTES:
            comm = communicator(self.ranks, self.what)
            shm = self.op == "sum" and mpi_shm.segment_for(self.ranks, comm, x.nbytes,
                                                           "allreduce")
            if not shm and _split_slice(comm, x, x, len(self.ranks)) is None \
                    and _hier(self.ranks, comm, x.nbytes, self.what) is None:
                self.record = Collective(self.ranks, self.what)
                self.fast = (x.shape, x.dtype, comm, _op(self.op))
        return out


def _bind_impl(xp, *, kind, ranks, op=None, dst=None, src=None, what=None):
    """For generated code on numpy: the backend operation itself, its parameters bound
    (no impl frame, kind lookup or keyword dict per call); None: the impl."""
    if xp is not np or kind not in _DIRECT_KINDS:
        return None
    if kind == "allreduce":
        return _BoundAllreduce(ranks, op, what)
    return bound(sys.modules[__name__], kind, ranks,
                 {"op": op, "dst": dst, "src": src, "what": what})


mpi_p.rules.bind_impl = _bind_impl
mpi_p.rules.communicates = True


def call(kind, x, ranks, **params):
    """Bind the ``mpi`` primitive; ``what=`` names the spmd collective it implements (for
    the timeout message)."""
    if "what" in params:  # where it comes from, for deadline reports (at trace time)
        params["what"] = site_here(params["what"])
    return bind(mpi_p, x, kind=kind, ranks=tuple(int(r) for r in ranks), **params)
