"""Pools of rank workers for tests marked ``@pytest.mark.spmd(processes=N)``.

A pool is one ``spmd-run -n N --local-devices D -m spmd.testing._worker`` job, started
the first time a test needs that (N, D) and environment and kept for the next ones:
MPI starts once, not once per test.  Each worker connects back to this process over a local socket
(``multiprocessing.connection``, an authentication key per pool).  A test is sent to
every rank; each runs it as an inner pytest run and answers with its phases' reports.

The outcome is one for the whole test (:class:`Outcome`): passed when every rank
passed; otherwise each failing rank with its report, and a rank that did not answer
within the test's timeout (hung) or whose process ended (died), named with where it
waited (its threads' stacks, written by the worker on SIGUSR1).  A pool after any test
that did not pass is stopped (its ranks may be out of step: a collective one of them
started could pair with the next test's) and the next test gets a fresh one.
"""

from __future__ import annotations

import atexit
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Listener, wait

# Seconds a pool's ranks have to start and connect.
START_TIMEOUT = 180.0
# Seconds the other ranks are given once one rank has reported a failure (they may be
# waiting for it in a collective).
GRACE_AFTER_FAILURE = 5.0


@dataclass
class RankResult:
    rank: int
    state: str            # "passed", "failed", "skipped", "hung", "died"
    phases: list = field(default_factory=list)
    where: str = ""       # a hung rank's stacks


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
        for rank in pending:
            results[rank] = RankResult(rank, "hung", where=self._stacks(rank))
        ranks = [results[r] for r in sorted(results)]
        return Outcome(_phases(ranks, timeout), ranks, time.monotonic() - t0)

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

    def stop(self) -> None:
        """End the job: its ranks are told to stop, then killed if they do not."""
        for conn in getattr(self, "conns", {}).values():
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.proc.wait()
        self.listener.close()
        output = self.output
        self.log.close()
        shutil.rmtree(self.dumpdir, ignore_errors=True)
        self.final_output = output


def _trim(dump: str) -> str:
    """faulthandler's stacks, each thread's cut where pytest's own frames begin (most
    recent call first: what is below them is the worker running the test)."""
    out, skipping = [], False
    for line in dump.splitlines():
        if not line.startswith("  "):  # a thread's header (or a blank line)
            skipping = False
            out.append(line)
        elif not skipping:
            if "/_pytest/" in line or "/pluggy/" in line or "spmd/testing/_worker.py" in line:
                skipping = True
                out.append("  ...")
            else:
                out.append(line)
    return "\n".join(out)


def _state(answer: dict) -> str:
    outcomes = [o for _, o, _, _ in answer["phases"]]
    if "failed" in outcomes:
        return "failed"
    if "skipped" in outcomes:
        return "skipped"
    return "passed"


def _phases(ranks: list, timeout: float) -> list:
    """The reports of the whole test: a failure names every rank that failed, hung or
    died; a skip (every rank skipped) gives rank 0's reason."""
    bad = [r for r in ranks if r.state in ("failed", "hung", "died")]
    if not bad:
        if all(r.state == "skipped" for r in ranks):
            when, _, _, reason = next(p for p in ranks[0].phases if p[1] == "skipped")
            return [(when, "skipped", "", reason)]
        return [("call", "passed", "", None)]
    parts = []
    for r in bad:
        if r.state == "failed":
            for when, outcome, text, _ in r.phases:
                if outcome == "failed":
                    parts.append(f"rank {r.rank} failed (in {when}):\n{text}")
        elif r.state == "hung":
            parts.append(f"rank {r.rank} hung: it did not finish within {timeout:g} s; "
                         f"where it waited:\n{r.where}")
        else:
            parts.append(f"rank {r.rank} died: its process ended before it answered")
    when = "setup" if all(r.state == "failed" and any(
        w == "setup" and o == "failed" for w, o, _, _ in r.phases) for r in bad) else "call"
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
            pool.stop()  # out of step, or gone: the next test gets a fresh one
            del self.pools[key]
        return outcome

    def stop(self) -> None:
        for pool in self.pools.values():
            pool.stop()
        self.pools.clear()
