"""A rank of a test pool (:mod:`spmd.testing.pool`): started by ``spmd-run -n N -m
spmd.testing._worker HOST PORT KEY DUMPDIR``, it connects to the pytest process that
started the pool, then runs the tests it is sent, one at a time, each as an inner
``pytest.main`` of that one test (so fixtures and parametrisation are the rank's own),
and sends back what each phase reported.  SIGUSR1 writes every thread's stack to
``DUMPDIR/rank-R.txt`` (how the pool says where a hung rank waits).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from multiprocessing.connection import Client

# The marked tests run here in place (spmd.testing.plugin reads it).
os.environ["SPMD_TESTING_WORKER"] = "1"


class _Reports:
    """The inner run's reports: ``(when, outcome, text, skip reason)`` per phase."""

    def __init__(self):
        self.phases = []
        self.collected = 0

    def pytest_collection_modifyitems(self, items):
        self.collected = len(items)

    def pytest_runtest_logreport(self, report):
        reason = None
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
        self.phases.append((report.when, report.outcome, report.longreprtext, reason))


def _run(job: dict) -> dict:
    import pytest

    reports = _Reports()
    os.chdir(job["invocation_dir"])
    # unraisableexception: its two gc.collect() calls a run took 60 of its 90 ms here.
    args = [job["target"], "-p", "no:cacheprovider", "-p", "no:unraisableexception", "-q",
            "--rootdir", job["rootdir"],
            *job.get("args", [])]
    if job.get("inifile"):
        args += ["-c", job["inifile"]]
    code = pytest.main(args, plugins=[reports])
    return {"phases": reports.phases, "collected": reports.collected, "exit": int(code)}


def main(argv=None) -> int:
    host, port, key, dumpdir = (argv or sys.argv[1:])[:4]
    import spmd

    rank = spmd.process_index()
    dump = open(os.path.join(dumpdir, f"rank-{rank}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    conn = Client((host, int(port)), authkey=bytes.fromhex(key))
    conn.send({"rank": rank, "pid": os.getpid()})
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the pytest process is gone
            return 0
        if job is None:
            return 0
        try:
            result = _run(job)
        except BaseException as e:  # noqa: BLE001 - reported, never lost
            result = {"phases": [("call", "failed", f"{type(e).__name__}: {e}", None)],
                      "collected": 0, "exit": 3}
        conn.send(result)


if __name__ == "__main__":
    sys.exit(main())
