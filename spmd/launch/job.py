"""One ``mpiexec`` run as ``spmd-run`` watches it (:class:`Job`).

Besides mpiexec's exit, the launcher watches the files the ranks write into the
job's launch directory (``spmd.launch._rank``): their results, and the
collectives they have been waiting in for a while.  A rank that finished while
others wait in a collective that needs it is reported at once (they would wait
until the collective deadline).  mpiexec's stdout passes through the launcher,
which reads MPICH's report of a rank killed by a signal from it.  While the
ranks run, the launcher also notes the shared-memory segments they map, and
removes those left behind once the job has ended (:meth:`Job.cleanup`,
:mod:`spmd.launch.cleanup`).
"""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from spmd.launch import _rank
from spmd.launch import alive
from spmd.launch.cleanup import Segments, entries, mapped_files

# How long a job may go on after a rank reported a failure before the
# launcher ends it itself (mpiexec normally does it at once).
FAILURE_GRACE_S = 5.0
# How long mpiexec gets to end its ranks after SIGTERM before SIGKILL.
TERM_GRACE_S = 3.0
# How long ranks must be seen waiting, in the same collectives, for ranks that
# finished before the job is ended (a wait that is just completing has not yet
# removed its record).
STRANDED_CONFIRM_S = 2.0
# Ranks whose processes closed their FIFO within this many seconds of the first
# are reported together as killed (see Job.killed).
EXIT_TIE_S = 0.05
# How often the launcher lists /dev/shm (a directory read: microseconds).  The
# ranks' mappings are read when a file has appeared there since the last read,
# when a rank starts or ends, and every SEGMENT_SCAN_S besides: a segment made
# and left within less than SEGMENT_CHECK_S by every rank of a node could be
# missed (the ranks' own records cover most such cases).
SEGMENT_CHECK_S = 0.1
# Reading a rank's /proc/<pid>/maps costs ~1.5 ms of CPU (600 mappings, and the
# rank's mmap lock); done every 0.1 s it took ~3 ms from one rank's core every
# 0.1 s, which a pipeline's ranks, waiting on each other, all paid.  Only a
# safety net now: a new file triggers the read.
SEGMENT_SCAN_S = 5.0
# How long the ranks' processes get to be gone after mpiexec has exited (they
# hold their segments until then) before the launcher kills them.
REAP_S = 2.0

# MPICH Hydra, run with -print-all-exitcodes: "[mpiexec@host] Exit codes: [host] 0,9,0"
# (one code per rank, hosts in rank order), then the first failure's exit string.
_EXIT_CODES = re.compile(rb"\] Exit codes: (.*)$")
_BOX_PID = re.compile(rb"^=\s+PID (\d+) RUNNING AT (\S+)")
_BOX_EXIT = re.compile(rb"^=\s+EXIT CODE: (\d+)")
_SIGNAL = re.compile(rb"(?:KILLED BY SIGNAL: (\d+)|EXIT STRING: .*\(signal (\d+)\))")


# Hydra's own diagnostics on stderr: "[mpiexec@vm] main (/path/mpiexec.c:270): ...".
_HYDRA_LINE = re.compile(rb"^\[(mpiexec|proxy:[^\]@]*)@[^\]]*\] ")
# The source location in them says nothing to a user.
_HYDRA_DETAIL = re.compile(r" \([^()]*\.c:\d+\)")
# Lines of them shown after the summary.
HYDRA_LINES = 4

# With ranks on several hosts, each host's codes come on a line of their own.
_MORE_CODES = re.compile(rb"^\[[^\]]*\] [0-9, ]+$")


def _codes(text: bytes) -> list[int]:
    """``[host] 0,9 [host2] 0`` -> ``[0, 9, 0]``."""
    codes = []
    for part in re.split(rb"\[[^\]]*\]", text):
        # (whitespace, the line's end included, removed first)
        codes += [int(c) for c in b"".join(part.split()).split(b",") if c.isdigit()]
    return codes


# The lines MPICH prints after its box (and the exit codes).
_BANNER_TAIL = (b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING",
                b"This typically refers to a problem with your application.",
                b"Please see the FAQ page for debugging suggestions")
# The rule above and below MPICH's box (a line of '=' only), and the most lines
# held as one box (MPICH's has 8).
BANNER_LINES = 12
_BANNER_RULE = re.compile(rb"^={20,}$")


