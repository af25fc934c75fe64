"""The ``nccl`` backend across processes, on the CuPy and NCCL stand-ins.

Each test launches its own small MPI job of :mod:`tests.gpu.nccl_job` with the
venv's ``mpiexec`` (skipped, with the reason, where mpi4py or mpiexec is
missing), under a time limit so that a hang fails:

- 4 ranks on a 2 x 2 mesh: every collective along each axis runs on 2-member
  NCCL communicators (sub-groups), checked against numpy; a bool sum is sent
  to NCCL as a uint8 max;
- 2 ranks each bound to its own GPU by ``CUDA_VISIBLE_DEVICES`` (each sees one
  GPU): accepted, and the collectives run;
- 2 ranks bound to the same GPU: refused with an error naming both ranks;
- in every job each communicator is destroyed before MPI is finalised;
- 2 ranks with ``SPMD_GPU_BACKEND=mpi`` (collectives staged through host
  memory): arrays made from each process's data, a jitted step partitioned over
  the processes, a scalar result, all with their buffers on the GPU;
- 4 ranks on 2 simulated nodes (``SPMD_SIMULATE_NODES=2``) of 2 GPUs each: the
  GPUs are numbered per node (ranks 0 and 2 both take GPU 0 of their node), the
  check of (node, PCI bus id) accepts them, and the collectives run within and
  across the nodes.
"""

from __future__ import annotations

import collections
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import REPO_ROOT, mpiexec_or_skip, run_command  # noqa: E402

JOB = REPO_ROOT / "tests" / "gpu" / "nccl_job.py"


def _run(scenario: str, ranks: int, tmp_path) -> tuple[str, list[str]]:
    exe = mpiexec_or_skip()
    trace = tmp_path / "nccl_trace.txt"
    status, out, seconds = run_command(
        [exe, "-n", str(ranks), sys.executable, str(JOB), scenario],
        env={"FAKE_NCCL_TRACE": str(trace)}, timeout=240)
    assert status is not None, f"the {scenario} job hung (killed after {seconds:.0f}s):\n" \
                               f"{out[-6000:]}"
    assert status == 0, out[-8000:]
    for r in range(ranks):
        assert f"RANK {r} OK" in out, out[-6000:]
    return out, trace.read_text().splitlines() if trace.exists() else []


def _check_destroyed_before_finalize(trace: list[str], ranks: int) -> None:
    """Per process: as many destructions as creations, all while MPI was up."""
    made, destroyed = collections.Counter(), collections.Counter()
    for line in trace:
        pid, what = line.split()[:2]
        if what == "create":
            made[pid] += 1
        elif what == "destroy":
            destroyed[pid] += 1
            assert "mpi_finalized=False" in line, line
    assert len(made) == ranks and made == destroyed, trace


@pytest.mark.timeout(300)
def test_collectives_on_sub_group_communicators(tmp_path):
    out, trace = _run("collectives", 4, tmp_path)
    _check_destroyed_before_finalize(trace, 4)


@pytest.mark.timeout(300)
def test_ranks_bound_to_one_gpu_each_by_cuda_visible_devices(tmp_path):
    out, trace = _run("bound", 2, tmp_path)
    _check_destroyed_before_finalize(trace, 2)


@pytest.mark.timeout(300)
def test_two_ranks_on_one_gpu_are_refused(tmp_path):
    out, trace = _run("shared-gpu", 2, tmp_path)
    assert out.count("REFUSED: world ranks 0 and 1 both use GPU") == 2, out[-4000:]
    assert "SPMD_GPU_BACKEND=mpi" in out


@pytest.mark.timeout(300)
def test_arrays_spread_over_processes_host_staged(tmp_path):
    out, trace = _run("host-staged", 2, tmp_path)
    assert trace == []  # no NCCL communicator: the mpi backend


@pytest.mark.timeout(300)
def test_simulated_nodes_number_their_gpus_from_zero(tmp_path):
    out, trace = _run("simulated", 4, tmp_path)
    _check_destroyed_before_finalize(trace, 4)
