"""What ``@pytest.mark.spmd(processes=2)`` costs (issue 27): whole pytest sessions, as a
user runs them (``python -m pytest -q`` in a subprocess, interpreter start included),
over generated files of trivial tests:

- ``pytest session[K tests]``: K tests that each assert ``1 + 1 == 2``, plain
  (``single-process``, the baseline) against marked ``@pytest.mark.spmd(processes=2)``
  (``2 ranks``: a pool of two rank workers started once, each test an inner pytest run
  on both ranks); goal: the marked session at most a few seconds longer
  (``extra seconds`` row, <= 5 s for K = 100);
- ``pool start-up``: a session of one marked test less a session of one plain test
  (spmd's import in the pytest process, MPI's start, the ranks' imports, their first
  pytest run).  The extra seconds less the start-up is what the other 99 tests cost
  together (sessions differ by a few tenths of a second from run to run, more than a
  trivial test costs, so no per-test row is derived).

Sessions alternate (plain, marked, plain, ...).  ``--quick``: K = 20, 1 round.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import row

ROUNDS, TESTS = 3, 100


def skip_reason() -> str | None:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if shutil.which("mpiexec") is None and not os.path.exists(mpiexec):
        return "needs MPI (the mpich wheel: make venv)"
    return None


def _files(folder: str, k: int) -> None:
    body = "".join(f"def test_{i}():\n    assert 1 + 1 == 2\n\n\n" for i in range(k))
    with open(os.path.join(folder, "test_plain.py"), "w") as f:
        f.write(body)
    with open(os.path.join(folder, "test_marked.py"), "w") as f:
        f.write("import pytest\n\n\n" + body.replace(
            "def test_", "@pytest.mark.spmd(processes=2)\ndef test_"))


def _session(folder: str, target: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           target], cwd=folder, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"bench_testing: pytest {target} failed:\n{done.stdout[-3000:]}")
    return seconds


def run(quick: bool = False) -> list[dict]:
    rounds, k = (1, 20) if quick else (ROUNDS, TESTS)
    folder = tempfile.mkdtemp(prefix="bench-testing-")
    try:
        _files(folder, k)
        t = {"plain": [], "marked": [], "plain1": [], "marked1": []}
        for _ in range(rounds):
            t["plain"].append(_session(folder, "test_plain.py"))
            t["marked"].append(_session(folder, "test_marked.py"))
            t["plain1"].append(_session(folder, "test_plain.py::test_0"))
            t["marked1"].append(_session(folder, "test_marked.py::test_0"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    name = f"pytest session[{k} tests]"
    extra = [m - p for m, p in zip(t["marked"], t["plain"])]
    startup = [m - p for m, p in zip(t["marked1"], t["plain1"])]
    return [
        row(name, "single-process", t["plain"], unit="s"),
        row(name, "2 ranks, @pytest.mark.spmd", t["marked"], baseline="single-process",
            unit="s"),
        row(f"extra seconds of {k} marked tests", "2 ranks", extra, unit="s",
            goal_max_s=5.0 if k == TESTS else None),
        row("pool start-up", "2 ranks", startup, unit="s"),
    ]
