"""spmd.profiler in a job of several processes: start_trace says to record with the
launcher (spmd-run --trace PATH).  The job runs as a subprocess with a time limit, so
a hang fails the test; it skips without mpiexec or mpi4py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from spmd.launch import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mpiexec():
    try:
        return cli.find_mpiexec()
    except cli.LaunchError:
        return None


@pytest.mark.skipif(_mpiexec() is None or importlib.util.find_spec("mpi4py") is None,
                    reason="needs mpiexec and mpi4py in this Python's environment (make venv)")
def test_start_trace_under_several_processes_names_the_launcher(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(f"""
        import spmd
        try:
            spmd.profiler.start_trace({str(tmp_path / "t.json")!r})
        except spmd.profiler.ProfilerError as e:
            print("REFUSED", spmd.process_index(), str(e).replace(chr(10), " "), flush=True)
        else:
            print("STARTED", spmd.process_index(), flush=True)
    """))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MV2_", "SLURM_", "HYDRA_"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SPMD_NUM_DEVICES", None)
    proc = subprocess.run([sys.executable, "-m", "spmd.launch", "--no-prefix", "-n", "2",
                           str(job)], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refused = sorted(line for line in proc.stdout.splitlines() if line.startswith("REFUSED"))
    assert [line.split()[1] for line in refused] == ["0", "1"], proc.stdout
    assert all("spmd-run --trace PATH" in line for line in refused)
    assert not os.path.exists(tmp_path / "t.json")
