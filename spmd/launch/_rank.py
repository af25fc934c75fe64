"""The per-rank wrapper that ``spmd-run`` starts under ``mpiexec``.

    mpiexec -n 4 python -m spmd.launch._rank script.py args...
    mpiexec -n 4 python -m spmd.launch._rank -m package.module args...

runs the target as ``python script.py args...`` (or ``python -m``) would, with
what a launcher needs on top:

- An uncaught exception prints its traceback to stderr and ends the rank at
  once with status 1 (``os._exit``, after flushing stdout/stderr).  A normal
  interpreter exit would call ``MPI_Finalize``, which waits for the other
  ranks, while they wait in a collective for this one: the job would hang.
  Exiting without finalising makes ``mpiexec`` end the whole job.  A
  non-zero ``sys.exit(code)`` ends the rank the same way with ``code``;
  ``sys.exit(0)`` and returning normally finalise as usual.  (So the script's
  ``atexit`` handlers do not run when it fails.)
- When ``$SPMD_LAUNCH_DIR`` names a directory (``spmd-run`` makes one per
  job), the rank writes there: ``rank<N>.pid`` when it starts,
  ``rank<N>.json`` (exit status, kind, error text) when the script ends, a
  fatal-signal dump (segfault...) in ``rank<N>.fault`` and, when sent
  ``SIGUSR1``, its Python stacks in ``rank<N>.stack`` (``spmd-run --timeout``
  uses them to say where hung ranks were).  ``spmd-run`` reads them to
  summarise a failure.  ``rank<N>.shm`` lists the shared-memory files
  (``/dev/shm``) the rank maps, written when MPI starts, when it finishes, fails
  or has waited in a collective for a while: one of the ways the launcher knows which
  segments are this job's, to remove them after an abnormal end
  (:mod:`spmd.launch.cleanup`).
- When ``$SPMD_TRACE_DIR`` names a directory (``spmd-run --trace``), the rank
  records its timeline into ``rank-<k>.jsonl`` there
  (:mod:`spmd.launch.timeline.recorder`): before the target, every rank starts
  its recording and the ranks align their clocks (:mod:`spmd.launch.timeline.clock`,
  collective over them all); at every end -- normal, an uncaught exception, a
  non-zero ``sys.exit`` -- what was recorded is flushed to the file.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback

from spmd.errors import ArgumentError
from spmd.launch import affinity
from spmd.launch import alive, cleanup
from spmd.launch.mpi_init import world
from spmd.launch.timeline import clock, recorder

# Launchers set one of these in every rank (MPICH/Hydra, PMIx, Open MPI,
# MVAPICH, Slurm), first match wins.
_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
              "SLURM_PROCID")

# Exit status of a rank ended by Ctrl-C (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130

# Set by spmd-run --trace (spmd.launch.timeline.launcher): where the ranks record their
# timelines; the events each keeps at most; tests: rank k's clock set k times this ahead.
TRACE_DIR_ENV, TRACE_EVENTS_ENV, TRACE_SKEW_ENV = \
    "SPMD_TRACE_DIR", "SPMD_TRACE_EVENTS", "SPMD_TRACE_TEST_SKEW"

USAGE = "usage: python -m spmd.launch._rank (script.py | -m module) [args...]"


def rank_from_env(environ=os.environ) -> int | None:
    """This process's rank as the launcher announced it, or None when not launched."""
    for name in _RANK_VARS:
        val = environ.get(name, "")
        if val.isdigit():
            return int(val)
    return None


