"""The ``mpi`` backend's control plane: communicators, call sites, threads, deadline.

Data collectives and control traffic never share a communicator.  Every group
of ranks gets two: the data communicator (``spmd.collectives.mpi``) and its
duplicate, the *control* communicator, which carries the fingerprint
exchanges (``spmd.shard.call.fingerprint``), the thread checks below and the
deadline reports (:mod:`spmd.collectives.mpi.watchdog`).  MPI matches
collectives by order on one communicator, so with one communicator a rank that
called one collective too many would pair its data with another rank's
fingerprint exchange and return garbage; with two, it can only wait, and the
deadline turns the wait into a report.

Every collective runs inside a :class:`Collective`, which records it for the
watchdog (what, where, since when) and enforces the thread rules: a process's
collectives over one group of ranks run one at a time (MPI forbids concurrent
collectives on one communicator), and as MPI pairs collectives by their order,
one issued from a thread other than the main thread is first checked with the
other ranks over the control communicator: they must issue it from threads of
the same name at the same equation, else all raise
:class:`CollectiveThreadError` naming each rank's thread, before any data moves.

The deadline is ``SPMD_COLLECTIVE_TIMEOUT`` seconds (default
:data:`DEFAULT_TIMEOUT_S`, 600 like PyTorch's NCCL watchdog; ``0`` disables it).
The MPI calls themselves stay blocking (no polling on the data path).  What runs
before any data moves is watched the same way: the set-up of a group's
communicators (``spmd.collectives.mpi.communicator``), the agreement on a program
(:func:`agreement_site` names it "the first call of jit(step)"), and MPI calls on
communicators of their own (:class:`Watched`, e.g. the checkpoint protocol's).

The checking mode (``SPMD_CHECK_COLLECTIVES=1``, :func:`checking`) compares every
collective across its ranks before its data moves (:func:`_check_call`).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import numpy as np

from spmd.collectives.mpi.buffers import as_bytes, recv_buffer
from spmd.errors import ArgumentError, ProgramMismatchError, SpmdError
from spmd.compiler.core.ir import Namer, pp_eqn
from spmd.compiler.core.trace import current_equation, current_function, user_source_info
from spmd.launch import runtime
from spmd.launch.mpi_init import world
from spmd.launch.timeline import recorder as _timeline

DEFAULT_TIMEOUT_S = 600.0


class CollectiveTimeoutError(SpmdError, RuntimeError):
    """A collective did not complete within its deadline (``SPMD_COLLECTIVE_TIMEOUT``)."""


class CollectiveThreadError(SpmdError, RuntimeError):
    """Two threads issued collectives over the same ranks at the same time."""


# ------------------------------------------------------------ the deadline

_limit: list = []


def timeout_s() -> float | None:
    """The collective deadline in seconds (None: disabled), read once from
    ``SPMD_COLLECTIVE_TIMEOUT`` (default 600; ``0`` disables it)."""
    if not _limit:
        raw = os.environ.get("SPMD_COLLECTIVE_TIMEOUT", "").strip()
        try:
            value = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise ArgumentError(f"SPMD_COLLECTIVE_TIMEOUT={raw!r} is not a number of seconds >= 0; "
                             f"set it to e.g. 600 (the default), or 0 to wait forever")
        _limit.append(value if value > 0 else None)
    return _limit[0]


def reset_timeout() -> None:
    """Read ``SPMD_COLLECTIVE_TIMEOUT`` again at the next collective (tests)."""
    _limit.clear()


def _setting() -> str:
    raw = os.environ.get("SPMD_COLLECTIVE_TIMEOUT", "").strip()
    return f"SPMD_COLLECTIVE_TIMEOUT={raw}" if raw else \
        "the default deadline; SPMD_COLLECTIVE_TIMEOUT=seconds changes it, 0 disables it"


def complete_within(pending: list, limit_s: float) -> None:
    """Test the MPI requests ``pending`` until all have completed or ``limit_s`` has
    passed.  For exit, before MPI finalises: requests every member posted complete at
    once, unless a member died or its program diverged -- hence the limit (then
    MPI's warning about pending requests is the report)."""
    deadline = time.monotonic() + limit_s
    while pending and time.monotonic() < deadline:
        pending = [r for r in pending if not r.Test()]


# ------------------------------------------------------------ the checking mode

_check: list = [None]


def checking() -> bool:
    """Whether every data collective is first compared across its ranks
    (``SPMD_CHECK_COLLECTIVES=1``; read once, like the deadline)."""
    if _check[0] is None:
        raw = os.environ.get("SPMD_CHECK_COLLECTIVES", "").strip().lower()
        if raw not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
            raise ArgumentError(f"SPMD_CHECK_COLLECTIVES={raw!r} is not a switch; set it to 1 "
                                "to compare every collective across its ranks, or 0 (the "
                                "default) not to")
        _check[0] = raw in ("1", "true", "yes", "on")
    return _check[0]


def reset_checking() -> None:
    """Read ``SPMD_CHECK_COLLECTIVES`` again at the next collective (tests)."""
    _check[0] = None


# ------------------------------------------------------ control communicators

_controls: dict = {}  # ranks -> the control communicator of that group


_hosts: dict = {}  # world rank -> its host, learned as each group's communicators are made


def register(ranks: tuple, data_comm):
    """Make and keep the control communicator of ``ranks`` (collective over them, like
    the data communicator ``data_comm`` made just before); learn their hosts, which
    reports name when the ranks span several (:func:`who`)."""

    comm = data_comm.Dup()
    _controls[ranks] = comm
    # One small exchange per group, once: the reports that need it come when a rank
    # may no longer answer.
    _hosts.update(zip(ranks, comm.allgather(socket.gethostname())))
    return comm


def _several_hosts() -> bool:
    return len(set(_hosts.values())) > 1


def who(rank: int) -> str:
    """``"rank 2"``; ``"rank 2 (node1)"`` when the job's ranks known here span several
    hosts (messages of a job on one host stay as they are).

    >>> who(0)                                                    # doctest: +SKIP
    'rank 0 (node0)'
    """
    host = _hosts.get(rank) if _several_hosts() else None
    return f"rank {rank}" + (f" ({host})" if host else "")


def on_hosts(ranks) -> str:
    """``" (node0, node1)"``: the hosts of ``ranks`` when the job spans several, else "".

    >>> "ranks [2, 3]" + on_hosts([2, 3])                        # doctest: +SKIP
    'ranks [2, 3] (node1)'
    """
    if not _several_hosts() or not ranks:
        return ""
    found = list(dict.fromkeys(_hosts.get(r, "?") for r in ranks))
    return f" ({', '.join(found)})"


def control(ranks: tuple, what=None):
    """The control communicator of world ``ranks`` (made with the data one, by the first
    collective over them: ``what``, for reports)."""
    comm = _controls.get(ranks)
    if comm is None:
        from spmd.collectives.mpi.communicators import communicator  # (it imports this module)

        communicator(ranks, what)
        comm = _controls[ranks]
    return comm


def _me() -> int:
    return world().Get_rank()


# ------------------------------------------------------------ statistics

_totals = [0, 0.0]  # data collectives completed (or raised) by this process, their seconds


def collective_time() -> tuple[int, float]:
    """``(calls, seconds)``: the MPI data collectives this process has run and the time
    spent in them, waiting for the other ranks included (control traffic excluded).

    >>> calls, seconds = collective_time()
    """
    return _totals[0], _totals[1]


# ------------------------------------------------------------ call sites

class Site(str):
    """What a collective equation is, for reports: a ``str`` (the spmd collective's
    name, e.g. ``"psum"``, as the backends' ``what`` parameter has always been) with
    the program, equation and source line it came from, and a count of its calls.
    ``phase`` says what the ranks do before any data moves (agreeing on the program,
    setting up a communicator), when they wait there."""

    def __new__(cls, what: str, program: str = "", equation: str = "", source: str = "",
                phase: str = ""):
        self = super().__new__(cls, what)
        self.program, self.equation, self.source = program, equation, source
        self.phase = phase
        self.calls = 0
        self.key = None  # its digest for the checking mode (made on first use)
        return self

    def describe(self) -> str:
        parts = [f"program {self.program}" if self.program else ""]
        if self.equation:
            parts.append(f"equation `{self.equation}`"
                         + (f" ({self.source})" if self.source else ""))
        text = ", ".join(p for p in parts if p)
        if self.phase:
            text = f"{text}; {self.phase}" if text else self.phase
        return text

    def setting_up(self) -> "Site":
        """This site while the first collective over its ranks sets up their
        communicator (collective over them: a member that never comes is waited for
        there).  A site that is itself before any data (agreeing on a program) stays
        as it is: setting up is part of it."""
        if self.phase:
            return self
        return Site(str(self), self.program, self.equation, self.source,
                    phase="setting up the communicator of its ranks")


def program_here() -> str:
    """The innermost jitted function whose call is being prepared in this thread
    (``"jit(step)"``, from :func:`spmd.compiler.core.trace.current_function`), else ``"an
    eager shard_map at file:line"``."""
    name = current_function()
    if name is not None:
        return name
    where = user_source_info()
    return "an eager shard_map" + (f" at {where}" if where is not None else "")


def agreement_site() -> Site:
    """What the ranks do while they agree on a program before its first run, for the
    deadline's and ``spmd-run``'s reports: "the first call of jit(step)" (agreeing on
    the program)."""
    program = program_here()
    what = f"the first call of {program}" if program.startswith("jit(") else program
    return Site(what, phase="agreeing on the program")


def site_here(what: str | None) -> Site | None:
    """A :class:`Site` for an ``mpi`` equation bound now (while a program is lowered):
    the equation being evaluated (:func:`spmd.compiler.core.trace.current_equation`, the
    context lowering hands down) and the jitted function being prepared."""
    if what is None or isinstance(what, Site):
        return what
    eqn = current_equation()
    program = program_here()
    equation = source = ""
    if eqn is not None:
        equation = pp_eqn(eqn, Namer(), indent=0).strip()
        if len(equation) > 160:
            equation = equation[:157] + "..."
        si = eqn.source_info
        # (A library frame, e.g. optree's tree_map under lax.psum, says nothing.)
        if si is not None and "-packages" not in si.file:
            source = str(si)
    return Site(what, program, equation, source)


# ------------------------------------------------------------ one collective

_seq: dict = {}        # ranks -> data collectives issued on that group so far
_busy: dict = {}       # ranks -> the thread last inside a collective over them
_locks: dict = {}
inflight: dict = {}    # thread id -> the Collective it is in (read by the watchdog)
_registry_lock = threading.Lock()


_MAIN = threading.main_thread().ident
_get_ident, _monotonic = threading.get_ident, time.monotonic  # (on every collective's path)


class Collective:
    """One collective over world ``ranks``: ``with Collective(ranks, what):`` around the
    (blocking) MPI calls that make it.  See the module docstring for what it enforces;
    ``control_traffic=True`` for the control communicator's own collectives."""

    __slots__ = ("ranks", "what", "control", "seq", "limit", "since", "thread", "lock",
                 "checked", "nbytes")

    def __init__(self, ranks: tuple, what, control_traffic: bool = False,
                 checked: bool = True):
        self.ranks, self.what, self.control = ranks, what, control_traffic
        self.checked = checked  # (False: it makes the control communicator it would use)
        self.limit = timeout_s()
        self.nbytes = 0  # this member's operand, for the timeline (set by the caller)

    def __enter__(self):
        ranks = self.ranks
        lock = _locks.get(ranks)
        if lock is None:
            with _registry_lock:
                lock = _locks.setdefault(ranks, threading.Lock())
        if not lock.acquire(False):  # (positional: a keyword costs ~0.1 µs per call)
            self._wait_for(lock)
        self.lock = lock
        me = self.thread = _get_ident()
        self.since = _monotonic()
        try:
            if self.control:
                self.seq = 0
            else:
                self.seq = _seq[ranks] = _seq.get(ranks, 0) + 1
                what = self.what
                if what.__class__ is Site:
                    what.calls += 1
            if not _watchdog_started:
                _start_watchdog()
            inflight[me] = self
            # (Unchecked ones first: a communicator's set-up reads the setting inside its
            # agreement, so that a bad value raises on every member alike.)
            if self.checked and (_check[0] if _check[0] is not None else checking()):
                _check_call(self)  # (covers the thread check below)
            elif me != _MAIN and not self.control:
                _check_threads(self)
        except BaseException:
            inflight.pop(me, None)
            lock.release()
            raise
        _busy[ranks] = me
        return self

    def __exit__(self, *exc):
        if not self.control:
            # Time in this process's data collectives (including waiting for the
            # others): what collective_time() reports.  Unlocked: a rare lost update
            # between threads on different groups only blurs a statistic.
            _totals[0] += 1
            end = _monotonic()
            _totals[1] += end - self.since
            if _timeline.ACTIVE is not None:  # (a trace is on: one global load when not)
                _record(self, _timeline.ACTIVE, end)
        inflight.pop(self.thread, None)
        self.lock.release()
        return False

    def _wait_for(self, lock) -> None:
        """Another thread of this process is in a collective over these ranks: wait for
        it (within the deadline)."""
        other = _thread_name(_busy.get(self.ranks))
        if lock.acquire(timeout=-1 if self.limit is None else self.limit):
            return
        raise CollectiveTimeoutError(
            f"rank {_me()}: thread {threading.current_thread().name!r} waited {self.limit:g}s "
            f"to issue {self.what or 'a collective'} over ranks {list(self.ranks)} while thread "
            f"{other!r} was in a collective over the same ranks "
            f"({_setting()})")

    def state(self) -> dict:
        """What another rank is told about this collective."""
        w = self.what
        return {"ranks": list(self.ranks), "seq": self.seq, "what": str(w or "a collective"),
                "where": w.describe() if isinstance(w, Site) else "",
                "call": getattr(w, "calls", 0), "since": self.wall()}

    def wall(self) -> float:
        """When it began, as ``time.time()``."""
        return time.time() - (time.monotonic() - self.since)


_first_device: list = []  # this process's first global device id (the trace's tid)
_comm_names: dict = {}    # ranks -> "0,1,2,3", the trace's name of the communicator


def _record(c: Collective, rec, end: float) -> None:
    """Add collective ``c`` (just ended) to the trace ``rec``: a span from this member's
    arrival to its exit, on this process's first device's track; the merge splits it
    at the last member's arrival (``spmd.launch.timeline.recorder``)."""
    if not _first_device:
        _first_device.append(world().Get_rank() * runtime.local_device_count())
    comm = _comm_names.get(c.ranks)
    if comm is None:
        comm = _comm_names[c.ranks] = ",".join(map(str, c.ranks))
    op = str(c.what) if c.what is not None else "collective"
    rec.span(op, "collective", c.since, end, _first_device[0],
             {"comm": comm, "seq": c.seq, "op": op, "bytes": c.nbytes})


class Watched(Collective):
    """MPI calls on a communicator of their own (e.g. the checkpoint protocol's), watched
    like a collective over world ``ranks``: the deadline's report and ``spmd-run``'s
    check for ranks that finished see them.  No lock and no checks: they are not the
    backend's collectives.

    >>> with Watched((0, 1), "checkpointing.save"):             # doctest: +SKIP
    ...     flags = comm.allgather(ok)
    """

    __slots__ = ()

    def __init__(self, ranks: tuple, what: str):
        super().__init__(ranks, Site(what), control_traffic=True, checked=False)

    def __enter__(self):
        self.seq, self.thread, self.since = 0, threading.get_ident(), time.monotonic()
        if not _watchdog_started:
            _start_watchdog()
        inflight[self.thread] = self
        return self

    def __exit__(self, *exc):
        inflight.pop(self.thread, None)
        return False


def _thread_name(ident) -> str:
    return next((t.name for t in threading.enumerate() if t.ident == ident), "?")


_watchdog_started = False


def _start_watchdog() -> None:
    global _watchdog_started
    with _registry_lock:
        if not _watchdog_started:
            from spmd.collectives.mpi import watchdog as mpi_watchdog

            mpi_watchdog.start()
            _watchdog_started = True


def _check_threads(c: Collective) -> None:
    """Before a collective from a non-main thread: check that every rank issues it
    from a thread of the same name at the same equation.  MPI pairs collectives by
    their order, which threads make differ from rank to rank; unchecked, a thread
    could receive another thread's data."""
    w = c.what
    desc = (f"thread {threading.current_thread().name!r} issues {w or 'a collective'}"
            + (f" in {w.describe()}" if isinstance(w, Site) else ""))
    digest = np.frombuffer(hashlib.blake2b(desc.encode(), digest_size=16).digest(), np.uint8)
    comm = control(c.ranks)
    src = as_bytes(digest)
    rows = recv_buffer((len(c.ranks), 16), np.uint8)
    comm.Allgather(src, rows)
    if all((r == rows[0]).all() for r in rows):
        return
    texts = comm.allgather(desc)  # every rank is here: the digests were exchanged
    detail = "\n".join(f"  {who(r)}: {t}" for r, t in zip(c.ranks, texts))
    raise CollectiveThreadError(
        f"collectives over ranks {list(c.ranks)} were issued from different threads on "
        f"different ranks, so they would pair one thread's data with another's:\n{detail}\n"
        "Issue a mesh's collectives from threads that run the same collectives in the same "
        "order on every rank (same thread names), or from one thread (e.g. the main thread)")


def _call_text(c: "Collective") -> str:
    """A collective as the checking mode compares it: its sequence number over its ranks,
    the spmd collective, its program and equation, and the thread (not the source line:
    checkouts may sit at other paths on other nodes)."""
    w = c.what
    thread = threading.current_thread().name
    if c.control:  # an agreement of its own (compared by kind, not by what it agrees on)
        doing = w.describe() if w.__class__ is Site else ""
        return (f"{w or 'a control exchange'}" + (f" ({doing})" if doing else "")
                + f", after collective #{c.seq}, from thread {thread!r}")
    text = str(w or "a collective")
    if w.__class__ is Site:
        where = ", ".join(p for p in (f"program {w.program}" if w.program else "",
                                      f"equation `{w.equation}`" if w.equation else "") if p)
        text += f" in {where}" if where else ""
    return f"collective #{c.seq}: {text}, from thread {thread!r}"


_CALL, _CONTROL = 1, 2  # the kinds of record the checking mode exchanges


def _check_call(c: "Collective") -> None:
    """The checking mode (``SPMD_CHECK_COLLECTIVES=1``): before a collective's data moves,
    its members compare, over the control communicator, a record of it: a data
    collective's sequence number over the ranks and what it is (collective, program,
    equation, thread); for an exchange on the control communicator itself (a program's
    agreement, a shape check), its kind and the data collectives before it.  On a
    difference every member raises :class:`ProgramMismatchError` naming the ranks,
    instead of pairing its data with another collective's (a silent wrong result when
    the shapes happen to fit) or waiting for the deadline.  One small control
    ``Allgather`` per collective (measured: docs/launching.md)."""
    if c.control:
        c.seq = _seq.get(c.ranks, 0)  # (reported, not counted: control traffic)
        mine = np.array((_CONTROL, c.seq, 0, 0), np.int64)
    else:
        w = c.what
        key = w.key if w.__class__ is Site else None
        if key is None or threading.get_ident() != _MAIN:
            text = _call_text(c).split(": ", 1)[1]  # (what it is, less the number)
            digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
            key = tuple(int(v) for v in np.frombuffer(digest, np.int64))
            if w.__class__ is Site and threading.get_ident() == _MAIN:
                w.key = key
        mine = np.array((_CALL, c.seq) + key, np.int64)
    rows = recv_buffer((len(c.ranks), 4), np.int64)
    comm = control(c.ranks)
    comm.Allgather(mine, rows)
    if (rows == mine).all():
        return
    texts = comm.allgather(_call_text(c))
    groups: dict = {}
    for r, t in zip(c.ranks, texts):
        groups.setdefault(t, []).append(r)
    detail = "\n".join(f"  rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                       f"{on_hosts(rs)}: {t}" for t, rs in groups.items())
    raise ProgramMismatchError(
        f"the ranks {list(c.ranks)} issue different collectives at the same point "
        f"(SPMD_CHECK_COLLECTIVES=1 compares each one before its data moves):\n{detail}\n"
        "A rank runs a program more (or less) often than the others, or takes a "
        "rank-dependent path to another collective; every rank of a mesh must make the "
        "same calls in the same order")
