"""The checking mode, ``SPMD_CHECK_COLLECTIVES=1``: every collective is compared across
its ranks (its sequence number and equation) before its data moves.

Single-process tests that launch small MPI jobs of their own, under a time limit:
a rank out of step cannot run inside the shared test job.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import PSUM_JOB, run_spmd_run  # noqa: E402

from spmd.collectives.mpi import control as mpi_control  # noqa: E402
from spmd.errors import ArgumentError  # noqa: E402

_CHECK = {"SPMD_CHECK_COLLECTIVES": "1", "SPMD_COLLECTIVE_TIMEOUT": "60"}

# Rank 0 runs an agreed program once more than the others, who go on to another
# agreed program with the same collective on the same shapes: unchecked, rank 0's
# extra psum pairs with their `double` psum and every rank computes a wrong number.
_OUT_OF_STEP = PSUM_JOB + textwrap.dedent("""
    def double(b):
        return lax.psum(b * 2, "i")

    double = spmd.jit(spmd.shard_map(double, mesh=mesh, in_specs=P("i"), out_specs=P()))
    x = np.ones(spmd.device_count(), np.float32)
    print(f"rank {me}: warm", step(x)[0], double(x)[0], flush=True)
    if me == 0:
        print("rank 0: extra step", step(x)[0], flush=True)
    print(f"rank {me}: double", double(x)[0], flush=True)
""")


@pytest.mark.timeout(120)
def test_a_rank_out_of_step_is_a_program_mismatch_at_once_not_a_wrong_number(tmp_path):
    status, out, seconds = run_spmd_run(_OUT_OF_STEP, 2, tmp_path, env=_CHECK)
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert out.count("warm 2.0 4.0") == 2, out
    assert status == 1, out
    assert "extra step 3.0" not in out and "double 3.0" not in out, out
    assert "ProgramMismatchError: the ranks [0, 1] issue different collectives at the same " \
           "point (SPMD_CHECK_COLLECTIVES=1" in out, out
    assert "rank 0: collective #3: psum in program jit(step), equation `" in out, out
    assert "rank 1: collective #3: psum in program jit(double), equation `" in out, out
    assert seconds < 40, f"took {seconds:.0f}s (the deadline is 60s):\n{out}"


def test_unchecked_the_same_fault_is_a_silent_wrong_number(tmp_path):
    """Why the checking mode exists (a known limit of the unchecked default: the
    fingerprints are agreed once per program, not per call)."""
    status, out, seconds = run_spmd_run(_OUT_OF_STEP, 2, tmp_path,
                                        env={"SPMD_COLLECTIVE_TIMEOUT": "20"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert "rank 0: extra step 3.0" in out, out  # 1 + 2: rank 1's `double` block
    assert "rank 1: double 3.0" in out, out


# Rank 1 goes on to a new program (its first call agrees on it over the control
# communicator) while rank 0 is in one more data collective.
_EXTRA_THEN_NEW = PSUM_JOB + textwrap.dedent("""
    x = np.ones(spmd.device_count(), np.float32)
    step(x)
    if me == 0:
        step(x)
    other = spmd.jit(spmd.shard_map(lambda b: lax.psum(b * 3, "i"), mesh=mesh,
                                    in_specs=P("i"), out_specs=P()))
    print(f"rank {me}: tripled", other(x), flush=True)
""")


@pytest.mark.timeout(120)
def test_a_data_collective_against_another_ranks_agreement_is_a_mismatch(tmp_path):
    status, out, seconds = run_spmd_run(_EXTRA_THEN_NEW, 2, tmp_path, env=_CHECK)
    assert status == 1, f"status {status} after {seconds:.0f}s:\n{out}"
    assert "rank 0: collective #2: psum in program jit(step)" in out, out
    assert ("rank 1: the first call of jit(<lambda>) (agreeing on the program), after "
            "collective #1") in out, out
    assert "tripled [" not in out, out
    assert seconds < 40, f"took {seconds:.0f}s:\n{out}"


# A correct program runs the same with and without the checks.
_GOOD = PSUM_JOB + textwrap.dedent("""
    import threading
    x = np.arange(spmd.device_count(), dtype=np.float32) + 1
    total = [float(step(x)[0]) for _ in range(3)]
    got = []
    t = threading.Thread(target=lambda: got.append(float(step(x)[0])), name="worker")
    t.start(); t.join()
    print(f"rank {me}: sums", total + got, spmd.process_allgather(
        spmd.device_put(x, spmd.NamedSharding(mesh, P("i")))).tolist(), flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("check", ["1", "0"])
def test_a_correct_program_runs_alike_checked_or_not(tmp_path, check):
    status, out, seconds = run_spmd_run(_GOOD, 2, tmp_path,
                                        env={"SPMD_CHECK_COLLECTIVES": check})
    assert status == 0, out
    assert out.count("sums [3.0, 3.0, 3.0, 3.0] [1.0, 2.0]") == 2, out


_DISAGREE = textwrap.dedent("""
    import os
    import numpy as np
    import spmd
    from spmd.collectives import mpi
    if spmd.process_index() == 0:
        os.environ["SPMD_CHECK_COLLECTIVES"] = {value!r}
    try:
        mpi.allreduce(np.ones(2, np.float32), (0, 1), "sum", what="psum")
    except ValueError as e:
        print(f"rank {spmd.process_index()}: {type(e).__name__}: {e}", flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["1", "maybe"])
def test_ranks_that_disagree_on_the_checking_mode_all_raise(tmp_path, value):
    # One rank checking and another not would pair a check with data: a hang; a bad
    # value on one rank alone must not leave the other waiting either.
    status, out, seconds = run_spmd_run(_DISAGREE.replace("{value!r}", repr(value)), 2,
                                        tmp_path, env={"SPMD_COLLECTIVE_TIMEOUT": "30"})
    assert status == 0, out
    assert out.count("ArgumentError: the MPI ranks [0, 1] read different or invalid collective "
                     "settings") == 2, out
    if value == "1":
        assert "check = True" in out and "check = False" in out, out
    else:
        assert "SPMD_CHECK_COLLECTIVES='maybe' is not a switch" in out, out
    assert "SPMD_CHECK_COLLECTIVES" in out and seconds < 25, out


def test_a_bad_checking_setting_names_the_variable(monkeypatch):
    try:
        monkeypatch.setenv("SPMD_CHECK_COLLECTIVES", "maybe")
        mpi_control.reset_checking()
        with pytest.raises(ArgumentError, match="SPMD_CHECK_COLLECTIVES='maybe' is not a switch; "
                                                "set it to 1"):
            mpi_control.checking()
        for raw, on in (("1", True), ("0", False), ("", False), ("on", True)):
            monkeypatch.setenv("SPMD_CHECK_COLLECTIVES", raw)
            mpi_control.reset_checking()
            assert mpi_control.checking() is on
    finally:
        monkeypatch.delenv("SPMD_CHECK_COLLECTIVES", raising=False)
        mpi_control.reset_checking()
