"""Hybrid meshes: 2 ranks with 2 devices each (``SPMD_LOCAL_DEVICES=2``).

The number of devices per rank is fixed for a whole MPI job, so these are
single-process tests (not marked ``mpi``) that launch their own 2-rank jobs
with the venv's ``mpiexec`` and run the multi-process suite's generic tests
there: the collectives (on meshes where some groups stay inside a process and
others cross processes, ``tests.mpi.make_mesh``), the arrays (a process holds
several blocks, not always adjacent ones) and training.  They are skipped when
the interpreter has no mpi4py or no ``mpiexec`` next to it.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import REPO_ROOT, mpiexec_or_skip, run_command  # noqa: E402

HYBRID = {"SPMD_LOCAL_DEVICES": "2"}

# (test file, -k expression): the collectives in float32 (the other
# dtypes take the same paths through the MPI calls), everything else in full.
SUITES = {
    "collectives": ("test_mpi_collectives.py",
                    "f32 or (gradients and eager) or axis_index or scalar or chain "
                    "or jit_output"),
    "arrays": ("test_mpi_arrays.py", None),
    "local_blocks": ("test_mpi_local_blocks.py", None),
    "eager": ("test_mpi_eager.py", None),
    "training": ("test_mpi_training.py", None),
    "pmap": ("test_mpi_pmap.py", None),
    "groups": ("test_mpi_groups.py", None),
    "debug": ("test_mpi_debug.py", None),
    "call_plans": ("test_mpi_call_plans.py", None),
    "nested": ("test_mpi_nested_shard_map.py", None),
    "shm": ("test_mpi_shm.py", None),
}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("suite", list(SUITES))
def test_mpi_suite_on_two_ranks_with_two_devices_each(suite):
    exe = mpiexec_or_skip()
    path, expr = SUITES[suite]
    argv = [exe, "-n", "2", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--with-mpi", "-m", "mpi", "--timeout=120", "--timeout-method=thread",
            str(REPO_ROOT / "tests" / "mpi" / path)] + (["-k", expr] if expr else [])
    status, out, seconds = run_command(argv, env=HYBRID, timeout=400)
    assert status is not None, f"the hybrid run hung (killed after {seconds:.0f}s):\n{out[-6000:]}"
    assert status == 0, out[-12000:]
    assert " passed" in out and " failed" not in out, out[-6000:]


_CHECKS = textwrap.dedent("""
    import numpy as np
    import spmd
    import spmd.numpy as snp
    from spmd import NamedSharding, P, lax
    from tests.mpi import RefMesh, make_mesh

    me = spmd.process_index()
    assert spmd.process_count() == 2 and spmd.device_count() == 4
    assert [d.id for d in spmd.local_devices()] == [2 * me, 2 * me + 1]

    # Mesh "2dT" is [[0, 2], [1, 3]]: process 0 holds column b=0.  Under
    # P(("a", "b")) its blocks are 0 and 2 along dim 0 (not adjacent).
    mesh = make_mesh("2dT")
    s = NamedSharding(mesh, P(("a", "b")))
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    mine = np.concatenate([x[0:2], x[4:6]]) if me == 0 else np.concatenate([x[2:4], x[6:8]])
    a = spmd.make_array_from_process_local_data(s, mine)
    assert a.shape == (8, 4), a.shape
    assert [sh.index[0] for sh in a.addressable_shards] == (
        [slice(0, 2), slice(4, 6)] if me == 0 else [slice(2, 4), slice(6, 8)])
    np.testing.assert_array_equal(spmd.process_allgather(a), x)

    # A collective along 'a' stays inside each process; along 'b' it crosses.
    ref = RefMesh.of(mesh)
    blocks = ref.split_rows(x)
    for axes in ("a", "b", ("a", "b"), ("b", "a")):
        out = spmd.shard_map(lambda v: lax.psum(v, axes), mesh=mesh,
                             in_specs=P(("a", "b")), out_specs=P(("a", "b")))(a)
        want = np.concatenate([ref.psum(blocks, c, axes) for c in ref.coords()])
        np.testing.assert_array_equal(spmd.process_allgather(out), want)
    print(f"rank {me}: hybrid checks passed", flush=True)
""")


@pytest.mark.timeout(120)
def test_hybrid_blocks_that_are_not_adjacent(tmp_path):
    exe = mpiexec_or_skip()
    script = tmp_path / "checks.py"
    script.write_text(_CHECKS)
    # spmd.launch._rank ends the job at a failed assertion (a plain script would
    # hang in MPI_Finalize, waiting for the other rank).
    status, out, seconds = run_command(
        [exe, "-n", "2", sys.executable, "-m", "spmd.launch._rank", script], env=HYBRID,
        timeout=90)
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status == 0, out
    assert out.count("hybrid checks passed") == 2, out
