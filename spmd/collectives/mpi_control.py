"""The ``mpi`` backend's control plane: deadlines, reports and thread checks.

Data collectives and control traffic never share a communicator.  Every group
of ranks gets two: the data communicator (``spmd.collectives.mpi``) and its
duplicate, the *control* communicator, which carries the fingerprint
exchanges (``spmd.shard.fingerprint``) and the deadline reports below.  MPI
matches collectives by order on one communicator, so with one communicator a
rank that called one collective too many would pair its data with another
rank's fingerprint exchange and return garbage; with two, it can only wait.

Every collective has a deadline: ``SPMD_COLLECTIVE_TIMEOUT`` seconds (default
:data:`DEFAULT_TIMEOUT_S`, 600 like PyTorch's NCCL watchdog; ``0`` disables it).
A waiting rank

- after :data:`PUBLISH_AFTER_S` seconds writes where it waits into
  ``$SPMD_LAUNCH_DIR`` (``spmd-run`` uses it to see that a rank which finished
  leaves others waiting), and answers the other ranks' questions about where it
  is (over the control communicators);
- at the deadline asks the members of its group where they are, waits
  :func:`grace_s` seconds for answers, and raises :class:`CollectiveTimeoutError`
  naming its program, equation and call, and which ranks never arrived.  The
  collective cannot be withdrawn from MPI, so its communicator is then unusable:
  later collectives on it raise at once, and the process aborts the MPI job when
  it exits (so that no rank waits in ``MPI_Finalize``).

Threads: a process's collectives over one group of ranks run one at a time (a
lock per group; MPI forbids concurrent collectives on one communicator).  As MPI
pairs collectives by their order, one issued from a thread other than the main
thread is first checked with the other ranks over the control communicator:
they must issue it from threads of the same name at the same equation, else all
raise :class:`CollectiveThreadError` naming each rank's thread, before any data
moves.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from spmd.errors import SpmdError

DEFAULT_TIMEOUT_S = 600.0
# Spin on MPI_Test this long before sleeping between tests (most collectives
# complete within it; a blocking MPI call spins too).
SPIN_S = 0.002
MAX_SLEEP_S = 0.001
# A wait this long is published (launch directory) and answers questions.
PUBLISH_AFTER_S = 1.0
SERVE_EVERY_S = 0.05
TAG_QUERY, TAG_STATE = 0x5D01, 0x5D02


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
            raise ValueError(f"SPMD_COLLECTIVE_TIMEOUT={raw!r} is not a number of seconds >= 0; "
                             f"set it to e.g. 600 (the default), or 0 to wait forever")
        _limit.append(value if value > 0 else None)
    return _limit[0]


def reset_timeout() -> None:
    """Read ``SPMD_COLLECTIVE_TIMEOUT`` again at the next collective (tests)."""
    _limit.clear()


def grace_s(limit: float) -> float:
    """How long a rank whose deadline fired waits for the others' answers."""
    return min(10.0, max(1.0, 0.05 * limit))


def _setting() -> str:
    raw = os.environ.get("SPMD_COLLECTIVE_TIMEOUT", "").strip()
    return f"SPMD_COLLECTIVE_TIMEOUT={raw}" if raw else \
        "the default deadline; SPMD_COLLECTIVE_TIMEOUT=seconds changes it, 0 disables it"


# ------------------------------------------------------ control communicators

_controls: dict = {}  # ranks -> the control communicator of that group


def register(ranks: tuple, data_comm):
    """Make and keep the control communicator of ``ranks`` (collective over them, like
    the data communicator ``data_comm`` made just before)."""
    comm = data_comm.Dup()
    _controls[ranks] = comm
    return comm


def control(ranks: tuple):
    """The control communicator of world ``ranks`` (made with the data one)."""
    comm = _controls.get(ranks)
    if comm is None:
        from spmd.collectives.mpi import communicator

        communicator(ranks)
        comm = _controls[ranks]
    return comm


def _me() -> int:
    from spmd.collectives.mpi import world

    return world().Get_rank()


# ------------------------------------------------------------ call sites

