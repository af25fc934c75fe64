"""``spmd-run --max-restarts N``: a job whose ranks fail is started again, up to N
times, with the attempt in the environment; and the transformer example resumes
from its latest checkpoint by itself, to the loss of an uninterrupted run.

The jobs are small and run under ``python -m spmd.launch`` with a time limit
(the whole process group is killed past it).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import textwrap
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.launch.jobs import HEADER, Launch, reported, still_there  # noqa: E402
from tests.mpi import REPO_ROOT  # noqa: E402

from spmd.launch import cli  # noqa: E402

SCRIPT = str(REPO_ROOT / "examples" / "train_transformer.py")
# A small model (as in tests/test_train_transformer.py): 60 steps on 4 ranks in ~10 s.
SMALL = ["--d-model", "32", "--heads", "4", "--layers", "2", "--context", "16", "--batch", "8",
         "--mesh", "data=2,model=2", "--sample", "0"]

_ATTEMPT = HEADER + textwrap.dedent("""
    attempt = int(os.environ["SPMD_RESTART_ATTEMPT"])
    print(f"rank {me}: attempt {attempt} of max {os.environ['SPMD_MAX_RESTARTS']} restarts",
          flush=True)
    if me == 1 and attempt < int(os.environ.get("FAIL_ATTEMPTS", "99")):
        os.kill(os.getpid(), signal.SIGKILL)
    step(x)
    print(f"rank {me}: done", flush=True)
