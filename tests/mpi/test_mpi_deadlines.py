"""Collective deadlines and the control communicator (spmd.collectives.mpi.control).

Single-process tests: each launches a small MPI job of its own (an extra or a
missing collective on one rank cannot run inside the shared 4-rank test job: it
would pair with the next test's collectives), with a short
``SPMD_COLLECTIVE_TIMEOUT`` and a time limit on the whole job.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import PSUM_JOB, run_mpi, run_spmd_run  # noqa: E402

from spmd.collectives.mpi import control as mpi_control  # noqa: E402

_HEADER = PSUM_JOB + "x = np.arange(spmd.device_count(), dtype=np.float32) + 1\n"


# ------------------------------------------------------------ the deadline setting

def test_the_default_deadline_is_600s_and_the_variable_overrides_it(monkeypatch):
    try:
        monkeypatch.delenv("SPMD_COLLECTIVE_TIMEOUT", raising=False)
        mpi_control.reset_timeout()
        assert mpi_control.timeout_s() == mpi_control.DEFAULT_TIMEOUT_S == 600.0
        monkeypatch.setenv("SPMD_COLLECTIVE_TIMEOUT", "2.5")
        mpi_control.reset_timeout()
        assert mpi_control.timeout_s() == 2.5
        monkeypatch.setenv("SPMD_COLLECTIVE_TIMEOUT", "0")
        mpi_control.reset_timeout()
        assert mpi_control.timeout_s() is None  # 0 disables it
        for bad in ("soon", "-3", "nan"):
            monkeypatch.setenv("SPMD_COLLECTIVE_TIMEOUT", bad)
            mpi_control.reset_timeout()
            with pytest.raises(ValueError, match=f"SPMD_COLLECTIVE_TIMEOUT='{bad}'.*0 to wait"):
                mpi_control.timeout_s()
    finally:
        mpi_control.reset_timeout()


# ------------------------------------------------- item: an extra collective on one rank

_EXTRA_PSUM = _HEADER + textwrap.dedent("""
    print(f"rank {me}: first psum = {step(x)[0]}", flush=True)
    if me == 1:
        y = step(x)  # one psum more than the others
        print("rank 1: extra psum " + "returned", y, flush=True)
    # The others go on to a new program: its fingerprint exchange is control traffic.
    other = spmd.jit(spmd.shard_map(lambda b: lax.all_gather(b, "i", tiled=True), mesh=mesh,
                                    in_specs=P("i"), out_specs=P("i")))
    print(f"rank {me}: all_gather " + "returned", other(x), flush=True)
""")


@pytest.mark.timeout(120)
def test_an_extra_psum_on_one_rank_is_an_error_not_another_collectives_data(tmp_path):
    status, out, seconds = run_mpi(_EXTRA_PSUM, 3, tmp_path, timeout=90,
                                   env={"SPMD_COLLECTIVE_TIMEOUT": "3"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status != 0, out
    assert out.count("first psum = 6.0") == 3, out
    # Before the control communicator, rank 1's Allreduce paired with the others'
    # fingerprint Allgather and returned garbage such as -5.8e+32.
    assert "extra psum returned" not in out and "all_gather returned" not in out, out
    assert "CollectiveTimeoutError" in out, out
    assert "psum over ranks [0, 1, 2] did not complete within 3s" in out or \
        "the first call of jit(<lambda>) over ranks [0, 1, 2] did not complete" in out, out
    assert "never arrived" in out, out
    assert seconds < 60, f"took {seconds:.0f}s:\n{out}"


# ------------------------------------------------------ item: the deadline's report

_LATE_RANK = _HEADER + textwrap.dedent("""
    step(x)
    print(f"rank {me}: first psum done", flush=True)
    if me == 2:
        time.sleep(60)  # computes past the others' deadline
    step(x)
    print(f"rank {me}: second psum done", flush=True)
