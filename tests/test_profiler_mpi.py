"""spmd.profiler in a job of several processes: start_trace/stop_trace are collective
(the clocks aligned at the start, every rank's events merged into one file by rank 0
at the stop); under ``spmd-run --trace`` the ranks already record, and a second
recording is refused on every rank.  Each job runs as a subprocess with a time limit,
so a hang fails the test; they skip without mpiexec or mpi4py."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from spmd.launch import cli
from spmd.launch.timeline import summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mpiexec():
    try:
        return cli.find_mpiexec()
    except cli.LaunchError:
        return None


pytestmark = pytest.mark.skipif(
    _mpiexec() is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpiexec and mpi4py in this Python's environment (make venv)")

_STEPS = """
    import time
    import numpy as np
    import spmd
    from spmd import lax
    from spmd.sharding import PartitionSpec as P

    mesh = spmd.make_mesh((2,), ("i",))
    me = spmd.process_index()

    @spmd.jit
    def step(x):
        return spmd.shard_map(lambda b: lax.psum(b * 2.0, "i"), mesh=mesh,
                              in_specs=P("i"), out_specs=P())(x)

    x = spmd.make_array_from_callback((8,), spmd.NamedSharding(mesh, P("i")),
                                      lambda idx: np.arange(8.0)[idx])
"""


def _run(tmp_path, body: str, launcher_args=()) -> subprocess.CompletedProcess:
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_STEPS) + textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MV2_", "SLURM_", "HYDRA_"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SPMD_NUM_DEVICES", None)
    env.pop("SPMD_TRACE", None)
    proc = subprocess.run([sys.executable, "-m", "spmd.launch", "--no-prefix", "-n", "2",
                           *launcher_args, str(job)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    return proc


def _lines(proc, tag: str) -> list[list[str]]:
    return sorted(line.split() for line in proc.stdout.splitlines() if line.startswith(tag))


def test_a_trace_of_two_ranks_is_one_merged_file(tmp_path):
    path = tmp_path / "t.json.gz"
    proc = _run(tmp_path, f"""
        with spmd.profiler.trace({str(path)!r}):
            for k in range(12):
                if me == 1:
                    time.sleep(0.02)  # rank 1 comes late to every step
                y = step(x)
        print("DONE", me, float(np.asarray(y).sum()), flush=True)
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # every rank's result is right, and both returned
    assert [line[1:] for line in _lines(proc, "DONE")] == [["0", "56.0"], ["1", "56.0"]], out
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1] and all(n.startswith(f"rank {k} (") for k, n in names.items())
    psums = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "collective"
             and e["args"]["op"] == "psum"]
    seqs = {(e["pid"], e["args"]["phase"]): set() for e in psums}
    for e in psums:
        seqs[e["pid"], e["args"]["phase"]].add(e["args"]["seq"])
    assert len(seqs) == 4 and len({frozenset(s) for s in seqs.values()}) == 1, seqs
    assert len(next(iter(seqs.values()))) >= 12
    assert all(trace["otherData"]["clock"][k]["error_us"] is not None for k in ("0", "1"))
    s = summary.summarize(trace)
    assert "rank 1" in summary.render(s).split("straggler:")[1].splitlines()[0], \
        summary.render(s)


def test_under_spmd_run_trace_a_second_recording_is_refused_on_every_rank(tmp_path):
    proc = _run(tmp_path, f"""
        try:
            spmd.profiler.start_trace({str(tmp_path / "t.json")!r})
        except spmd.profiler.ProfilerError as e:
            print("REFUSED", me, str(e).replace(chr(10), " "), flush=True)
        step(x)
    """, launcher_args=["--trace", str(tmp_path / "job.json")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refused = _lines(proc, "REFUSED")
    assert [line[1] for line in refused] == ["0", "1"], proc.stdout
    assert all("spmd-run --trace" in " ".join(line) for line in refused)
    assert not os.path.exists(tmp_path / "t.json")
    assert os.path.exists(tmp_path / "job.json")


def test_a_path_rank_0_cannot_write_raises_on_every_rank(tmp_path):
    target = tmp_path / "a-directory.json"
    target.mkdir()  # (a directory where the file would go)
    proc = _run(tmp_path, f"""
        try:
            spmd.profiler.start_trace({str(target)!r})
        except spmd.profiler.ProfilerError as e:
            print("REFUSED", me, str(e).replace(chr(10), " "), flush=True)
        print("AFTER", me, float(np.asarray(step(x)).sum()), flush=True)
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line[1] for line in _lines(proc, "REFUSED")] == ["0", "1"], proc.stdout
    assert all(str(target) in " ".join(line) for line in _lines(proc, "REFUSED"))
    assert [line[1:] for line in _lines(proc, "AFTER")] == [["0", "56.0"], ["1", "56.0"]]
