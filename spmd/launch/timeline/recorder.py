"""The recorder: one bounded buffer of events per process while a trace is on.

Hooks in the layers above read :data:`ACTIVE` (a module global, None when no
trace is on: one load and one comparison on their path, no call) and, when it
is set, add an event with :meth:`Recorder.span` or :meth:`Recorder.counter`.
Times are this process's ``time.monotonic()`` seconds, the clock the
collectives already read; the merge (:mod:`spmd.launch.timeline.merge`) moves
them onto the common clock with the offset the ranks measured at start-up.

An event is a tuple (cheap to make on a hot path):

- ``("X", name, cat, t0, t1, tid, args)``: a span from ``t0`` to ``t1``;
- ``("C", name, t, tid, args)``: counter values at ``t`` (``args`` maps each
  series to a number).

``tid`` is the global id of the device the event belongs to, or :data:`HOST`
for the process's host-side work (user annotations, checkpoints).  A
collective's span has ``cat == "collective"`` and ``args`` with ``comm`` (its
members, e.g. ``"0,1,2,3"``), ``seq`` (its number on that communicator, the
same on every member), ``op`` and ``bytes``; it runs from this member's arrival
to its exit, and the merge splits it at the last member's arrival.

A spool (``spool=`` a file name) receives the events as JSON lines: the
recorder appends what it holds every :data:`FLUSH_EVENTS` events, every
:data:`FLUSH_SECONDS` (a thread of its own, so a rank that sleeps or hangs is
written too), and at :func:`flush`, so that a rank killed mid-job still leaves
what it recorded up to a quarter of a second before.  Lines are
``{"meta": {...}}`` (this rank's facts; later keys replace earlier ones) or an
event as a JSON array.  A reader skips a torn last line.

>>> from spmd.launch.timeline import recorder
>>> r = recorder.start(rank=0, host="node0")
>>> r.span("jit(step)", "program", 1.0, 1.5, tid=0)
>>> recorder.stop()["events"][0][:2]
('X', 'jit(step)')
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque

HOST = -1  # the tid of a process's host-side work
DEFAULT_CAPACITY = 1_000_000  # events a process keeps (about 150 MB of tuples at most)
FLUSH_EVENTS = 20_000
FLUSH_SECONDS = 0.25  # (mpiexec SIGKILLs a failed job's other ranks: what they lose)

ACTIVE: "Recorder | None" = None  # the recording in progress, read by every hook


class Recorder:
    """One process's events.  ``capacity``: the most it holds in all (kept in memory
    without a spool; on a spool, written out); past it, events are dropped and
    counted (``dropped``), and the trace says so."""

    def __init__(self, rank: int = 0, host: str | None = None, capacity: int | None = None,
                 spool: str | None = None, skew: float = 0.0):
        self.rank = rank
        self.host = host or socket.gethostname()
        self.capacity = int(capacity or DEFAULT_CAPACITY)
        self.spool = spool
        self.skew = skew  # seconds added to this process's clock (tests of the alignment)
        self.offset = 0.0  # this clock minus the common clock, seconds (from the alignment)
        self.error = None  # the alignment's error bound, seconds (None: not aligned)
        self.events: deque = deque()
        self.recorded = 0  # events accepted (written or held)
        self.dropped = 0
        self._lock = threading.Lock()  # flushes only; appends are atomic in CPython
        self._meta_written = False
        self._stopped = threading.Event()
        if spool:
            os.makedirs(os.path.dirname(os.path.abspath(spool)), exist_ok=True)
            with open(spool, "w"):
                pass  # (a fresh file per run: an earlier attempt's events are not this one's)
            # A rank that stops recording events (asleep, hung, waiting in MPI) still
            # has its latest on file within FLUSH_SECONDS: a job killed then keeps them.
            threading.Thread(target=self._flush_every_second, daemon=True,
                             name="spmd-timeline-flush").start()

    def _flush_every_second(self) -> None:
        while not self._stopped.wait(FLUSH_SECONDS):
            if self.events:
                try:
                    self.flush()
                except OSError:
                    return  # (the spool's disk is gone: the rank's exit flush says so)

    # ------------------------------------------------------------- recording
    def span(self, name: str, cat: str, t0: float, t1: float, tid: int = HOST,
             args: dict | None = None) -> None:
        """Record a span of this process from ``t0`` to ``t1`` (``time.monotonic()``)."""
        self._add(("X", name, cat, t0, t1, tid, args))

    def spans(self, name: str, cat: str, t0: float, t1: float, tids,
              args: dict | None = None) -> None:
        """The same span on each track of ``tids`` (a program or a collective of
        several devices of this process): one call for all of them."""
        room = self.capacity - self.recorded
        if room < len(tids):
            self.dropped += len(tids) - max(room, 0)
            tids = tids[:max(room, 0)]
        self.recorded += len(tids)
        self.events.extend([("X", name, cat, t0, t1, tid, args) for tid in tids])

    def counter(self, name: str, t: float, tid: int, values: dict) -> None:
        """Record counter ``values`` (series name -> number) of ``tid`` at ``t``."""
        self._add(("C", name, t, tid, values))

    def _add(self, event: tuple) -> None:
        if self.recorded >= self.capacity:
            self.dropped += 1
            return
        self.recorded += 1
        self.events.append(event)
        if self.spool and len(self.events) >= FLUSH_EVENTS:
            self.flush()

    def now(self) -> float:
        """This process's clock as the trace sees it (``time.monotonic()``, plus the
        test skew): what the alignment exchanges."""
        return time.monotonic() + self.skew

    def aligned(self, offset: float, error: float) -> None:
        """Note the alignment's result: this clock minus the common one, and its bound."""
        self.offset, self.error = offset, error
        self._meta_written = False

    # --------------------------------------------------------------- output
    def meta(self) -> dict:
        return {"rank": self.rank, "host": self.host, "pid": os.getpid(),
                "offset": self.offset, "error": self.error, "capacity": self.capacity,
                "recorded": self.recorded, "dropped": self.dropped}

    def _shifted(self, events):
        """Events with the test skew added to their times (as their clock read them)."""
        s = self.skew
        if not s:
            return list(events)
        return [(e[0], e[1], e[2], e[3] + s, e[4] + s, e[5], e[6]) if e[0] == "X"
                else (e[0], e[1], e[2] + s, e[3], e[4]) for e in events]

    def flush(self) -> None:
        """Append what is held to the spool (no-op without one)."""
        if not self.spool:
            return
        with self._lock:
            taken = []
            while self.events:
                taken.append(self.events.popleft())
            lines = [json.dumps(e, separators=(",", ":"), default=_plain)
                     for e in self._shifted(taken)]
            lines.append(json.dumps({"meta": self.meta()}, default=_plain))
            with open(self.spool, "a") as f:
                f.write("\n".join(lines) + "\n")

    def part(self) -> dict:
        """This process's record as the merge reads it: ``{"meta": ..., "events": [...]}``
        (what is held; with a spool, read the file instead: :func:`read_part`)."""
        return {"meta": self.meta(), "events": self._shifted(self.events)}