class _Reporter:
    """Writes this rank's files into ``$SPMD_LAUNCH_DIR`` (a no-op without it)."""

    def __init__(self, directory: str | None, rank: int):
        self.dir = directory if directory and os.path.isdir(directory) else None
        self.rank = rank
        self._keep = []  # files faulthandler writes to must stay open

    def path(self, suffix: str) -> str:
        return os.path.join(self.dir, f"rank{self.rank}.{suffix}")

    def start(self) -> None:
        if self.dir is None:
            faulthandler.enable(sys.stderr, all_threads=True)
            return
        fault = open(self.path("fault"), "w")
        stack = open(self.path("stack"), "w")
        self._keep += [fault, stack]
        faulthandler.enable(fault, all_threads=True)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True, chain=False)
        # The write end of the launcher's FIFO for this rank, held until the process
        # ends: the kernel closes it the moment the rank dies, before mpiexec can
        # end the others, so the launcher learns which rank went first
        # (spmd.launch.job.Job._watch_exits).  None on another host or without it.
        try:
            self._keep.append(os.open(self.path("alive"), os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        # Across hosts, a connection to the launcher does the FIFO's work
        # (spmd.launch.alive); the job's token is its launch directory's name.

        conn = alive.connect(self.rank, os.path.basename(self.dir))
        if conn is not None:
            self._keep.append(conn)
        # Written last: a pid file means the handlers above are in place.  The host
        # names the rank in reports; what /dev/shm holds before this rank starts MPI
        # tells the cleanup of its node what was there before the job
        # (spmd.launch.cleanup.clean_node).

        before = {p: list(k) for p, k in cleanup.listing().items()}
        self._write("pid", json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                       "shm": before}))

    def finish(self, status: int, kind: str, error: str = "") -> None:
        if self.dir is None:
            return
        self.record_segments()
        if hasattr(signal, "SIGUSR1"):
            # The stack dump is for ranks still in the script; after it (in
            # MPI_Finalize, where faulthandler is gone) the signal must not kill.
            faulthandler.unregister(signal.SIGUSR1)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        self._write("json", json.dumps({"rank": self.rank, "status": status, "kind": kind,
                                        "error": error, "time": time.time()}))

    def record_segments(self) -> None:
        """Add the shared-memory files this process maps now to ``rank<N>.shm``
        (files mapped earlier and since unmapped stay listed)."""

        try:
            found = cleanup.mapped_files("self")
        except Exception:  # noqa: BLE001 - a record is never worth failing the rank
            return
        if not found:
            return
        rec = _read_json(self.path("shm"))
        files = rec.get("files", {}) if isinstance(rec, dict) else {}
        if all(files.get(p) == list(k) for p, k in found.items()):
            return
        # path -> [st_dev, st_ino] (spmd.launch.cleanup.Segments.add_records)
        files.update({p: list(k) for p, k in found.items()})
        self._write("shm", json.dumps({"rank": self.rank, "host": socket.gethostname(),
                                       "files": files}))

    def _write(self, suffix: str, text: str) -> None:
        # Write then rename, so the launcher never reads half a file.
        final = self.path(suffix)
        tmp = final + ".tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, final)
        except OSError as e:  # a full or vanished directory must not hide the real error
            sys.stderr.write(f"spmd-run: rank {self.rank}: cannot write {final}: {e}\n")


# Published by a rank's collectives (``spmd.collectives.mpi.control``): where it
# has been waiting for a while, so that the launcher can tell when a rank that
# finished leaves others waiting for it.

def _launched(rank: int | None) -> _Reporter | None:
    """The reporter of ``rank`` into ``$SPMD_LAUNCH_DIR``, None without the directory."""
    rep = _Reporter(os.environ.get("SPMD_LAUNCH_DIR"), 0 if rank is None else rank)
    return rep if rep.dir is not None and rank is not None else None


def publish_wait(info: dict) -> None:
    """Record in ``$SPMD_LAUNCH_DIR/rank<N>.wait`` that this rank waits in a collective
    (``info``: rank, ranks, what, where, seq, since); a no-op without the directory."""
    rep = _launched(int(info["rank"]))
    if rep is not None:
        rep._write("wait", json.dumps(info))
        # A rank waiting this long may never finish (the job may be ended): record
        # its segments now, those made since it started included.
        rep.record_segments()


