"""Messages MPI completes later: a ``ppermute``'s send-receive (its small sends
deferred), exchanges and all-reduces started without waiting (:class:`Exchange`,
:class:`Request`, for the overlap pass), and their completion at exit.

>>> from spmd.collectives import mpi
>>> r = mpi.iallreduce(g, (0, 1), "sum"); ...; total = r.wait()  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import collections
import threading
import weakref

import numpy as np

from spmd.collectives.mpi import p2p as mpi_p2p, shm as mpi_shm
from spmd.collectives.mpi.buffers import as_bytes, recv_buffer, reduce_op, widen
from spmd.collectives.mpi.calls import hier_plan, split_slice
from spmd.collectives.mpi.communicators import communicator
from spmd.collectives.mpi.control import Collective, complete_within


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
    with Collective(ranks, what or "ppermute") as c:
        c.nbytes = x.nbytes
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
    out = np.zeros(x.shape, x.dtype) if src is None else recv_buffer(x.shape, x.dtype)
    chan = mpi_p2p.channel_for(ranks, comm, x.nbytes)
    if chan is not None:
        # (A send never waits for its reader: see mpi_p2p.Channel.send.)
        reqs = [chan.receive(src, out)] if src is not None else []
        overflow = chan.send(as_bytes(x).reshape(-1), dst) if dst is not None else None
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
        data = as_bytes(x).reshape(-1).copy()  # (a 0-d x too: as_bytes makes it 1-d)
        _settled_at_exit()
        with _sends_lock:
            _sends.append((comm.Isend(data, dest=dst, tag=11), data))
    elif dst is not None:
        keep = as_bytes(x).reshape(-1)
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
        # on every member alike, whether it receives or not.  On the timeline: from
        # this member's arrival at the wait to the message's completion (the send and
        # the travel overlapped the compute since the start, recorded on its own).
        with Collective(self._ranks, self._what) as c:
            c.nbytes = self._out.nbytes
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
    # On the timeline the start is a collective of its own (its post, usually short);
    # the wait is another (Exchange.wait).
    with Collective(ranks, what) as c:
        c.nbytes = x.nbytes
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
        # On the timeline it is a collective of its own: from this member's arrival at
        # the wait to the result's completion; the time the data moved during the
        # compute since the start is not seen (MPI does not say when that was).
        with Collective(self._ranks, self._what) as c:
            c.nbytes = self._out.nbytes
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
    buf, orig = widen(x)
    if (plan := hier_plan(ranks, comm, buf.nbytes, what)) is not None:
        return plan.start(buf, op, what, orig, xp)  # (step 1 now, step 2 started)
    out = recv_buffer(buf.shape, buf.dtype)
    mine, gather = split_slice(comm, buf, out, len(ranks)), None
    # On the timeline: the start (posting the operation, or copying into the shared
    # window) as one collective; the wait as another (Request.wait).
    with Collective(ranks, str(what) if what is not None else None) as c:
        c.nbytes = buf.nbytes
        shm = op == "sum" and mpi_shm.segment_for(ranks, comm, buf.nbytes, "started")
        if shm:
            # The operand is copied into shared memory now: nothing to keep alive.
            return Request(shm.start_sum(buf, out), out, orig, None, ranks, what, xp)
        if mine is not None:
            req = comm.Ireduce_scatter_block(buf, mine, op=reduce_op(op))
            gather = comm
        else:
            req = comm.Iallreduce(buf, out, op=reduce_op(op))
    return Request(req, out, orig, buf, ranks, what, xp, gather)
