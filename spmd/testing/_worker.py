"""A rank of a test pool (:mod:`spmd.testing.pool`).

Started by ``spmd-run -n N -m spmd.testing._worker HOST PORT KEY DUMPDIR``, it connects
to the pytest process that started the pool, then runs the tests it is sent, one at
a time, in inner ``pytest.main`` sessions (one per test file, :class:`_Module`: the
fixtures and parametrisation are the rank's own), and sends back what each phase
reported.  SIGUSR1 writes every thread's stack to ``DUMPDIR/rank-R.txt`` (how the
pool says where a hung rank waits).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from multiprocessing.connection import Client

import pytest


class _Module:
    """A pytest plugin that keeps one inner session per test file: after collecting
    the file it runs the tests it is sent, one at a time, until a test of another file
    (kept in ``next_job`` for the next session) or the end comes.  Collection and
    pytest's start are paid once per file, not once per test."""

    def __init__(self, conn, job):
        self.conn, self.job, self.next_job = conn, job, None
        self.phases, self.items, self.started = [], {}, False

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        # pytest-mpi (where installed and enabled) skips every test with the keyword
        # ``mpi`` unless the run says ``--with-mpi``: a rank is in an MPI job.
        if hasattr(config.option, "with_mpi"):
            config.option.with_mpi = True

    def pytest_runtest_logreport(self, report):
        reason = None
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
        text = report.longreprtext
        if report.failed:  # what the rank printed, as pytest shows it for a failure
            text += "".join(f"\n\n----- {name} -----\n{content}"
                            for name, content in report.sections)
        self.phases.append((report.when, report.outcome, text, reason))

    def pytest_collection_finish(self, session):
        self.items = {item.nodeid: item for item in session.items}

    def pytest_runtestloop(self, session):
        self.started = True
        job = self.job
        while job is not None:
            if job["file"] != self.job["file"]:
                self.next_job = job  # another file: another session
                return True
            item = self.items.get(job["nodeid"])
            self.phases = []
            if item is None:
                answer = {"phases": [], "collected": 0, "exit": 4}
            else:
                item.ihook.pytest_runtest_protocol(item=item, nextitem=None)
                answer = {"phases": self.phases, "collected": 1, "exit": 0}
            self.conn.send(answer)
            job = _receive(self.conn)
        return True


def _receive(conn):
    """The next job, or None at the end (or when the pytest process is gone)."""
    try:
        return conn.recv()
    except EOFError:
        return None


def _session(conn, job) -> dict | None:
    """One inner pytest session over ``job``'s file; the first job of the next file."""
    module = _Module(conn, job)
    os.chdir(job["invocation_dir"])
    # unraisableexception: its two gc.collect() calls a run took 60 of its 90 ms here.
    args = [job["file"], "-p", "no:cacheprovider", "-p", "no:unraisableexception", "-q",
            "--rootdir", job["rootdir"], *job.get("args", [])]
    if job.get("inifile"):
        args += ["-c", job["inifile"]]
    try:
        code = pytest.main(args, plugins=[module])
    except BaseException as e:  # noqa: BLE001 - reported, never lost
        conn.send({"phases": [("call", "failed", f"{type(e).__name__}: {e}", None)],
                   "collected": 0, "exit": 3})
        return _receive(conn)
    if not module.started:  # the session ended before its loop ran: say why
        conn.send({"phases": [("setup", "failed", f"the rank's pytest run of {job['file']} "
                               f"ended with exit status {int(code)} before running the test "
                               "(a collection error?)", None)], "collected": 0, "exit": int(code)})
        return _receive(conn)
    return module.next_job


def main(argv=None) -> int:
    host, port, key, dumpdir = (argv or sys.argv[1:])[:4]
    # The marked tests run here in place (_spmd_pytest_plugin reads it).  Set here,
    # not at import: importing this module must not change the importer's tests.
    os.environ["SPMD_TESTING_WORKER"] = "1"
    import spmd

    rank = spmd.process_index()
    dump = open(os.path.join(dumpdir, f"rank-{rank}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    conn = Client((host, int(port)), authkey=bytes.fromhex(key))
    # spmd-run's directory of the ranks' records: where a rank's collective watchdog
    # says which collective it waits in (the pool's report of a hang reads it).
    conn.send({"rank": rank, "pid": os.getpid(),
               "launch_dir": os.environ.get("SPMD_LAUNCH_DIR")})
    job = _receive(conn)
    while job is not None:
        job = _session(conn, job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
