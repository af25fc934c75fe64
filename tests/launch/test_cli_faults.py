"""``spmd-run`` and ranks that end early or violently (spmd.launch.job, .summary).

Single-process tests: each launches a small job with ``python -m spmd.launch``
under a time limit (the job's whole process group is killed past it), with the
default collective deadline (600 s), so that what ends these jobs within seconds
is the launcher's own detection.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import PSUM_JOB, run_spmd_run  # noqa: E402

from spmd.launch import job, summary  # noqa: E402

_HEADER = PSUM_JOB + textwrap.dedent("""
    x = np.ones(spmd.device_count(), np.float32)
    step(x)
    print(f"rank {me}: first psum done", flush=True)
""")


def _launch(script: str, n: int, tmp_path, timeout: float = 90):
    # the default deadline (600 s): spmd-run must end the job long before it
    return run_spmd_run(script, n, tmp_path, env={"SPMD_COLLECTIVE_TIMEOUT": ""},
                        timeout=timeout)


@pytest.mark.timeout(150)
def test_a_rank_that_finishes_while_the_others_wait_for_it_ends_the_job(tmp_path):
    script = _HEADER + textwrap.dedent("""
        if me == 1:
            sys.exit(0)  # finishes: the others' next psum needs it
        step(x)
        print(f"rank {me}: second psum done", flush=True)
    """)
    status, out, seconds = _launch(script, 3, tmp_path)
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status == 1, out
    assert out.count("first psum done") == 3 and "second psum done" not in out, out
    assert "spmd-run: rank 1 finished while ranks 0, 2 wait for it in psum (program jit(step), " \
           "equation `" in out, out
    assert seconds < 40, f"took {seconds:.0f}s (the deadline is 600s):\n{out}"


@pytest.mark.timeout(150)
def test_a_rank_that_finishes_while_the_others_compute_is_fine(tmp_path):
    script = _HEADER + textwrap.dedent("""
        if me != 1:
            time.sleep(4)  # work of their own, no collective that needs rank 1
            print(f"rank {me}: local work done {float(np.sum(x))}", flush=True)
    """)
    status, out, seconds = _launch(script, 3, tmp_path)
    assert status == 0, out
    assert out.count("local work done 3.0") == 2, out
    assert "finished while" not in out, out


@pytest.mark.timeout(150)
def test_a_rank_killed_by_a_signal_is_named_with_its_signal(tmp_path):
    script = _HEADER + textwrap.dedent("""
        if me == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        step(x)
    """)
    status, out, seconds = _launch(script, 3, tmp_path)
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    # Rank 2 alone, or with the ranks mpiexec's cleanup ended with the same signal at
    # the same moment (which came first cannot always be told: spmd.launch.job).
    assert ("spmd-run: rank 2 of 3 was killed by SIGKILL" in out
            or any(f"spmd-run: ranks {r} of 3 were killed by SIGKILL" in out
                   for r in ("0,2", "1-2", "0-2"))), out
    assert "which came first cannot be told" in out or "rank 2 of 3 was killed" in out, out
    assert status == 128 + 9, out
    assert "no rank reported an error from Python" not in out, out
    assert seconds < 40, f"took {seconds:.0f}s:\n{out}"


# ------------------------------------------------------------ the pieces

def test_mpich_says_which_rank_a_signal_killed():
    banner = b"""
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 10084 RUNNING AT vm
=   EXIT CODE: 9
===================================================================================
[mpiexec@vm] Exit codes: [vm] 0,9,0 [node2] 0
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
"""
    found: dict = {}
    for line in banner.splitlines(keepends=True):
        job._parse_banner(line, found)
    assert found == {"codes": [0, 9, 0, 0], "signal": 9, "pid": 10084, "host": "vm", "exit": 9}
    ordinary: dict = {}
    job._parse_banner(b"[0] rank 0: loss 0.25 (signal 3 of 4 PID 12)\n", ordinary)
    assert ordinary == {}


def test_the_stranded_summary_groups_the_waiting_ranks():
    waits = {r: {"rank": r, "ranks": [0, 1, 2, 3], "what": "psum",
                 "where": "program jit(step), equation `b = psum a`"} for r in (0, 2, 3)}
    text = summary.stranded_summary(4, [1], waits)
    assert text.splitlines()[0] == (
        "spmd-run: rank 1 finished while ranks 0, 2, 3 wait for it in psum (program jit(step), "
        "equation `b = psum a`); the job of 4 ranks was ended")
    text = summary.stranded_summary(4, [1, 3], {0: waits[0], 2: waits[2]})
    assert text.startswith("spmd-run: ranks 1, 3 finished while ranks 0, 2 wait for them in psum")


def test_a_killed_rank_is_named_in_the_failure_summary():
    text, status = summary.failure_summary(4, {}, 9, {}, {2: 9})
    assert text.splitlines()[0].startswith("spmd-run: rank 2 of 4 was killed by SIGKILL")
    assert "ranks 0-1,3: no result" in text and status == 137