class Site(str):
    """What a collective equation is, for reports: a ``str`` (the spmd collective's
    name, e.g. ``"psum"``, as the backends' ``what`` parameter has always been) with
    the program, equation and source line it came from, and a count of its calls."""

    def __new__(cls, what: str, program: str = "", equation: str = "", source: str = ""):
        self = super().__new__(cls, what)
        self.program, self.equation, self.source = program, equation, source
        self.calls = 0
        return self

    def describe(self) -> str:
        parts = [f"program {self.program}" if self.program else ""]
        if self.equation:
            parts.append(f"equation `{self.equation}`"
                         + (f" ({self.source})" if self.source else ""))
        return ", ".join(p for p in parts if p)


def site_here(what: str | None) -> Site | None:
    """A :class:`Site` for an ``mpi`` equation bound now (while a program is lowered):
    the innermost equation being evaluated and the innermost jitted function."""
    if what is None or isinstance(what, Site):
        return what
    from spmd.compiler.ir import _Namer, pp_eqn
    from spmd.compiler.jit import JitFunction
    from spmd.compiler.trace import eval_program, user_source_info

    eqn, program = None, ""
    f = sys._getframe(1)
    while f is not None and not (eqn is not None and program):
        if eqn is None and f.f_code is eval_program.__code__:
            eqn = f.f_locals.get("eqn")
        if not program and isinstance(f.f_locals.get("self"), JitFunction):
            program = f"jit({f.f_locals['self']._name})"
        f = f.f_back
    if not program:
        where = user_source_info()
        program = "an eager shard_map" + (f" at {where}" if where is not None else "")
    equation = source = ""
    if eqn is not None:
        equation = pp_eqn(eqn, _Namer(), indent=0).strip()
        if len(equation) > 160:
            equation = equation[:157] + "..."
        if eqn.source_info is not None:
            source = str(eqn.source_info)
    return Site(what, program, equation, source)


# ------------------------------------------------------------ one collective

_seq: dict = {}        # ranks -> data collectives issued on that group so far
_busy: dict = {}       # ranks -> the thread last inside a collective over them
_locks: dict = {}
_broken: dict = {}     # key -> why that communicator can no longer be used
_waiting: dict = {}    # thread id -> the Collective it is waiting in (slow path)
_abandoned: list = []  # requests (and their buffers) left pending by a deadline
_sends: list = []      # answers still being sent
_exit_abort: list = []
_registry_lock = threading.Lock()


_MAIN = threading.main_thread().ident


