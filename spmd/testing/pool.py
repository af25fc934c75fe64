"""Pools of rank workers for tests marked ``@pytest.mark.spmd(processes=N)``.

A pool is one ``spmd-run -n N --local-devices D -m spmd.testing._worker`` job, started
the first time a test needs that (N, D) and environment and kept for the next ones:
MPI starts once, not once per test.  Each worker connects back to this process over a local socket
(``multiprocessing.connection``, an authentication key per pool).  A test is sent to
every rank; each runs it as an inner pytest run and answers with its phases' reports.

The outcome is one for the whole test (:class:`Outcome`): passed when every rank
passed; otherwise each failing rank with its report, and a rank that did not answer
within the test's timeout (hung) or whose process ended (died), named with where it
waited (its threads' stacks, written by the worker on SIGUSR1).  A hang's report leads
with its culprit: the rank that never reached the collective the others wait in
(``spmd-run``'s wait records, ``rank<N>.wait``, say which collective each waits in), and
where that rank is.  A pool after any test that did not pass is stopped (its ranks may
be out of step: a collective one of them started could pair with the next test's) and
the next test gets a fresh one.

Stopping a pool leaves nothing in ``/dev/shm``: ranks that do not end when told (hung
ones) are ended through ``spmd-run`` (SIGTERM: it ends the job and removes its
shared-memory segments), and what the ranks were seen to map is removed after them
when the launcher itself had to be killed (:mod:`spmd.launch.cleanup`'s rules: only
files made since the pool started that no live process uses).
"""

from __future__ import annotations

import atexit
import linecache
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Listener, wait

from spmd.launch import _rank
from spmd.launch.cleanup import Segments, mapped_files

# Seconds a pool's ranks have to start and connect.
START_TIMEOUT = 180.0
# Seconds the other ranks are given once one rank has reported a failure (they may be
# waiting for it in a collective).
GRACE_AFTER_FAILURE = 5.0
# Seconds a stopped pool's ranks have to end when told (a test that passed leaves them
# ready to), then the launcher has to end the job once sent SIGTERM (it ends mpiexec
# within 3 s, waits up to 2 s for the ranks, then removes their segments).
STOP_WAIT = 3.0
TERM_WAIT = 15.0
# spmd's own files: frames there are not where a user's test waits.
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass
class RankResult:
    rank: int
    state: str            # "passed", "failed", "skipped", "hung", "died"
    phases: list = field(default_factory=list)
    where: str = ""       # a hung rank's stacks
    wait: dict | None = None  # the collective a hung rank waits in (spmd-run's record)


@dataclass
class Outcome:
    """A test's outcome over all ranks: ``when``/``outcome``/``text`` per phase to
    report, in pytest's terms."""
    phases: list           # [(when, outcome, text, skip reason)]
    ranks: list            # [RankResult]
    seconds: float


