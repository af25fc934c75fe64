"""One rank of an in-place test run on emulated nodes.

    mpiexec <nodes' options> -n 4 python tests/multinode/rank_pytest.py OUTDIR [pytest args...]

is ``python -m pytest [pytest args...]`` on every rank (the multi-process modules
of ``tests/mpi`` run in place, as under ``make test-mpi``), except that each rank
writes its output to ``OUTDIR/rank<N>.log`` and a summary to
``OUTDIR/rank<N>.json``: its host name, pytest's exit status, how many tests it
collected and the ids of those that passed, failed or were skipped.  The test that
launched the job reads the summaries: mpiexec's status alone cannot tell "no test
collected" from "passed", nor which rank failed.
"""

from __future__ import annotations

import json
import os
import socket
import sys


class Tally:
    """A pytest plugin that counts what was collected and each test's outcome
    (a test passes when its setup, call and teardown all pass)."""

    def __init__(self):
        self.collected = 0
        self.failed: list[str] = []
        self.skipped: list[str] = []
        self.passed: list[str] = []

    def pytest_collection_finish(self, session):
        self.collected = len(session.items)

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.append(report.nodeid)
        elif report.skipped:
            self.skipped.append(report.nodeid)
        elif report.when == "call":
            self.passed.append(report.nodeid)


def _rank() -> int:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def main() -> int:
    outdir, args = sys.argv[1], sys.argv[2:]
    rank = _rank()
    fd = os.open(os.path.join(outdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # As `python -m pytest` does: the working directory (the repository) goes first
    # on sys.path, not this script's directory.
    sys.path[0] = os.getcwd()
    import pytest

    tally = Tally()
    code = int(pytest.main(args, plugins=[tally]))
    summary = {"rank": rank, "host": socket.gethostname(), "exit": code,
               "collected": tally.collected, "passed": tally.passed,
               "failed": tally.failed, "skipped": tally.skipped}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(summary, f)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
