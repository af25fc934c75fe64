"""spmd-run's ranks on cores of their own (spmd.launch.affinity)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from spmd.errors import ArgumentError
from spmd.launch import affinity
from tests.launch.test_cli import _env, needs_mpi, spmd_run, write

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def test_plan_gives_each_local_rank_its_own_group_of_cores():
    cores = [3, 1, 2, 0, 5, 4]  # the mask's order does not matter
    groups = [affinity.plan(i, 3, 2, cores) for i in range(3)]
    assert groups == [[0, 1], [2, 3], [4, 5]]
    assert affinity.plan(0, 4, 2, cores) is None       # 8 threads do not fit 6 cores
    assert affinity.plan(3, 3, 1, cores) is None       # a local rank past its node's count
    assert affinity.plan(0, 1, 0, cores) is None


def test_bind_setting_is_checked():
    assert affinity.setting({}) == "cores"
    assert affinity.setting({"SPMD_BIND": " None "}) == "none"
    with pytest.raises(ArgumentError, match=r"SPMD_BIND='sockets' is not a binding; set it to "
                                            r"'cores'.*or 'none'"):
        affinity.setting({"SPMD_BIND": "sockets"})


def test_unlaunched_process_stays_unbound():
    assert affinity.bind_from_env({"OMP_NUM_THREADS": "1"}) is None


REPORT = """
    import json, os
    from mpi4py import MPI
    cores = sorted(os.sched_getaffinity(0))
    rows = MPI.COMM_WORLD.gather(cores)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("CORES " + json.dumps(rows), flush=True)
"""


def _cores(out: str):
    line = next(l for l in out.splitlines() if "CORES " in l)
    return json.loads(line.split("CORES ", 1)[1])


@needs_mpi
@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 usable cores to give 2 ranks one each")
def test_ranks_that_fit_the_cores_get_one_core_each(tmp_path):
    script = write(tmp_path, "cores.py", REPORT)
    proc, _ = spmd_run("-n", "2", script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = _cores(proc.stdout)
    assert rows == [[CORES[0]], [CORES[1]]]


@needs_mpi
def test_ranks_that_outnumber_the_cores_and_bind_none_stay_unbound(tmp_path):
    script = write(tmp_path, "cores.py", REPORT)
    n = len(CORES) + 1
    proc, _ = spmd_run("-n", str(n), script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _cores(proc.stdout) == [CORES] * n
    proc, _ = spmd_run("-n", "2", script, cwd=tmp_path, env=_env(SPMD_BIND="none"))
    assert proc.returncode == 0, proc.stderr
    assert _cores(proc.stdout) == [CORES] * 2


@needs_mpi
def test_a_bad_bind_setting_fails_the_job_naming_it(tmp_path):
    script = write(tmp_path, "cores.py", REPORT)
    proc, _ = spmd_run("-n", "2", script, cwd=tmp_path, env=_env(SPMD_BIND="socket"))
    assert proc.returncode != 0
    assert "SPMD_BIND='socket' is not a binding" in proc.stderr


SPARE = """
    import json, os, sys, threading
    from spmd.launch import affinity
    mine = affinity.bind_this_rank(0, 1, {"SPMD_NUM_THREADS": "1"})
    seen = {}
    def background():
        seen["moved"] = affinity.to_spare_cores()
        seen["thread"] = sorted(os.sched_getaffinity(0))
    t = threading.Thread(target=background)
    t.start(); t.join()
    print(json.dumps({"mine": mine, "main": sorted(os.sched_getaffinity(0)), **seen}))
"""


@pytest.mark.skipif(len(CORES) < 2, reason="needs a mask of 2 cores or more")
def test_a_background_thread_moves_to_the_cores_no_rank_took(tmp_path):
    # A rank of one thread alone on its node: the other cores are spare.  The
    # thread moves; the rank's own thread stays on its core.
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SPARE)], capture_output=True,
                         text=True, timeout=60, check=True,
                         env=dict(os.environ, PYTHONPATH=REPO)).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["mine"] == got["main"] == CORES[:1]
    assert got["moved"] == got["thread"] == CORES[1:]


def test_without_spare_cores_a_background_thread_stays(monkeypatch):
    monkeypatch.setattr(affinity, "_spare", [])
    before = sorted(os.sched_getaffinity(0)) if CORES else None
    assert affinity.to_spare_cores() is None
    assert (sorted(os.sched_getaffinity(0)) if CORES else None) == before