""")


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_max_restarts_must_be_a_non_negative_integer(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["-n", "2", "--max-restarts", value, "train.py"])
    assert e.value.code == cli.USAGE_ERROR
    err = capsys.readouterr().err
    assert "argument --max-restarts: expected a non-negative integer" in err, err
    assert repr(value) in err, err
    assert cli.parse_args(["-n", "2", "--max-restarts", "0", "t.py"]).max_restarts == 0
    assert cli.parse_args(["-n", "2", "t.py"]).max_restarts == 0


def test_each_attempt_sees_its_number():
    ns = cli.parse_args(["-n", "2", "--max-restarts", "3", "t.py"])
    env = cli.build_env(ns, "/tmp/x", environ={}, attempt=2)
    assert (env["SPMD_RESTART_ATTEMPT"], env["SPMD_MAX_RESTARTS"]) == ("2", "3")
    env = cli.build_env(cli.parse_args(["-n", "2", "t.py"]), "/tmp/x", environ={})
    assert (env["SPMD_RESTART_ATTEMPT"], env["SPMD_MAX_RESTARTS"]) == ("0", "0")


@pytest.mark.timeout(200)
def test_a_failed_job_is_restarted_until_it_succeeds(tmp_path):
    job = Launch(_ATTEMPT, 2, tmp_path, options=["--max-restarts", "2"],
                  env={"FAIL_ATTEMPTS": "1"})
    status = job.wait(150)
    out = job.out
    assert status == 0, out
    assert out.count("attempt 0 of max 2 restarts") == 2, out
    assert out.count("attempt 1 of max 2 restarts") == 2, out
    assert "attempt 2 of max" not in out and out.count(": done") == 2, out
    # The failed attempt's summary, then the restart.
    # (Rank 1, or ranks 0-1 when mpiexec ended rank 0 with the same signal at once.)
    first = out.index(" of 2 was killed by SIGKILL" if " of 2 was killed by" in out
                      else "spmd-run: ranks 0-1 of 2 were killed by SIGKILL")
    assert out.index("spmd-run: restarting the job (attempt 2 of 3)") > first, out
    assert out.count("restarting the job") == 1, out
    assert not still_there(reported(out)), out  # both attempts' segments


@pytest.mark.timeout(200)
def test_the_last_attempts_status_is_the_jobs(tmp_path):
    job = Launch(_ATTEMPT, 2, tmp_path, options=["--max-restarts", "1"])
    status = job.wait(150)
    out = job.out
    assert status == 128 + signal.SIGKILL, out
    assert out.count(" killed by SIGKILL (no Python error") == 2, out
    assert out.count("restarting the job (attempt 2 of 2)") == 1, out
    assert "attempt 3" not in out, out
    assert not still_there(reported(out)), out


@pytest.mark.timeout(120)
def test_a_timeout_is_not_restarted(tmp_path):
    job = Launch(HEADER + "time.sleep(60)\n", 2, tmp_path,
                  options=["--max-restarts", "2", "--timeout", "6"])
    status = job.wait(100)
    assert status == cli.TIMED_OUT, job.out
    assert "did not finish within --timeout 6s" in job.out
    assert "restarting" not in job.out, job.out


@pytest.mark.timeout(120)
def test_sigterm_to_the_launcher_is_not_restarted(tmp_path):
    job = Launch(HEADER + "time.sleep(60)\n", 2, tmp_path, options=["--max-restarts", "2"])
    assert job.wait_for("SEGMENTS ", 2, 90), job.out
    job.proc.send_signal(signal.SIGTERM)
    status = job.wait(60)
    assert status == 128 + signal.SIGTERM, job.out
    assert "received SIGTERM; ending the job" in job.out and "restarting" not in job.out, \
        job.out
    assert not still_there(reported(job.out)), job.out


# ------------------------------------------------------ the transformer example

def _final(stats: str) -> float:
    with open(f"{stats}.rank0.json") as f:
        return json.load(f)["final_loss"]


def _printed_final(out: str) -> str:
    lines = [ln for ln in out.splitlines() if "final loss" in ln]
    assert len(lines) == 1, out[-3000:]
    return lines[0].split("final loss", 1)[1].strip()


@pytest.mark.timeout(400)
def test_transformer_killed_mid_run_resumes_to_the_same_final_loss(tmp_path):
    """Bit for bit, with compiled loops off: they take over at a process's fifth call
    of a program (spmd/compiler/engine/loops.py), so a resumed run computes its first four
    steps after the restore with numpy's rounding where the uninterrupted run used the
    loops' (docs/performance.md); the restored state itself is exact."""
    common = SMALL + ["--steps", "60", "--save-every", "10", "--log-every", "1"]
    exact = {"SPMD_COMPILE_KERNELS": "0"}
    # The uninterrupted run.
    ref = Launch(None, 4, tmp_path, script_path=SCRIPT, options=[], env=exact,
                  args=common + ["--ckpt-dir", str(tmp_path / "ck_whole"),
                                 "--stats", str(tmp_path / "whole")])
    assert ref.wait(200) == 0, ref.out[-4000:]
    # The same run with rank 1 killed once rank 0 has printed step 25.
    launch_dirs = tmp_path / "launch"
    launch_dirs.mkdir()
    start = time.monotonic()
    run = Launch(None, 4, tmp_path, script_path=SCRIPT, options=["--max-restarts", "2"],
                  args=common + ["--ckpt-dir", str(tmp_path / "ck"),
                                 "--stats", str(tmp_path / "killed")],
                  env={"TMPDIR": str(launch_dirs), **exact})
    try:
        assert run.wait_for("] step 25 loss", 1, 200), run.out[-4000:]
        pid_files = glob.glob(str(launch_dirs / "spmd-run-*" / "rank1.pid"))
        assert len(pid_files) == 1, (pid_files, run.out[-3000:])
        with open(pid_files[0]) as f:
            os.kill(json.load(f)["pid"], signal.SIGKILL)
        status = run.wait(300)
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
    seconds = time.monotonic() - start
    out = run.out
    assert status == 0, out[-6000:]
    # (Which ranks it names depends on the order in which their processes were seen
    # to end: rank 1 alone, or with one that mpiexec killed right after.)
    assert " of 4 was killed by SIGKILL" in out or " of 4 were killed by SIGKILL" in out, \
        out[-6000:]
    assert out.count("spmd-run: restarting the job (attempt 2 of 3)") == 1, out[-6000:]
    resumed = [ln for ln in out.splitlines() if "resumed from step" in ln]
    assert len(resumed) == 1 and resumed[0].split()[-1] in ("20", "10"), out[-6000:]
    # Bit for bit: the batches are a function of the step, the state is restored exactly.
    assert _final(str(tmp_path / "killed")) == _final(str(tmp_path / "whole")), out[-3000:]
    assert _printed_final(out) == _printed_final(ref.out)
    print(f"killed and resumed run: {seconds:.1f}s; {resumed[0]}")
