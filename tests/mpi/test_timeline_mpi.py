"""The ranks' side of a trace (spmd.launch.timeline.clock, the collectives' spans, the
wrapper's start and ends), read back from each rank's spool file.

Single-process tests: each starts a small job under the venv's mpiexec with a time
limit, its ranks run by ``python -m spmd.launch._rank`` (the wrapper ``spmd-run``
starts) with ``SPMD_TRACE_DIR`` set, as ``spmd-run --trace`` sets it.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import PSUM_JOB, mpiexec_or_skip, run_command  # noqa: E402

from spmd.launch.timeline import recorder  # noqa: E402

SKEW = 0.3
ALIGNED_S = 0.002  # the bound on the alignment


def _traced(script: str, n: int, tmp_path, env=None, timeout: float = 120):
    """Run ``script`` on ``n`` ranks through the wrapper, recording into a spool:
    ``(status, output, {rank: its part})``."""
    exe = mpiexec_or_skip()
    path = tmp_path / "job.py"
    path.write_text(script)
    spool = tmp_path / "spool"
    status, out, _ = run_command(
        [exe, "-n", str(n), sys.executable, "-m", "spmd.launch._rank", path],
        env={"SPMD_TRACE_DIR": str(spool), **(env or {})}, timeout=timeout)
    parts = {}
    for name in sorted(os.listdir(spool)) if spool.is_dir() else []:
        part = recorder.read_part(str(spool / name))
        parts[part["meta"]["rank"]] = part
    return status, out, parts


def _collectives(part) -> list[tuple]:
    return [e for e in part["events"] if e[0] == "X" and e[2] == "collective"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 4])
def test_the_alignment_recovers_each_ranks_skew(tmp_path, n):
    script = "print('ran', flush=True)\n"
    status, out, parts = _traced(script, n, tmp_path, env={"SPMD_TRACE_TEST_SKEW": str(SKEW)})
    assert status == 0, out
    assert sorted(parts) == list(range(n)), out
    for k, part in parts.items():
        meta = part["meta"]
        assert abs(meta["offset"] - SKEW * k) < ALIGNED_S, (k, meta)
        assert 0 <= meta["error"] < ALIGNED_S, (k, meta)


@pytest.mark.timeout(200)
def test_align_over_a_communicator_of_its_own(tmp_path):
    # clock.align alone, with a clock of the caller's: rank k's runs 0.25 * k s ahead
    script = textwrap.dedent("""
        import time
        from mpi4py import MPI
        from spmd.launch.timeline import clock
        comm = MPI.COMM_WORLD.Dup()
        me = comm.Get_rank()
        offset, error = clock.align(comm, rounds=10, now=lambda: time.monotonic() + 0.25 * me)
        # (a file per rank: the ranks' lines on one stdout can interleave)
        with open(f"OUT/aligned-{me}", "w") as f:
            f.write(f"ALIGNED {me} {offset!r} {error!r}")
    """)
    exe = mpiexec_or_skip()
    path = tmp_path / "job.py"
    path.write_text(script.replace("OUT", str(tmp_path)))
    status, out, _ = run_command([exe, "-n", "3", sys.executable, path], timeout=120)
    assert status == 0, out
    found = {int(w[1]): (float(w[2]), float(w[3]))
             for w in (f.read_text().split() for f in tmp_path.glob("aligned-*"))}
    assert sorted(found) == [0, 1, 2], out
    for k, (offset, error) in found.items():
        assert abs(offset - 0.25 * k) < ALIGNED_S and error < ALIGNED_S, (k, offset, error)


def test_align_needs_a_clock():
    from spmd.launch.timeline import clock

    assert recorder.ACTIVE is None
    with pytest.raises(RuntimeError, match="no trace is being recorded"):
        clock.align(None)
    with pytest.raises(ValueError, match="rounds=0 must be at least 1"):
        clock.align(None, rounds=0)


_STEPS = PSUM_JOB + textwrap.dedent("""
    x = np.ones(spmd.device_count() * 4, np.float32)
    for i in range(6):
        step(x)
    print(f"rank {me}: steps done", flush=True)