class Pool:
    """One running job of ``processes`` ranks of ``devices`` devices each."""

    def __init__(self, processes: int, devices: int, env: dict | None = None):
        self.processes, self.devices = processes, devices
        self.dumpdir = tempfile.mkdtemp(prefix="spmd-testing-")
        # What /dev/shm holds before the job: never the pool's to remove.
        self.segments = Segments()
        self.launch_dir = None  # spmd-run's directory of the ranks' records
        key = secrets.token_bytes(16)
        self.listener = Listener(("127.0.0.1", 0), authkey=key)
        host, port = self.listener.address
        self.log = open(os.path.join(self.dumpdir, "job.log"), "w+")
        cmd = [sys.executable, "-m", "spmd.launch", "-n", str(processes), "--local-devices",
               str(devices), "-m", "spmd.testing._worker", host, str(port), key.hex(),
               self.dumpdir]
        environ = {**os.environ, **(env or {})}
        environ.pop("SPMD_TESTING_WORKER", None)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=environ,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.conns, self.pids = {}, {}
        self.final_output = ""
        arrived: queue.Queue = queue.Queue()

        def accept():  # in a thread: accept() blocks, the launcher may die meanwhile
            try:
                while True:
                    conn = self.listener.accept()
                    arrived.put((conn, conn.recv()))
            except (OSError, EOFError):
                return

        threading.Thread(target=accept, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while len(self.conns) < processes:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop()
                why = (f"its launcher ended with exit status {code}" if code is not None
                       else f"its ranks had not all connected after {START_TIMEOUT:.0f} s")
                raise RuntimeError(
                    f"spmd.testing: a pool of {processes} ranks of {devices} device(s) did "
                    f"not start: {why}; its output:\n{self.final_output}")
            try:
                conn, hello = arrived.get(timeout=0.2)
            except queue.Empty:
                continue
            self.conns[hello["rank"]] = conn
            self.pids[hello["rank"]] = hello["pid"]
            self.launch_dir = hello.get("launch_dir") or self.launch_dir
        self._note_segments()

    @property
    def output(self) -> str:
        """The end of the job's output (its ranks' stdout and stderr)."""
        try:
            self.log.flush()
            self.log.seek(0)
            return self.log.read()[-4000:]
        except (OSError, ValueError):
            return ""

    def run(self, job: dict, timeout: float) -> Outcome:
        """Run one test on every rank (see the module docstring)."""
        t0 = time.monotonic()
        pending, results = {}, {}
        for rank, conn in self.conns.items():
            try:
                conn.send(job)
                pending[rank] = conn
            except OSError:  # its process is gone
                results[rank] = RankResult(rank, "died")
        deadline = t0 + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = wait(list(pending.values()), timeout=left)
            for conn in ready:
                rank = next(r for r, c in pending.items() if c is conn)
                del pending[rank]
                try:
                    answer = conn.recv()
                except (EOFError, OSError):
                    results[rank] = RankResult(rank, "died")
                    continue
                results[rank] = RankResult(rank, _state(answer), answer["phases"])
                if answer["collected"] == 0 and not answer["phases"]:
                    results[rank] = RankResult(rank, "failed", [(
                        "call", "failed", "the test was not found by the rank's pytest run "
                        f"(exit status {answer['exit']})", None)])
            if any(r.state in ("failed", "died") for r in results.values()):
                deadline = min(deadline, time.monotonic() + GRACE_AFTER_FAILURE)
        waits = self._waits() if pending else {}
        for rank in pending:
            results[rank] = RankResult(rank, "hung", where=self._stacks(rank),
                                       wait=waits.get(rank))
        ranks = [results[r] for r in sorted(results)]
        return Outcome(_phases(ranks, timeout, job.get("rootdir")), ranks,
                       time.monotonic() - t0)

    def _waits(self) -> dict:
        """Rank -> the collective it has waited in for a second or more, as the rank's
        watchdog records it for ``spmd-run`` (what, ranks, seq, where)."""
        if not self.launch_dir:
            return {}
        try:
            return _rank.read_waits(self.launch_dir)
        except OSError:
            return {}

    def _note_segments(self) -> None:
        """Note the /dev/shm files the ranks map now (MPICH's segment of the node from
        their start; spmd's windows are unlinked once mapped), to remove them should
        the launcher have to be killed (it would not remove them then)."""
        for pid in self.pids.values():
            if _is_worker(pid):
                self.segments.add(mapped_files(pid, self.segments.dir))

    def _stacks(self, rank: int) -> str:
        path = os.path.join(self.dumpdir, f"rank-{rank}.txt")
        try:
            start = os.path.getsize(path)
            os.kill(self.pids[rank], signal.SIGUSR1)
        except OSError:
            return "(its process could not be asked)"
        for _ in range(50):  # up to 1 s for faulthandler to write
            time.sleep(0.02)
            if os.path.getsize(path) > start:
                break
        time.sleep(0.05)
        with open(path) as f:
            f.seek(start)
            return _trim(f.read())

    def stop(self, wait: float = STOP_WAIT) -> None:
        """End the job: its ranks are told to stop; if they have not within ``wait``
        seconds (hung ones never do), the launcher is sent SIGTERM (``spmd-run`` then
        ends the job and removes its shared-memory segments), and killed, with the
        ranks, if it has not ended either; then what the ranks were seen to map and
        is left is removed (see the module docstring)."""
        if getattr(self, "conns", None) and self.proc.poll() is None:
            self._note_segments()  # hung ranks may have mapped more since they started
        for conn in getattr(self, "conns", {}).values():
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        if self.proc.poll() is None and not _wait(self.proc, wait):
            try:
                self.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass
            if not _wait(self.proc, TERM_WAIT):
                for pid in [self.proc.pid] + [p for p in getattr(self, "pids", {}).values()
                                              if _is_worker(p)]:
                    try:  # the launcher's group, and the ranks (hydra gives each its own)
                        if pid == self.proc.pid:
                            os.killpg(pid, signal.SIGKILL)
                        else:
                            os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                self.proc.wait()
        self._remove_segments()
        self.listener.close()
        output = self.output
        self.log.close()
        shutil.rmtree(self.dumpdir, ignore_errors=True)
        self.final_output = output

    def _remove_segments(self) -> None:
        """Remove what the ranks mapped and left, once they are gone (a rank still
        alive keeps its files: they are in use)."""
        if not self.segments.seen:
            return
        deadline = time.monotonic() + 2.0
        while any(_is_worker(p) for p in getattr(self, "pids", {}).values()) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        self.segments.remove()


def _wait(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether ``proc`` ended within ``seconds``."""
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _is_worker(pid: int) -> bool:
    """``pid`` is a live rank worker of a pool (not a pid reused since, nor a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            alive = b"spmd.testing._worker" in f.read()
        with open(f"/proc/{pid}/stat") as f:
            return alive and f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError, TypeError):
        return False


def _trim(dump: str) -> str:
    """faulthandler's stacks, each thread's cut where pytest's own frames begin (most
    recent call first: what is below them is the worker running the test); the
    collective watchdog's thread (spmd's, idle in its loop) is left out."""
    out, skipping, section = [], False, []
    for line in dump.splitlines() + [""]:
        if not line.startswith("  "):  # a thread's header (or a blank line)
            if not (len(section) > 1 and "spmd/collectives/mpi/watchdog.py" in section[1]
                    and section[1].endswith(" in _run")):
                out.extend(section)
            section, skipping = [line], False
        elif not skipping:
            if "/_pytest/" in line or "/pluggy/" in line or "spmd/testing/_worker.py" in line:
                skipping = True
                section.append("  ...")
            else:
                section.append(line)
    return "\n".join(out).strip("\n")


def _state(answer: dict) -> str:
    outcomes = [o for _, o, _, _ in answer["phases"]]
    if "failed" in outcomes:
        return "failed"
    if "skipped" in outcomes:
        return "skipped"
    return "passed"


_FRAME = re.compile(r'  File "(.*)", line (\d+) in (.*)$')


def _main_frames(where: str) -> list:
    """(file, line, function) of the main thread's frames in a rank's stacks, most
    recent first: faulthandler's "Current thread", the one that handled SIGUSR1 (Python
    runs signal handlers in the main thread)."""
    frames, current = [], False
    for line in where.splitlines():
        if not line.startswith("  "):
            current = line.startswith("Current thread")
            continue
        found = _FRAME.match(line)
        if current and found:
            frames.append((found[1], int(found[2]), found[3]))
    return frames


def _library_dirs() -> tuple:
    paths = sysconfig.get_paths()
    return tuple(os.path.join(paths[k], "") for k in ("stdlib", "platstdlib", "purelib",
                                                      "platlib") if paths.get(k))


def _test_frame(frames: list):
    """The innermost frame of the test's own code: outside spmd (its package, its
    generated programs) and the installed libraries; else the innermost one."""
    libraries = _library_dirs()
    for frame in frames:
        path = frame[0]
        if not (path.startswith(_PKG_DIR) or path.startswith("<")
                or path.startswith(libraries)):
            return frame
    return frames[0] if frames else None


def _place(frame, rootdir: str | None, source: bool = False) -> str:
    """``file:line in function`` (the file relative to the run's root), with the
    line's text when ``source``."""
    path, line, function = frame
    shown = path
    if rootdir and path.startswith(os.path.join(rootdir, "")):
        shown = os.path.relpath(path, rootdir)
    text = f"{shown}:{line} in {function}"
    code = linecache.getline(path, line).strip() if source else ""
    return f"{text}: `{code}`" if code else text


def _in_collective(r: RankResult):
    """The collective a hung rank waits in, as (its ranks, its sequence number), or
    None.  The rank's wait record says; without one (a wait shorter than the
    watchdog's second), a main thread inside spmd's collectives waits in one whose
    group is taken to be every rank's (sequence number unknown)."""
    if r.state != "hung":
        return None
    if r.wait and isinstance(r.wait.get("ranks"), list):
        return tuple(r.wait["ranks"]), r.wait.get("seq")
    if any("spmd/collectives/" in f for f, _, _ in _main_frames(r.where)):
        return None, None
    return None


def _whereabouts(r: RankResult, rootdir: str | None) -> str:
    """Where a rank that never arrived is, in a few words."""
    if r.state == "passed":
        return f"rank {r.rank} finished the test (it passed)"
    if r.state == "skipped":
        return f"rank {r.rank} finished the test (it was skipped)"
    if r.state == "failed":
        return f"rank {r.rank} failed (its report is below)"
    if r.state == "died":
        return f"rank {r.rank} died"
    frame = _test_frame(_main_frames(r.where))
    if r.wait:
        seq = f" (collective #{r.wait['seq']} there)" if r.wait.get("seq") else ""
        at = f" at {_place(frame, rootdir)}" if frame else ""
        return (f"rank {r.rank} waits in {r.wait.get('what') or 'a collective'} over ranks "
                f"{r.wait.get('ranks')}{seq}{at}")
    if frame is None:
        return f"rank {r.rank} is somewhere its stacks do not show"
    return f"rank {r.rank} is at {_place(frame, rootdir, source=True)}"


def _culprits(ranks: list, rootdir: str | None) -> tuple:
    """For each collective that hung ranks wait in, a line naming the ranks that never
    reached it and where they are; and those ranks, in the order named."""
    groups: dict = {}
    for r in ranks:
        key = _in_collective(r)
        if key is not None:
            groups.setdefault(key, []).append(r)
    everyone = tuple(r.rank for r in ranks)
    lines, named = [], []
    for (members, seq), waiters in sorted(groups.items(), key=lambda kv: kv[1][0].rank):
        inside = {w.rank for w in waiters}
        missing = [r for r in ranks if r.rank in (members or everyone) and r.rank not in inside]
        if not missing:
            continue
        first = waiters[0]
        what = (first.wait or {}).get("what") or "a collective"
        frame = _test_frame(_main_frames(first.where))
        site = f"{what} at {_place(frame, rootdir)}" if frame else what
        who = (f"rank {first.rank} waits" if len(waiters) == 1 else
               "ranks " + ", ".join(str(w.rank) for w in waiters) + " wait")
        gone = ("rank " if len(missing) == 1 else "ranks ") + \
            ", ".join(str(m.rank) for m in missing)
        lines.append(f"{gone} never reached the collective {who} in ({site}); "
                     + "; ".join(_whereabouts(m, rootdir) for m in missing))
        named += [m for m in missing if m not in named]
    return lines, named


def _phases(ranks: list, timeout: float, rootdir: str | None = None) -> list:
    """The reports of the whole test: a failure names every rank that failed, hung or
    died, led by the culprits of a hang (the ranks that never reached a collective
    others wait in, and where they are; see :func:`_culprits`); a skip (every rank
    skipped) gives rank 0's reason."""
    bad = [r for r in ranks if r.state in ("failed", "hung", "died")]
    if not bad:
        if all(r.state == "skipped" for r in ranks):
            when, _, _, reason = next(p for p in ranks[0].phases if p[1] == "skipped")
            return [(when, "skipped", "", reason)]
        return [("call", "passed", "", None)]
    lead, named = _culprits(ranks, rootdir)
    parts = []
    for r in [r for r in named if r in bad] + [r for r in bad if r not in named]:
        if r.state == "failed":
            for when, outcome, text, _ in r.phases:
                if outcome == "failed":
                    parts.append(f"rank {r.rank} failed (in {when}):\n{text}")
        elif r.state == "hung":
            waits = ""
            if r.wait:
                seq = f", collective #{r.wait['seq']} there" if r.wait.get("seq") else ""
                waits = (f", waiting in {r.wait.get('what') or 'a collective'} over ranks "
                         f"{r.wait.get('ranks')}{seq}")
            parts.append(f"rank {r.rank} hung: it did not finish within {timeout:g} s"
                         f"{waits}; where it waited:\n{r.where}")
        else:
            parts.append(f"rank {r.rank} died: its process ended before it answered")
    when = "setup" if all(r.state == "failed" and any(
        w == "setup" and o == "failed" for w, o, _, _ in r.phases) for r in bad) else "call"
    if lead:
        parts.insert(0, "\n".join(lead))
    return [(when, "failed", "\n\n".join(parts), None)]


class Pools:
    """The running pools of a pytest session, by (processes, devices, environment)."""

    def __init__(self):
        self.pools: dict = {}
        atexit.register(self.stop)

    def run(self, processes: int, devices: int, job: dict, timeout: float,
            env: dict | None = None) -> Outcome:
        key = (processes, devices, tuple(sorted((env or {}).items())))
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = Pool(processes, devices, env)
        outcome = pool.run(job, timeout)
        if any(r.state != "passed" and r.state != "skipped" for r in outcome.ranks):
            # Out of step, or gone: the next test gets a fresh one.  Hung ranks would
            # not answer the stop: their launcher is asked at once.
            pool.stop(wait=0 if any(r.state == "hung" for r in outcome.ranks)
                      else STOP_WAIT)
            del self.pools[key]
        return outcome

    def stop(self) -> None:
        for pool in self.pools.values():
            pool.stop()
        self.pools.clear()