def _parse_banner(line: bytes, into: dict) -> None:
    """Read what MPICH's Hydra says when a rank ends badly: every rank's exit code
    and the signal of the first failure."""
    m = _EXIT_CODES.search(line.rstrip())
    if m and "codes" not in into:
        into["codes"] = _codes(m.group(1))
    m = _SIGNAL.search(line)
    if m and "signal" not in into:
        into["signal"] = int(m.group(1) or m.group(2))
    # The box names the first process that ended badly, where, and its exit code
    # (a signal's number for a process killed by one).
    m = _BOX_PID.search(line)
    if m and "pid" not in into:
        into["pid"], into["host"] = int(m.group(1)), m.group(2).decode(errors="replace")
    m = _BOX_EXIT.search(line)
    if m and "exit" not in into:
        into["exit"] = int(m.group(1))


def _emit(stream, line: bytes) -> None:
    """Pass one line of mpiexec's output on to ``stream`` (its bytes where the stream
    has a buffer, else decoded), at once."""
    raw = getattr(stream, "buffer", None)
    if raw is not None:
        raw.write(line)
        raw.flush()
    else:
        stream.write(line.decode(errors="replace"))
        stream.flush()


class _Terminated(Exception):
    """The launcher itself received SIGTERM or SIGHUP."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Job:
    """One ``mpiexec`` run and the per-rank files its ranks write."""

    def __init__(self, cmd: list[str], env: dict[str, str], np: int, launch_dir: str,
                 rank_hosts: list[str] | None = None, alive_address: str | None = None):
        self.cmd, self.env, self.np, self.dir = cmd, env, np, launch_dir
        self.rank_hosts = rank_hosts  # where each rank was placed (None: all here)
        # Where the ranks connect to say they live (spmd.launch.alive; None: FIFOs).
        self.alive_address = alive_address
        self._conn_watch: tuple | None = None  # (alive.Watch, its thread)
        self.held: list[bytes] = []  # MPICH's banner, held back (see _copy_stdout)
        self.hydra: list[str] = []   # mpiexec's own stderr lines (see _copy_stderr)
        self.proc: subprocess.Popen | None = None
        self.ending = False          # set once the launcher itself ends the job
        self.banner: dict = {}       # what mpiexec said about a rank's abnormal end
        self._reader: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._stranded: tuple = (None, 0.0)
        self.segments: Segments | None = None

    def start(self) -> None:
        # Its own session: Ctrl-C reaches only the launcher, which then ends
        # the job in order, and the job's processes can be killed as a group.
        # Its stdout passes through us, to read what it says about killed ranks.
        # /dev/shm is listed first: what is there already is never the job's.
        self.segments = Segments()
        self.exits: list = []  # (time, rank) in the order their processes closed the FIFO
        self._alive = {} if self._open_connections() else self._open_fifos()
        self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True,
                                     preexec_fn=_die_with_parent, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._copy_stdout, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._copy_stderr, daemon=True)
        self._err_reader.start()
        if self._conn_watch is not None:
            self._conn_watch[1].start()
        if hasattr(os, "pidfd_open"):
            self._watcher = threading.Thread(target=self._watch_pids, daemon=True)
            self._watcher.start()
        if self._alive:
            threading.Thread(target=self._watch_exits, daemon=True).start()

    def _open_connections(self) -> bool:
        """Across hosts: listen for the ranks' connections (spmd.launch.alive), which
        tell the order in which they end; whether the channel is open."""

        if not self.alive_address:
            return False
        try:
            watch = alive.Watch(self.alive_address, os.path.basename(self.dir))
        except OSError:
            return False  # (not an address of this machine: no channel)
        self.env = dict(self.env, **{alive.ENV: watch.env_value()})

        def ended(rank):
            if not self.ending:  # (not the ranks the launcher itself ends)
                self.exits.append((time.monotonic(), rank))

        thread = threading.Thread(target=watch.run, daemon=True,
                                  args=(lambda: self.proc.poll() is None, ended))
        self._conn_watch = (watch, thread)
        return True

    def connected_at_end(self) -> list[int]:
        """The ranks whose connection to the launcher was still open a moment after
        mpiexec exited (their host's processes did not end: a machine gone)."""
        if self._conn_watch is None:
            return []

        self._conn_watch[1].join(timeout=alive.AFTER_EXIT_S + 2.0)
        return list(self._conn_watch[0].open_at_end)

    def _open_fifos(self) -> dict[int, int]:
        """fd -> rank of the read ends of one FIFO per rank (``rank<N>.alive``), whose
        write end the rank holds for its life (:mod:`spmd.launch._rank`)."""
        out = {}
        for r in range(self.np):
            path = os.path.join(self.dir, f"rank{r}.alive")
            try:
                os.mkfifo(path)
                # Non-blocking: no writer yet.  (Linux reports a hang-up only once a
                # writer has come and gone.)
                out[os.open(path, os.O_RDONLY | os.O_NONBLOCK)] = r
            except (OSError, AttributeError):  # no FIFOs here (see killed)
                break
        return out

    def _watch_exits(self) -> None:
        """Record the order in which the ranks' processes close their FIFO: the kernel
        closes a dying process's files before its exit is visible to mpiexec, so the
        first rank here ended first.  (The pidfds fire later, once its memory is
        gone, and a rank that mpiexec killed a moment after could fire first: seen in
        1 of 3 runs of a 3-rank job.)"""
        poller = select.poll()
        for fd in self._alive:
            poller.register(fd, select.POLLHUP)
        left = dict(self._alive)
        while left and self.proc.poll() is None:
            for fd, ev in poller.poll(100):
                if ev & (select.POLLHUP | select.POLLERR) and fd in left:
                    r = left.pop(fd)
                    if not self.ending:  # (not the ranks the launcher itself ends)
                        self.exits.append((time.monotonic(), r))
                    poller.unregister(fd)
                elif ev & select.POLLIN:
                    os.read(fd, 4096)  # (nothing is written; drain if something was)
        for fd in self._alive:
            try:
                os.close(fd)
            except OSError:
                pass

    def _watch_pids(self) -> None:
        """Note the shared-memory segments the live ranks map: when a file has
        appeared in the segments' directory (listed every :data:`SEGMENT_CHECK_S`),
        when a rank starts or ends, and every :data:`SEGMENT_SCAN_S`; a rank's pidfd
        tells that the pid read is still that rank (Linux)."""
        poller, fds, seen = select.poll(), {}, set()
        host = socket.gethostname()
        last_scan, listed = 0.0, None
        while self.proc.poll() is None:
            started = False
            for r in range(self.np):
                info = None if r in seen else _rank.read_pid_file(self.dir, r)
                if info and info.get("host") == host:
                    seen.add(r)
                    try:
                        pid = int(info["pid"])
                        fd = os.pidfd_open(pid)
                    except (OSError, ValueError, TypeError):
                        continue
                    fds[fd] = (r, pid)
                    poller.register(fd, select.POLLIN)
                    started = True
            ready = poller.poll(int(SEGMENT_CHECK_S * 1000))
            for fd, _ in ready:  # (a rank's process ended: the others may hold its files)
                poller.unregister(fd)
                del fds[fd]
                os.close(fd)
            # Listed before the read: a file made during it is new at the next check.
            now = entries(self.segments.dir)
            if (started or ready or listed is None or not now <= listed
                    or time.monotonic() - last_scan >= SEGMENT_SCAN_S):
                self._scan_segments(fds)
                last_scan = time.monotonic()
            listed = now
        for fd in fds:
            os.close(fd)

    def _scan_segments(self, fds: dict) -> None:
        """Note what the live ranks (pidfd -> (rank, pid)) map in /dev/shm."""
        for fd, (_, pid) in list(fds.items()):
            found = mapped_files(pid, self.segments.dir)
            # Kept only if the rank is still alive after the read: then the pid was
            # not reused by another process meanwhile.
            if found and not select.select([fd], [], [], 0)[0]:
                self.segments.add(found)

    def _copy_stdout(self) -> None:
        in_codes, box = False, None  # box: MPICH's banner lines while one is open
        for line in iter(self.proc.stdout.readline, b""):
            if _EXIT_CODES.search(line.rstrip()):  # asked for by us: read, not shown
                in_codes = True
                if not self.ending:
                    _parse_banner(line, self.banner)
                continue
            if in_codes and _MORE_CODES.match(line.rstrip()):  # the next hosts' codes
                if not self.ending and "codes" in self.banner:
                    self.banner["codes"] += _codes(line)
                continue
            in_codes = False
            box = self._hold_banner(box, line)
        if box is not None and any(b"BAD TERMINATION" in ln for ln in box):
            self.held += box
        else:
            for line in box or ():
                self._show(line)

    def _hold_banner(self, box: list | None, line: bytes) -> list | None:
        """MPICH's "BAD TERMINATION ... YOU CAN IGNORE THE BELOW CLEANUP MESSAGES" box
        is held back (:attr:`held`): spmd-run's own explanation, printed after the job,
        says what it says (which rank, which signal) and comes first.  A box is a
        blank line and a rule of '=', then a line naming BAD TERMINATION, up to the
        next rule; anything else (a program's own rule of '=' included) passes
        through.  Returns the box being read, or None."""
        rule = _BANNER_RULE.match(line.strip()) is not None
        if box is not None and not any(b"BAD TERMINATION" in ln for ln in box):
            if (not line.strip() and not box[-1].strip()) or \
                    (rule and not box[-1].strip()) or \
                    (b"BAD TERMINATION" in line and _BANNER_RULE.match(box[-1].strip())):
                return box + [line]  # (still what a box starts with)
            for held in box:  # not a box after all
                self._show(held)
            box = None
        if box is None:
            if rule or not line.strip():
                return [line]
            if line.startswith(_BANNER_TAIL):
                self.held.append(line)  # (the box's last word, after the exit codes)
                if not self.ending:
                    _parse_banner(line, self.banner)
                return None
            self._show(line)
            return None
        box.append(line)
        if not self.ending:
            _parse_banner(line, self.banner)
        if rule or len(box) > BANNER_LINES:
            self.held += box
            return None
        return box

    def _show(self, line: bytes) -> None:
        _emit(sys.stdout, line)
        if not self.ending:
            _parse_banner(line, self.banner)

    def _copy_stderr(self) -> None:
        """The ranks' stderr passes through; mpiexec's own complaints (Hydra's
        ``[mpiexec@host] ...``, ``[proxy:...]`` lines, as when it loses a host) are
        held for :meth:`mpiexec_messages`, to follow spmd-run's explanation."""
        for line in iter(self.proc.stderr.readline, b""):
            if _HYDRA_LINE.match(line):
                self.hydra.append(line.decode(errors="replace").rstrip())
                continue
            _emit(sys.stderr, line)

    def mpiexec_messages(self) -> str:
        """What mpiexec itself said (held back), shortened, for after the summary;
        "" when it said nothing."""
        for t in (self._reader, getattr(self, "_err_reader", None)):
            if t is not None:
                t.join(timeout=2.0)
        lines = list(dict.fromkeys(_HYDRA_DETAIL.sub("", ln) for ln in self.hydra))
        if not lines:
            return ""
        if len(lines) > HYDRA_LINES:
            lines = lines[:HYDRA_LINES] + [f"... ({len(lines) - HYDRA_LINES} more)"]
        return "(mpiexec's own messages:)\n" + "\n".join("    " + ln for ln in lines)

    def killed(self) -> dict[int, int]:
        """Rank -> the signal that killed it, as mpiexec reported it before the launcher
        ended the job (MPICH's Hydra: the ranks' exit codes and the failure's signal)."""
        if self._reader is not None:
            self._reader.join(timeout=2.0)  # mpiexec prints it as it exits
        codes, sig = self.banner.get("codes"), self.banner.get("signal")
        if not codes or sig is None or len(codes) != self.np:
            return self._killed_in_box()
        reported = self.reports()
        # The ranks mpiexec says the signal ended, with no Python report: one alone is
        # the killed rank.  With several (mpiexec's cleanup may end others with the
        # same signal), the first to close its FIFO (see _watch_exits), and those
        # that closed within EXIT_TIE_S of it: which of these came first cannot be
        # told, so all are named rather than a guess.
        silent = [r for r in range(self.np) if r not in reported and codes[r] == sig]
        if len(silent) == 1:
            return {silent[0]: sig}
        order = [(t, r) for t, r in self.exits if r in silent]
        if order:
            return {r: sig for t, r in order if t - order[0][0] <= EXIT_TIE_S}
        return {}  # (no FIFOs here: which rank went first is not known)

    def _killed_in_box(self) -> dict[int, int]:
        """Rank -> signal from MPICH's box alone (a job across hosts whose mpiexec
        aborts before it prints the exit codes): the process it names (pid and host)
        is the rank whose start record says so; with no Python report, the exit code
        is the signal that killed it."""
        pid, host, code = (self.banner.get(k) for k in ("pid", "host", "exit"))
        if pid is None or not code or code >= 64:
            return {}
        reported = self.reports()
        for r in range(self.np):
            info = _rank.read_pid_file(self.dir, r)
            if info and info.get("pid") == pid and info.get("host") == host:
                return {} if r in reported else {r: code}
        return {}

    def stranded(self) -> tuple[list[int], dict[int, dict]] | None:
        """(ranks that finished, ranks waiting for them in a collective) once the same
        waits have lasted :data:`STRANDED_CONFIRM_S`, else None."""
        reports = self.reports()
        done = sorted(r for r, rep in reports.items() if rep.get("status") == 0)
        if not done or len(done) == self.np:
            self._stranded = (None, 0.0)
            return None
        waits = {r: w for r, w in _rank.read_waits(self.dir).items()
                 if r not in reports and any(f in w.get("ranks", ()) for f in done)}
        key = tuple(sorted((r, w.get("seq"), w.get("since")) for r, w in waits.items()))
        now = time.monotonic()
        if not waits:
            self._stranded = (None, 0.0)
            return None
        if key != self._stranded[0]:
            self._stranded = (key, now)
            return None
        if now - self._stranded[1] < STRANDED_CONFIRM_S:
            return None
        return [f for f in done if any(f in w["ranks"] for w in waits.values())], waits

    def reports(self) -> dict[int, dict]:
        """Rank -> the result its wrapper recorded (ranks still running have none)."""
        return _rank.read_reports(self.dir)

    def hosts(self) -> dict[int, str]:
        """Rank -> its host: as the rank recorded it when it started, else where the
        launcher placed it (empty when every rank ran here and none said)."""
        out = {}
        for r in range(self.np):
            info = _rank.read_pid_file(self.dir, r)
            if info and isinstance(info.get("host"), str):
                out[r] = info["host"]
            elif self.rank_hosts:
                out[r] = self.rank_hosts[r]
        return out

    def pids(self) -> dict[int, int]:
        """Rank -> pid, for ranks that started on this host."""
        host = socket.gethostname()
        out = {}
        for r in range(self.np):
            info = _rank.read_pid_file(self.dir, r)
            if info and info.get("host") == host and _is_our_rank(info.get("pid"), self.dir):
                out[r] = info["pid"]
        return out

    def wait(self, timeout: float | None) -> tuple[str, object]:
        """Watch the job: ("done", rc), ("failed", None), ("timeout", None), or
        ("stranded", (finished ranks, waits)) when ranks that finished leave others
        waiting for them in a collective."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failure_seen = None
        while True:
            try:
                return "done", self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if failure_seen is None and any(rep["status"] != 0
                                            for rep in self.reports().values()):
                failure_seen = now
            if failure_seen is not None and now - failure_seen > FAILURE_GRACE_S:
                return "failed", None  # a rank failed but mpiexec did not end the job
            if deadline is not None and now > deadline:
                return "timeout", None
            if failure_seen is None:
                stranded = self.stranded()
                if stranded is not None:
                    return "stranded", stranded

    def stacks(self, pids: dict[int, int]) -> dict[int, str]:
        """Ask the running ranks for their Python stacks (faulthandler on SIGUSR1)."""
        if not pids or not hasattr(signal, "SIGUSR1"):
            return {}
        for pid in pids.values():
            _signal(pid, signal.SIGUSR1)
        time.sleep(0.5)
        return {r: _rank.read_text(self.dir, r, "stack") for r in pids}

    def cleanup(self) -> list[str]:
        """After the job has ended: make sure its local ranks are gone, then remove the
        shared-memory segments they left (see :mod:`spmd.launch.cleanup`); return
        the removed paths.  Safe to call whatever the outcome, also for a job that
        succeeded (MPI then removed its segments itself, and nothing is left)."""
        if self.proc is None or self.segments is None:
            return []
        if self.proc.poll() is None:
            self.end()
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)
        # mpiexec has exited, so a rank still alive is an orphan; it would keep its
        # segments (and they would rightly be left, being in use).
        self._await_ranks_gone(REAP_S)
        for pid in self.pids().values():
            _signal(pid, signal.SIGKILL)
        self._await_ranks_gone(1.0)
        self.segments.add_records(self.dir, socket.gethostname())
        return self.segments.remove()

    def _await_ranks_gone(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def end(self) -> int:
        """End every process of the job; return mpiexec's exit status."""
        if self.proc is None:
            return 0
        self.ending = True
        if self.proc.poll() is None:
            ranks = self.pids()
            try:
                self.proc.send_signal(signal.SIGTERM)  # mpiexec ends its ranks
                self.proc.wait(timeout=TERM_GRACE_S)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):  # or a second Ctrl-C
                _signal(-self.proc.pid, signal.SIGKILL)  # its process group
            finally:
                # Hydra puts each rank in a session of its own: make sure.
                for pid in ranks.values():
                    _signal(pid, signal.SIGKILL)
            self.proc.wait()
        return self.proc.returncode


def _is_our_rank(pid, launch_dir: str) -> bool:
    """``pid`` is alive and is a rank of this job (not a recycled pid)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"SPMD_LAUNCH_DIR={launch_dir}".encode() in f.read().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here (macOS) or not readable: trust the pid if it is alive
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _signal(pid: int, sig) -> None:
    """``os.kill`` that ignores processes already gone (a negative pid is a group)."""
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the launcher dies (Linux), so a
    killed ``spmd-run`` does not leave its job running in a session of its own."""
    if sys.platform.startswith("linux"):

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        except (OSError, AttributeError):
            pass