class Collective:
    """One collective over world ``ranks``: ``with Collective(ranks, what) as c:`` then
    ``c.wait(request, keep=buffers)`` for each non-blocking MPI request it makes
    (``c.limit is None``: no deadline, make blocking calls instead).

    The collectives of one group of ranks run one at a time in a process (a lock per
    group).  One issued from a thread other than the main thread is first checked with
    the other ranks (over the control communicator): all must issue it from a thread of
    the same name at the same equation, or all raise :class:`CollectiveThreadError`."""

    __slots__ = ("ranks", "what", "control", "seq", "limit", "since", "lock")

    def __init__(self, ranks: tuple, what, control_traffic: bool = False):
        self.ranks, self.what, self.control = ranks, what, control_traffic
        self.limit = timeout_s()

    def __enter__(self):
        ranks = self.ranks
        why = _broken.get(ranks)
        if why is not None:
            raise why[0](why[1])
        lock = _locks.get(ranks)
        if lock is None:
            with _registry_lock:
                lock = _locks.setdefault(ranks, threading.Lock())
        if not lock.acquire(blocking=False):
            self._wait_for(lock)
        self.lock = lock
        self.seq = 0
        try:
            if not self.control:
                self.seq = _seq[ranks] = _seq.get(ranks, 0) + 1
                if self.what.__class__ is Site:
                    self.what.calls += 1
                if threading.get_ident() != _MAIN:
                    _check_threads(self)
        except BaseException:
            lock.release()
            raise
        _busy[ranks] = threading.current_thread()
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False

    def _wait_for(self, lock) -> None:
        """Another thread of this process is in a collective over these ranks: wait for
        it (within the deadline)."""
        other = _busy.get(self.ranks)
        if lock.acquire(timeout=-1 if self.limit is None else self.limit):
            return
        raise CollectiveTimeoutError(
            f"rank {_me()}: thread {threading.current_thread().name!r} waited {self.limit:g}s "
            f"to issue {self.what or 'a collective'} over ranks {list(self.ranks)} while thread "
            f"{getattr(other, 'name', '?')!r} was in a collective over the same ranks "
            f"({_setting()})")

    # ---------------------------------------------------------- waiting
    def wait(self, *reqs, keep=()):
        """Wait for ``reqs``; raise CollectiveTimeoutError at the deadline."""
        from mpi4py import MPI

        test = reqs[0].Test if len(reqs) == 1 else (lambda: MPI.Request.Testall(list(reqs)))
        if test():
            return
        start = time.monotonic()
        spin_until = start + SPIN_S
        while time.monotonic() < spin_until:
            if test():
                return
        self._slow(test, start, reqs, keep)

    def _slow(self, test, start, reqs, keep):
        me = threading.get_ident()
        self.since = time.time() - (time.monotonic() - start)
        deadline = None if self.limit is None else start + self.limit
        publish_after = PUBLISH_AFTER_S if self.limit is None else min(PUBLISH_AFTER_S,
                                                                       self.limit / 2)
        sleep, published, next_serve = 0.00005, False, start + publish_after
        try:
            while not test():
                now = time.monotonic()
                if now >= next_serve:
                    if not published:
                        _waiting[me] = self
                        _publish(self)
                        published = True
                    serve()
                    next_serve = now + SERVE_EVERY_S
                if deadline is not None and now >= deadline:
                    self._expire(test, reqs, keep)
                    return
                time.sleep(sleep)
                sleep = min(2 * sleep, MAX_SLEEP_S)
        finally:
            if published:
                _waiting.pop(me, None)
                _unpublish()

    def state(self) -> dict:
        w = self.what
        return {"ranks": list(self.ranks), "seq": self.seq, "what": str(w or "a collective"),
                "where": w.describe() if isinstance(w, Site) else "",
                "call": getattr(w, "calls", 0), "since": self.since}

    def _expire(self, test, reqs, keep):
        answers = _ask(self, test)
        if answers is None:  # the collective completed while the others were asked
            return
        text = _report(self, answers)
        _abandoned.append((reqs, keep))  # MPI may still write into the buffers
        _broken[self.ranks] = (CollectiveTimeoutError, "this communicator is unusable after an "
                             "earlier collective deadline:\n" + text)
        if not _exit_abort:
            _exit_abort.append(True)
            atexit.register(_abort_job)
        raise CollectiveTimeoutError(text)


def _check_threads(c: Collective) -> None:
    """Before a collective from a non-main thread: check that every rank issues it
    from a thread of the same name at the same equation.  MPI pairs collectives by
    their order, which threads make differ from rank to rank; unchecked, a thread
    could receive another thread's data."""
    import hashlib

    import numpy as np

    from spmd.collectives.mpi import _bytes, _recv_buffer

    w = c.what
    desc = (f"thread {threading.current_thread().name!r} issues {w or 'a collective'}"
            + (f" in {w.describe()}" if isinstance(w, Site) else ""))
    digest = np.frombuffer(hashlib.blake2b(desc.encode(), digest_size=16).digest(), np.uint8)
    comm = control(c.ranks)
    src = _bytes(digest)
    rows = _recv_buffer((len(c.ranks), 16), np.uint8)
    if c.limit is None:
        comm.Allgather(src, rows)
    else:
        c.wait(comm.Iallgather(src, rows), keep=(src, rows))
    if all((r == rows[0]).all() for r in rows):
        return
    texts = comm.allgather(desc)  # every rank is here: the digests were exchanged
    detail = "\n".join(f"  rank {r}: {t}" for r, t in zip(c.ranks, texts))
    raise CollectiveThreadError(
        f"collectives over ranks {list(c.ranks)} were issued from different threads on "
        f"different ranks, so they would pair one thread's data with another's:\n{detail}\n"
        "Issue a mesh's collectives from threads that run the same collectives in the same "
        "order on every rank (same thread names), or from one thread (e.g. the main thread)")


