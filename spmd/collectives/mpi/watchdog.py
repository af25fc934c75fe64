"""The watchdog of the ``mpi`` backend's collectives: deadline reports and answers.

A daemon thread, started with the process's first collective, wakes every
:data:`TICK_S` seconds.  Collectives stay blocking MPI calls (MPI releases the
GIL while it waits), so this thread can, meanwhile:

- answer the other ranks' questions about where this rank is (over the control
  communicators, :mod:`spmd.collectives.mpi.control`): in which collective, at
  which program, equation and call, or, when in none, which Python line runs;
- publish a collective that has waited :data:`PUBLISH_AFTER_S` seconds into
  ``$SPMD_LAUNCH_DIR`` (``spmd-run`` ends the job when ranks that finished leave
  others waiting, see :mod:`spmd.launch.job`);
- when a collective has waited past the deadline (``SPMD_COLLECTIVE_TIMEOUT``,
  default 600 s): ask the other members of its group where they are, wait
  :func:`grace_s` seconds for their answers, print and record a
  ``CollectiveTimeoutError`` report (this rank's program, equation and call, its
  Python stack, which ranks never arrived and where those are), and end the MPI
  job with ``MPI_Abort`` (a blocked MPI call cannot be interrupted, and the
  other ranks wait on this one).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback

from spmd.collectives.mpi import control as ctl
from spmd.launch import _rank
from spmd.launch.mpi_init import threads_may_call_mpi, world
from spmd.launch.timeline import recorder as timeline

TICK_S = 0.1
PUBLISH_AFTER_S = 1.0
TAG_QUERY, TAG_STATE = 0x5D01, 0x5D02
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_sends: list = []        # answers and questions still being sent
_published: list = [None]
_query_ids = [0]
_complained: set = set()


def _world():
    return world()


def grace_s(limit: float) -> float:
    """How long a rank whose deadline fired waits for the others' answers."""
    return min(10.0, max(1.0, 0.05 * limit))


_threads_ok = [True]


def start() -> None:
    """Start the watchdog thread (once per process: mpi_control does it)."""
    # What the ticks use is imported at the top, by the thread that loads this module
    # (spmd.launch._rank too, which the reports read): a first-time import
    # in the watchdog thread would load a module at a moment of its own, in the middle
    # of whatever the program then does (and of its memory measurements).
    # Its questions and answers are MPI calls from a second thread: they need
    # MPI_THREAD_MULTIPLE (mpi4py's default); without it the deadline still
    # reports, without the others' answers.
    _threads_ok[0] = threads_may_call_mpi()
    # Registered after mpi4py's own exit handler, so it runs first: no tick may
    # call MPI once MPI_Finalize has begun.
    atexit.register(_stop)
    threading.Thread(target=_run, name="spmd-collective-watchdog", daemon=True).start()


ABORT_GRACE_S = 0.5  # see _expire

_tick_lock = threading.Lock()
_stopped = [False]


def _stop() -> None:
    with _tick_lock:  # waits for a tick in progress
        _stopped[0] = True


def _run() -> None:
    from mpi4py import MPI

    while True:
        time.sleep(TICK_S)
        try:
            with _tick_lock:
                if _stopped[0] or MPI.Is_finalized():
                    return
                _tick()
        except Exception as e:  # noqa: BLE001 - the watchdog must outlive a bad tick
            kind = type(e).__name__
            if kind not in _complained:  # say it once, keep watching
                _complained.add(kind)
                sys.stderr.write(f"[spmd] rank {ctl._me()}: collective watchdog: {kind}: {e}\n")


def _tick() -> None:
    serve()
    limit = ctl.timeout_s()
    now = time.monotonic()
    waiting = sorted(ctl.inflight.values(), key=lambda c: c.since)
    after = PUBLISH_AFTER_S if limit is None else min(PUBLISH_AFTER_S, limit / 2)
    old = [c for c in waiting if now - c.since >= after]
    _publish(old[0] if old else None)
    if limit is not None:
        for c in old:
            if now - c.since >= limit:
                _expire(c, limit)


# ------------------------------------------------------------ answering

def _python_location() -> str:
    """Where the main thread runs Python: its innermost frame outside spmd."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_filename.startswith(_PKG_DIR):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _state_of_rank(query_ranks) -> dict:
    return {"rank": ctl._me(), "waits": [c.state() for c in list(ctl.inflight.values())],
            "seq": ctl._seq.get(tuple(query_ranks), 0), "python": _python_location()}


def serve() -> None:
    """Answer the other ranks' questions about where this rank is (control traffic)."""
    from mpi4py import MPI

    if not _threads_ok[0]:
        return
    status = MPI.Status()
    # The world communicator's point-to-point traffic too: a rank whose deadline fires
    # while a communicator is being made has no control communicator to ask over yet.
    for comm in [_world()] + list(ctl._controls.values()):
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_QUERY, status=status):
            src = status.Get_source()
            q = comm.recv(source=src, tag=TAG_QUERY)
            reply = dict(_state_of_rank(q["ranks"]), id=q["id"])
            _sends.append(comm.isend(reply, dest=src, tag=TAG_STATE))
    _sends[:] = [r for r in _sends if not r.Test()]


# ------------------------------------------------------------ the deadline

