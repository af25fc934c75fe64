"""Multi-node tests: jobs whose ranks run on emulated nodes (own host name, own
``/dev/shm``, MPI between nodes over the loopback: :mod:`spmd.testing.emulated_nodes`).

They need root to make namespaces (CI runs as root); elsewhere every test here
skips, and the skip says why.  Each job has a time limit, so a hang fails fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spmd.testing.emulated_nodes import EmulatedNodes, unavailable
from tests.mpi import REPO_ROOT, mpiexec_or_skip

# A job that has not ended by then has hung (the slowest, an example's training,
# takes a few seconds).
JOB_LIMIT_S = 240


def pytest_collection_modifyitems(items):
    reason = unavailable()
    if reason is None:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.skip(reason=reason))


def job_env(extra: dict | None = None) -> dict:
    """The environment of a job launched from a test: this one without the
    variables of any MPI job the test itself runs in, one BLAS thread per rank,
    and the repository importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MV2_", "HYDRA_", "MPIR_", "SLURM_",
                                "SPMD_TESTING_"))}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [
                   p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("SPMD_NUM_DEVICES", None)
    env.pop("SPMD_SIMULATE_NODES", None)
    env.update(extra or {})
    return env


@pytest.fixture
def make_nodes(tmp_path):
    """``make_nodes(count)``: that many emulated nodes for this test.  After the
    test, any process still running on them is killed."""
    made = []

    def make(count: int) -> EmulatedNodes:
        nodes = EmulatedNodes(tmp_path / f"nodes{len(made)}", count)
        made.append(nodes)
        return nodes

    yield make
    for nodes in made:
        for k in range(nodes.count):
            nodes.kill_node(k)


def mpiexec(nodes: EmulatedNodes, slots, argv: list[str], env: dict | None = None,
            limit_s: float = JOB_LIMIT_S) -> subprocess.CompletedProcess:
    """Run ``argv`` under plain ``mpiexec`` with ``slots`` ranks per node
    (an int, or one per node); output captured as text."""
    exe = mpiexec_or_skip()
    n = slots * nodes.count if isinstance(slots, int) else sum(slots)
    cmd = [exe, *nodes.mpiexec_args(slots), "-n", str(n), *argv]
    return subprocess.run(cmd, env={**job_env(env), **nodes.env()}, capture_output=True,
                          text=True, timeout=limit_s, stdin=subprocess.DEVNULL,
                          cwd=str(REPO_ROOT))


def python(nodes: EmulatedNodes, slots, script, *args, env=None, limit_s=JOB_LIMIT_S):
    """Run a Python script file on the nodes' ranks (plain ``mpiexec``)."""
    return mpiexec(nodes, slots, [sys.executable, str(script), *map(str, args)], env, limit_s)


RANK_PYTEST = os.path.join(os.path.dirname(__file__), "rank_pytest.py")


def in_place_pytest(nodes: EmulatedNodes, slots, outdir, args: list[str],
                    limit_s: float = JOB_LIMIT_S, per_test_s: float = 120) -> list[dict]:
    """Run ``pytest --with-mpi -m mpi ARGS`` in place on the ranks of a job on
    ``nodes`` (as ``make test-mpi`` does on one machine; ``rank_pytest.py``), with
    the suite's settings: one BLAS thread, the checking mode on, a per-test limit
    whose ``thread`` method can interrupt a rank blocked in MPI.

    Returns each rank's summary (host, exit status, collected, passed, failed,
    skipped), in rank order; a rank without one (it died, or the job hung) fails
    the test, showing the tail of every rank's log."""
    n = slots * nodes.count if isinstance(slots, int) else sum(slots)
    argv = [sys.executable, RANK_PYTEST, str(outdir), "-q", "-p", "no:cacheprovider",
            "--with-mpi", "-m", "mpi", f"--timeout={per_test_s}", "--timeout-method=thread",
            *args]
    env = {"SPMD_TEST_MPI_NP": str(n), "SPMD_CHECK_COLLECTIVES": "1"}
    try:
        out = mpiexec(nodes, slots, argv, env, limit_s)
        ended = f"mpiexec exited with {out.returncode}:\n{out.stderr[-2000:]}"
    except subprocess.TimeoutExpired:
        ended = f"the job did not end within {limit_s} s"
    summaries = []
    for rank in range(n):
        path = os.path.join(outdir, f"rank{rank}.json")
        if not os.path.exists(path):
            logs = "\n".join(f"--- rank {r} ---\n{_tail(outdir, r)}" for r in range(n))
            pytest.fail(f"rank {rank} wrote no summary; {ended}\n{logs}")
        with open(path) as f:
            summaries.append(json.load(f))
    return summaries


def _tail(outdir, rank: int, lines: int = 30) -> str:
    try:
        with open(os.path.join(outdir, f"rank{rank}.log")) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"