# ------------------------------------------------------------ answers

def _state_of_rank(query_ranks) -> dict:
    waits = [c.state() for c in list(_waiting.values())]
    return {"rank": _me(), "waits": waits, "seq": _seq.get(tuple(query_ranks), 0)}


def serve() -> None:
    """Answer the other ranks' questions about where this rank is (control traffic)."""
    from mpi4py import MPI

    status = MPI.Status()
    for comm in list(_controls.values()):
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_QUERY, status=status):
            src = status.Get_source()
            q = comm.recv(source=src, tag=TAG_QUERY)
            reply = dict(_state_of_rank(q["ranks"]), id=q["id"])
            _sends.append(comm.isend(reply, dest=src, tag=TAG_STATE))
    _sends[:] = [r for r in _sends if not r.Test()]


_query_ids = [0]


def _ask(c: Collective, test) -> dict | None:
    """Ask every other member of ``c``'s group where it is; world rank -> answer for
    those answering within the grace period.  None when ``c`` completed meanwhile."""
    from mpi4py import MPI

    comm = control(c.ranks)
    mine = comm.Get_rank()
    _query_ids[0] += 1
    qid = (_me(), _query_ids[0])
    for i in range(len(c.ranks)):
        if i != mine:
            _sends.append(comm.isend({"ranks": list(c.ranks), "id": qid}, dest=i,
                                     tag=TAG_QUERY))
    answers: dict = {}
    status = MPI.Status()
    end = time.monotonic() + grace_s(c.limit)
    while time.monotonic() < end and len(answers) < len(c.ranks) - 1:
        if test():
            return None
        serve()
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_STATE, status=status):
            reply = comm.recv(source=status.Get_source(), tag=TAG_STATE)
            if reply.get("id") == qid:
                answers[c.ranks[status.Get_source()]] = reply
        time.sleep(0.005)
    return answers


def _report(c: Collective, answers: dict) -> str:
    waited = time.time() - c.since
    what = str(c.what or "a collective")
    head = (f"rank {_me()}: {what} over ranks {list(c.ranks)} did not complete within "
            f"{c.limit:g}s ({_setting()})")
    lines = [head]
    if isinstance(c.what, Site):
        lines.append(f"  rank {_me()} is in {c.what.describe()}, call {c.what.calls} of it"
                     + (f"; collective #{c.seq} over these ranks" if c.seq else ""))
    arrived, missing = [], []
    for r in c.ranks:
        if r == _me():
            continue
        a = answers.get(r)
        same = a is not None and any(w["ranks"] == list(c.ranks) and w["seq"] == c.seq
                                     for w in a["waits"])
        (arrived if same else missing).append(r)
        if a is None:
            lines.append(f"  rank {r}: never arrived; no answer within {grace_s(c.limit):g}s "
                         "(it computes outside collectives, finished, or died)")
        elif not same:
            where = "; ".join(_where(w) for w in a["waits"]) or "is in no collective"
            lines.append(f"  rank {r}: never arrived (its last collective over these ranks "
                         f"was #{a['seq']}); it {where}")
    lines.insert(1, f"  ranks that never arrived: {missing}; ranks waiting in it too: "
                    f"{arrived} (this rank waited {waited:.1f}s)")
    return "\n".join(lines)


def _where(w: dict) -> str:
    """One wait of another rank, as its answer describes it."""
    detail = [f"collective #{w['seq']} there"] if w["seq"] else []
    if w["where"]:
        detail.append(f"{w['where']}, call {w['call']}")
    return (f"waits in {w['what']} over ranks {w['ranks']}"
            + (f" ({'; '.join(detail)})" if detail else ""))


def _abort_job() -> None:
    """At exit after a deadline: end the MPI job instead of finalising (MPI_Finalize
    would wait for ranks that wait for this one)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    from spmd.collectives.mpi import world

    world().Abort(1)


# ------------------------------------------------------ the launcher's view

def _publish(c: Collective) -> None:
    from spmd.launch import _rank

    _rank.publish_wait(dict(c.state(), rank=_me()))


def _unpublish() -> None:
    if not _waiting:
        from spmd.launch import _rank

        _rank.clear_wait(_me())