def _ask(c, limit: float) -> dict | None:
    """Ask every other member of ``c``'s group where it is; world rank -> answer of
    those answering within the grace period.  None when ``c`` completed meanwhile."""
    from mpi4py import MPI

    if not _threads_ok[0]:
        return {}
    comm = ctl._controls.get(c.ranks)
    if comm is None:  # still being made (c sets it up): ask over the world's point-to-point
        comm, index = _world(), {r: r for r in c.ranks}
    else:
        index = {r: i for i, r in enumerate(c.ranks)}
    member = {i: r for r, i in index.items()}
    me = ctl._me()
    _query_ids[0] += 1
    qid = (me, _query_ids[0])
    for r in c.ranks:
        if r != me:
            _sends.append(comm.isend({"ranks": list(c.ranks), "id": qid}, dest=index[r],
                                     tag=TAG_QUERY))
    answers: dict = {}
    status = MPI.Status()
    end = time.monotonic() + grace_s(limit)
    while time.monotonic() < end and len(answers) < len(c.ranks) - 1:
        if ctl.inflight.get(c.thread) is not c:
            return None
        serve()
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_STATE, status=status):
            reply = comm.recv(source=status.Get_source(), tag=TAG_STATE)
            if reply.get("id") == qid and status.Get_source() in member:
                answers[member[status.Get_source()]] = reply
        time.sleep(0.01)
    return answers


def report(c, limit: float, answers: dict) -> str:
    """The deadline report of collective ``c`` given the other ranks' ``answers``."""
    me = ctl._me()
    # (ctl.who names each rank's host when the job spans several hosts.)
    lines = [f"{ctl.who(me)}: {c.what or 'a collective'} over ranks {list(c.ranks)} did not "
             f"complete within {limit:g}s ({ctl._setting()})"]
    w = c.what
    if isinstance(w, ctl.Site) and not (w.program or w.equation) and w.phase:
        lines.append(f"  {ctl.who(me)} is {w.phase} (no data has moved yet)")
    elif isinstance(w, ctl.Site) and w.describe():
        lines.append(f"  {ctl.who(me)} is in {w.describe()}"
                     + (f", call {w.calls} of it" if w.calls else "")
                     + (f"; collective #{c.seq} over these ranks" if c.seq else ""))
    arrived, missing = [], []
    for r in c.ranks:
        if r == me:
            continue
        a = answers.get(r)
        same = a is not None and any(w["ranks"] == list(c.ranks) and w["seq"] == c.seq
                                     for w in a["waits"])
        (arrived if same else missing).append(r)
        if a is None:
            lines.append(f"  {ctl.who(r)}: never arrived; no answer within {grace_s(limit):g}s "
                         "(it finished, died, runs code that holds the GIL, or has not "
                         "reached its first collective)")
        elif not same:
            where = "; ".join(_where(w) for w in a["waits"]) or \
                f"is in no collective; it runs Python at {a['python']}"
            lines.append(f"  {ctl.who(r)}: never arrived (its last collective over these ranks "
                         f"was #{a['seq']}); it {where}")
    waited = time.monotonic() - c.since
    lines.insert(1, f"  ranks that never arrived: {missing}{ctl.on_hosts(missing)}; "
                    f"ranks waiting in it too: "
                    f"{arrived} (this rank waited {waited:.1f}s)")
    return "\n".join(lines)


def _where(w: dict) -> str:
    """One wait of another rank, as its answer describes it."""
    detail = [f"collective #{w['seq']} there"] if w["seq"] else []
    if w["where"]:
        detail.append(f"{w['where']}, call {w['call']}")
    return (f"waits in {w['what']} over ranks {w['ranks']}"
            + (f" ({'; '.join(detail)})" if detail else ""))


def _stack(thread_id: int, user_only: bool = False) -> str:
    """The thread's Python stack, less the launcher's frames (spmd-run's wrapper);
    ``user_only``: only the frames outside the spmd package."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return ""
    frames = [f for f in traceback.extract_stack(frame)
              if "runpy" not in f.filename and not f.filename.endswith("launch/_rank.py")
              and not (user_only and f.filename.startswith(_PKG_DIR))]
    return "".join(traceback.format_list(frames))


def _expire(c, limit: float) -> None:
    """The deadline of ``c`` passed: ask, report, record, and end the job."""
    answers = _ask(c, limit)
    if answers is None:  # it completed while the others were asked
        return
    name = ctl._thread_name(c.thread)
    error = (f"spmd.collectives.mpi.control.CollectiveTimeoutError: {report(c, limit, answers)}\n"
             f"  where thread {name!r} waits (its frames outside spmd, most recent call last):\n"
             f"{_stack(c.thread, user_only=True)}")
    sys.stderr.write(f"Traceback of thread {name!r} (most recent call last):\n"
                     f"{_stack(c.thread)}{error}")
    _rank.record_failure(ctl._me(), 1, "deadline", error)
    timeline.flush()  # (the abort ends every rank at once: what this one recorded, kept)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # The launcher forwards each rank's output asynchronously, and MPI_Abort tears
    # the job down at once: without a moment's grace the report can be lost (seen
    # once on a loaded machine, where the job ended with no report).
    time.sleep(ABORT_GRACE_S)
    world().Abort(1)


# ------------------------------------------------------ the launcher's view

def _publish(c) -> None:
    """Keep ``$SPMD_LAUNCH_DIR/rank<N>.wait`` saying which collective this rank has been
    waiting in for a while (none: removed)."""
    key = None if c is None else (c.thread, c.seq, c.since)
    if key == _published[0]:
        return
    _published[0] = key
    if c is None:
        _rank.clear_wait(ctl._me())
    else:
        _rank.publish_wait(dict(c.state(), rank=ctl._me()))