""")


@pytest.mark.timeout(200)
def test_each_collective_is_a_span_with_its_communicator_and_number(tmp_path):
    status, out, parts = _traced(_STEPS, 3, tmp_path)
    assert status == 0, out
    spans = {k: _collectives(p) for k, p in parts.items()}
    assert sorted(spans) == [0, 1, 2], out
    for k, mine in spans.items():
        psums = [e for e in mine if e[1] == "psum"]
        assert len(psums) == 6, mine
        for e in psums:
            _, name, cat, t0, t1, tid, args = e
            assert t0 <= t1 and tid == k  # (one device a rank: its first device is k)
            assert args["comm"] == "0,1,2" and args["op"] == "psum"
            assert args["bytes"] == 16  # (this member's 4 float32)
        assert [e[6]["seq"] for e in psums] == sorted(e[6]["seq"] for e in psums)
    # the same numbers on every member, in the same order
    seqs = {k: [e[6]["seq"] for e in mine] for k, mine in spans.items()}
    assert seqs[0] == seqs[1] == seqs[2], seqs


@pytest.mark.timeout(200)
def test_a_rank_that_raises_leaves_what_it_recorded(tmp_path):
    script = _STEPS + textwrap.dedent("""
        if me == 1:
            raise RuntimeError("boom after the steps")
        step(x)
    """)
    # (the others wait in a psum for rank 1: mpiexec ends them when rank 1 dies; the
    # collective deadline ends them if it does not, so the job always ends)
    status, out, parts = _traced(script, 3, tmp_path, env={"SPMD_COLLECTIVE_TIMEOUT": "20"})
    assert status not in (0, None), out
    assert "boom after the steps" in out, out
    assert len([e for e in _collectives(parts[1]) if e[1] == "psum"]) >= 6, parts[1]


@pytest.mark.timeout(200)
def test_a_non_zero_exit_leaves_what_it_recorded(tmp_path):
    script = _STEPS + "sys.exit(3)\n"
    status, out, parts = _traced(script, 2, tmp_path)
    assert status == 3, out
    for k in (0, 1):
        assert len([e for e in _collectives(parts[k]) if e[1] == "psum"]) == 6, parts[k]


@pytest.mark.timeout(200)
def test_the_buffer_is_bounded_and_counts_what_it_dropped(tmp_path):
    script = _STEPS.replace("range(6)", "range(40)")
    status, out, parts = _traced(script, 2, tmp_path, env={"SPMD_TRACE_EVENTS": "10"})
    assert status == 0, out
    for part in parts.values():
        assert len(part["events"]) == 10 and part["meta"]["recorded"] == 10, part["meta"]
        assert part["meta"]["dropped"] >= 30, part["meta"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_event_count_is_named(tmp_path, value):
    status, out, parts = _traced("print('ran')\n", 2, tmp_path,
                                 env={"SPMD_TRACE_EVENTS": value})
    assert status not in (0, None), out
    assert f"SPMD_TRACE_EVENTS={value!r} is not a positive integer" in out, out
    assert "ran" not in out.split(), out



@pytest.mark.timeout(200)
def test_every_kind_of_data_collective_is_a_span_and_control_traffic_is_not(tmp_path):
    # the backend's calls directly, a started all-reduce and exchange included (their
    # start and their wait: two spans each); bytes: this member's operand
    script = textwrap.dedent("""
        import numpy as np
        import spmd
        from spmd.collectives import mpi
        me, ranks = spmd.process_index(), (0, 1)
        x = np.arange(8, dtype=np.float32)
        mpi.allreduce(x, ranks, "sum", "psum")
        mpi.allgather(x, ranks, "all_gather")
        mpi.allgather(x, ranks, "agreement", control=True)
        mpi.reduce_scatter(x.reshape(2, 4), ranks, "sum", "psum_scatter")
        mpi.alltoall(x.reshape(2, 4), ranks, "all_to_all")
        mpi.sendrecv(x, ranks, 1 - me, 1 - me, "ppermute")
        mpi.iallreduce(x, ranks, "sum", "psum").wait()
        mpi.isendrecv(x[:2], ranks, 1 - me, 1 - me, "ppermute").wait()
    """)
    status, out, parts = _traced(script, 2, tmp_path)
    assert status == 0, out
    for k in (0, 1):
        got = [(e[1], e[6]["seq"], e[6]["bytes"]) for e in _collectives(parts[k])]
        assert got == [("psum", 1, 32), ("all_gather", 2, 32), ("psum_scatter", 3, 32),
                       ("all_to_all", 4, 32), ("ppermute", 5, 32), ("psum", 6, 32),
                       ("psum", 7, 32), ("ppermute", 8, 8), ("ppermute", 9, 8)], got