""")


@pytest.mark.timeout(150)
def test_the_deadline_names_program_equation_call_and_the_ranks_that_never_arrived(tmp_path):
    status, out, seconds = run_spmd_run(_LATE_RANK, 3, tmp_path,
                                     env={"SPMD_COLLECTIVE_TIMEOUT": "3"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status != 0, out
    assert "second psum done" not in out, out
    # spmd-run's summary names the rank that reported the deadline and what it says.
    summary = out[out.index("spmd-run:"):]
    assert "CollectiveTimeoutError" in summary, out
    # Ranks 0 and 1 both wait: one of them, or both, report it.
    reporter = next(r for r in (0, 1) if f"rank {r}: psum over ranks [0, 1, 2]" in summary)
    assert f"rank {reporter} of 3 failed" in summary or "ranks 0-1 of 3 failed" in summary, out
    assert "did not complete within 3s (SPMD_COLLECTIVE_TIMEOUT=3)" in summary, out
    assert "program jit(step)" in summary and "psum[" in summary, out
    assert "call 2 of it; collective #2 over these ranks" in summary, out
    assert "ranks that never arrived: [2]" in summary, out
    assert f"ranks waiting in it too: [{1 - reporter}]" in summary, out
    # Rank 2 answers from its watchdog thread: it runs Python (time.sleep) in the script.
    assert "rank 2: never arrived (its last collective over these ranks was #1); it is in no " \
           "collective; it runs Python at " in summary and "job.py:" in summary, out
    assert "reported a collective deadline" in summary, out
    assert "in <module>" in summary and "step(x)" in summary, out  # the reporter's stack
    assert seconds < 45, f"took {seconds:.0f}s:\n{out}"


_ELSEWHERE = _HEADER + textwrap.dedent("""
    # Ranks 1 and 2 also share a mesh of their own.
    pair = spmd.Mesh(np.array(spmd.devices()[1:], dtype=object), ("j",))
    pair_sum = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "j"), mesh=pair,
                                       in_specs=P("j"), out_specs=P()))
    step(x)
    if me > 0:
        pair_sum(x[:2])
    print(f"rank {me}: warm", flush=True)
    if me == 0:
        step(x)                 # waits for ranks 1 and 2 ...
    elif me == 1:
        time.sleep(1.5)
        pair_sum(x[:2])         # ... which wait for each other elsewhere,
    else:
        time.sleep(60)          # or compute
""")


@pytest.mark.timeout(150)
def test_the_deadline_says_where_the_missing_ranks_wait(tmp_path):
    status, out, seconds = run_spmd_run(_ELSEWHERE, 3, tmp_path,
                                     env={"SPMD_COLLECTIVE_TIMEOUT": "3"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status != 0 and out.count("warm") == 3, out
    summary = out[out.index("spmd-run:"):]
    assert "rank 0 of 3 failed" in summary, out
    assert "rank 0: psum over ranks [0, 1, 2] did not complete within 3s" in summary, out
    assert "ranks that never arrived: [1, 2]" in summary, out
    assert ("rank 1: never arrived (its last collective over these ranks was #1); it waits "
            "in psum over ranks [1, 2] (collective #2 there; program jit(<lambda>)") in summary, out
    assert "rank 2: never arrived (its last collective over these ranks was #1); it is in no " \
           "collective; it runs Python at " in summary, out
    assert seconds < 45, f"took {seconds:.0f}s:\n{out}"


# ------------------------------------- item: a hang inside an overlapped bucket's wait

_LATE_IN_OVERLAP = PSUM_JOB + textwrap.dedent("""
    import spmd.numpy as snp

    def body(a, w):
        g2 = snp.tanh(a @ w)
        s2 = lax.psum(g2, "i")          # started here, without waiting ...
        g1 = snp.tanh(g2 @ w) @ w       # ... while this runs
        return s2 * 2, lax.psum(g1, "i")

    grads = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=(P("i"), P()),
                                    out_specs=(P(), P()), check_vma=False))
    a = np.ones((3 * spmd.device_count(), 4), np.float32)
    w = np.eye(4, dtype=np.float32)
    text = grads.lower(a, w).as_text(executed=True)
    print(f"rank {me}: overlapped {text.count('collective_start[')}", flush=True)
    grads(a, w)
    print(f"rank {me}: first step done", flush=True)
    if me == 2:
        time.sleep(60)  # computes past the others' deadline: they wait in a bucket
    grads(a, w)
    print(f"rank {me}: second step done", flush=True)
""")


@pytest.mark.timeout(150)
def test_a_hang_inside_an_overlapped_buckets_wait_gets_the_deadline_report(tmp_path):
    status, out, seconds = run_spmd_run(_LATE_IN_OVERLAP, 3, tmp_path,
                                        env={"SPMD_COLLECTIVE_TIMEOUT": "3",
                                             "SPMD_OVERLAP_BUCKET_BYTES": "64"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status != 0, out
    assert out.count("overlapped 2") == 3 and out.count("first step done") == 3, out
    assert "second step done" not in out, out
    summary = out[out.index("spmd-run:"):]
    assert "CollectiveTimeoutError" in summary, out
    assert "psum over ranks [0, 1, 2] did not complete within 3s" in summary, out
    assert "program jit(body)" in summary, out
    assert "ranks that never arrived: [2]" in summary, out
    assert "rank 2: never arrived" in summary and "it runs Python at " in summary, out
    assert "in wait" in out, out  # the waiting thread's stack: the request's wait
    assert seconds < 45, f"took {seconds:.0f}s:\n{out}"