def note_segments() -> None:
    """Record in ``$SPMD_LAUNCH_DIR/rank<N>.shm`` the shared-memory files this process
    maps now (called when MPI has just started: its node's segment exists from then
    on); a no-op without the directory.  A rank killed a moment later, before the
    launcher's next look at its mappings, still has its segment removed."""
    rep = _launched(rank_from_env())
    if rep is not None:
        rep.record_segments()


def record_failure(rank: int, status: int, kind: str, error: str) -> None:
    """Record this rank's result from outside the script's thread (a collective deadline
    found by the watchdog, just before it aborts the job); a no-op without
    ``$SPMD_LAUNCH_DIR``."""
    rep = _launched(rank)
    if rep is not None:
        rep.record_segments()  # before: the job is about to be aborted
        rep._write("json", json.dumps(
            {"rank": rank, "status": status, "kind": kind, "error": error, "time": time.time()}))


def clear_wait(rank: int) -> None:
    """The rank's collective wait is over: remove its ``.wait`` record."""
    directory = os.environ.get("SPMD_LAUNCH_DIR")
    if directory:
        try:
            os.remove(os.path.join(directory, f"rank{rank}.wait"))
        except OSError:
            pass


def read_waits(directory: str) -> dict[int, dict]:
    """Rank -> the collective it has been waiting in (see :func:`publish_wait`)."""
    out = {}
    for name in os.listdir(directory):
        if name.startswith("rank") and name.endswith(".wait"):
            rep = _read_json(os.path.join(directory, name))
            if isinstance(rep, dict) and isinstance(rep.get("rank"), int):
                out[rep["rank"]] = rep
    return out


# The launcher's side of these files (``spmd-run`` reads them).

def read_reports(directory: str) -> dict[int, dict]:
    """Rank -> the result its wrapper recorded (ranks still running have none)."""
    out = {}
    for name in os.listdir(directory):
        if name.startswith("rank") and name.endswith(".json"):
            rep = _read_json(os.path.join(directory, name))
            if isinstance(rep, dict) and isinstance(rep.get("rank"), int):
                out[rep["rank"]] = rep
    return out


def read_pid_file(directory: str, rank: int) -> dict | None:
    """``{"pid", "host"}`` of a rank that has started, else None."""
    info = _read_json(os.path.join(directory, f"rank{rank}.pid"))
    return info if isinstance(info, dict) else None