def _plain(x):
    """JSON for numpy scalars and other number-likes in args."""
    try:
        return x.item()
    except AttributeError:
        return str(x)


def read_part(path: str) -> dict:
    """A spool file as ``{"meta": ..., "events": [...]}`` (a torn last line skipped)."""
    meta, events = {}, []
    with open(path) as f:
        for line in f:
            try:
                item = json.loads(line)
            except ValueError:
                continue  # (the writer was killed mid-line)
            if isinstance(item, dict):
                meta.update(item.get("meta", {}))
            else:
                events.append(tuple(item))
    return {"meta": meta, "events": events}


# ------------------------------------------------------------------ the one recording

def start(rank: int = 0, host: str | None = None, capacity: int | None = None,
          spool: str | None = None, skew: float = 0.0) -> Recorder:
    """Begin recording in this process (one recording at a time)."""
    global ACTIVE
    if ACTIVE is not None:
        raise RuntimeError("a trace is already being recorded in this process; stop it "
                           "first (spmd.profiler.stop_trace())")
    ACTIVE = Recorder(rank, host, capacity, spool, skew)
    return ACTIVE


def stop() -> dict:
    """End the recording; its part (after a last flush to the spool, if any)."""
    global ACTIVE
    r, ACTIVE = ACTIVE, None
    if r is None:
        raise RuntimeError("no trace is being recorded in this process "
                           "(spmd.profiler.start_trace(path) starts one)")
    r._stopped.set()
    if r.spool:
        r.flush()
        return read_part(r.spool)
    return r.part()


def flush() -> None:
    """Write what the active recording holds to its spool (at a rank's end, before an
    abort); nothing when no trace is on."""
    r = ACTIVE
    if r is not None:
        try:
            r.flush()
        except OSError:
            pass  # (ending anyway: a full disk must not hide the job's own error)