def read_text(directory: str, rank: int, suffix: str) -> str:
    """A rank's ``fault`` or ``stack`` dump ("" when there is none)."""
    try:
        with open(os.path.join(directory, f"rank{rank}.{suffix}"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _user_traceback(exc: BaseException) -> str:
    """The traceback without this wrapper's and runpy's frames."""
    tb = exc.__traceback__
    skip = (os.path.abspath(__file__), runpy.__file__)
    while tb is not None and (tb.tb_frame.f_code.co_filename in skip
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _exit_code(code) -> tuple[int, str]:
    """(status, message) of ``sys.exit(code)``, as the interpreter maps them."""
    if code is None:
        return 0, ""
    if isinstance(code, bool) or not isinstance(code, int):
        return 1, str(code)  # Python prints a non-integer code and exits 1
    return code & 0xFF, ""


def _die(status: int) -> None:
    """End this rank now, without MPI_Finalize (see the module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _line_buffered() -> None:
    # With PYTHONUNBUFFERED each piece of a print() is its own write, and the
    # launcher's rank prefix lands mid-line between ranks; whole lines keep the
    # output readable.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError):
            pass


def _parse(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(script, module, args) from ``script args...`` or ``-m module args...``."""
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE + "\n")
        raise SystemExit(2)
    if argv[0] == "-m":
        if len(argv) < 2:
            sys.stderr.write(USAGE + "\n")
            raise SystemExit(2)
        return None, argv[1], argv[2:]
    return argv[0], None, argv[1:]


def trace_settings(environ=None) -> tuple[int | None, float]:
    """``(capacity, skew)`` of a rank's recording: ``$SPMD_TRACE_EVENTS``, the events it
    keeps at most (None: the recorder's default), and ``$SPMD_TRACE_TEST_SKEW``, the
    seconds per rank its clock is set ahead (tests of the alignment; 0: none).
    :class:`~spmd.errors.ArgumentError` naming the variable when one is malformed.

    >>> trace_settings({"SPMD_TRACE_EVENTS": "5000", "SPMD_TRACE_TEST_SKEW": "0.3"})
    (5000, 0.3)
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(TRACE_EVENTS_ENV, "").strip()
    capacity = None
    if raw:
        capacity = int(raw) if raw.isdigit() else 0
        if capacity < 1:
            raise ArgumentError(f"{TRACE_EVENTS_ENV}={raw!r} is not a positive integer; set "
                                "it to the events each rank keeps at most (e.g. 1000000), or "
                                "unset it for the default")
    raw = environ.get(TRACE_SKEW_ENV, "").strip()
    try:
        skew = float(raw) if raw else 0.0
    except ValueError:
        raise ArgumentError(f"{TRACE_SKEW_ENV}={raw!r} is not a number of seconds; unset it "
                            "(it is for tests of the clock alignment) or set e.g. "
                            "0.3") from None
    return capacity, skew


def _start_timeline() -> None:
    """With ``$SPMD_TRACE_DIR`` set: start recording this rank's timeline into that
    directory and align the ranks' clocks (collective over every rank: each runs
    this wrapper).  MPI starts here then, before the target."""
    directory = os.environ.get(TRACE_DIR_ENV)
    if not directory:
        return
    capacity, skew = trace_settings()
    rank = world().Get_rank()
    recorder.start(rank=rank, host=socket.gethostname(), capacity=capacity,
                   spool=os.path.join(directory, f"rank-{rank}.jsonl"), skew=skew * rank)
    comm = world().Dup()  # (its own communicator: no message of the target pairs with it)
    try:
        clock.align(comm)
    finally:
        comm.Free()
    recorder.flush()  # (the rank's facts on file at once: a rank killed early is named)


def _run_target(script: str | None, module: str | None, args: list[str]) -> None:
    if module is not None:
        # As `python -m module`: argv[0] becomes the module's file, the
        # current directory stays first on sys.path.
        sys.argv = [module] + args
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        # As `python script.py`: the script's directory replaces ours on sys.path.
        sys.argv = [script] + args
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    """Run the target; return 0 on success (failures end the process directly)."""
    script, module, args = _parse(sys.argv[1:] if argv is None else argv)
    rank = rank_from_env()
    directory = os.environ.get("SPMD_LAUNCH_DIR")
    report = _Reporter(directory, 0 if rank is None else rank)
    if directory and report.dir is None:
        # A rank on another host than spmd-run's: the directory is not shared.
        sys.stderr.write(
            f"spmd-run: rank {report.rank} on {socket.gethostname()}: the launch directory "
            f"{directory} does not exist on this host, so spmd-run cannot read this rank's "
            "result or clean up after it; give --launch-dir a directory that every host "
            "mounts at the same path\n")
    report.start()
    _line_buffered()
    try:
        affinity.bind_from_env()  # before the target starts its threads, which inherit it
        _start_timeline()
        _run_target(script, module, args)
    except SystemExit as e:
        recorder.flush()  # (this rank's timeline to its file; no-op untraced)
        status, message = _exit_code(e.code)
        if message:
            sys.stderr.write(message + "\n")
        report.finish(status, "exit", message)
        if status != 0:
            _die(status)
        return 0
    except KeyboardInterrupt:
        recorder.flush()
        report.finish(INTERRUPTED, "interrupt", "KeyboardInterrupt")
        _die(INTERRUPTED)
    except BaseException as e:  # noqa: BLE001 - every failure must end the rank
        recorder.flush()
        text = _user_traceback(e)
        sys.stderr.write(text)
        report.finish(1, "exception", text)
        _die(1)
    recorder.flush()
    report.finish(0, "ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
