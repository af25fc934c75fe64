"""A rank that exits or skips a program's first call: the others' wait there (the
communicator's set-up and the agreement on the program, before any data moves) has
the same deadline and the same finished-rank check as any collective.

Single-process tests: each launches a small MPI job of its own, under a time limit.
Before this, rank 0 waited in ``MPI_Comm_dup`` past any deadline (killed by the
test's limit, with two cores busy-polling).
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import PSUM_JOB, run_mpi, run_spmd_run  # noqa: E402

# Rank 1 leaves (or goes elsewhere) before the first call of `step`.
_LEAVES = PSUM_JOB + textwrap.dedent("""
    mesh_ranks = {mesh_ranks}
    if mesh_ranks is not None:  # a mesh of some ranks only (a communicator of its own)
        mesh = spmd.Mesh(np.array([spmd.devices()[r] for r in mesh_ranks], dtype=object), ("i",))
        def step(b):
            return lax.psum(b, "i")
        step = spmd.jit(spmd.shard_map(step, mesh=mesh, in_specs=P("i"), out_specs=P()))
    if me == 1:
        {leave}
    if me in (mesh_ranks or range(spmd.process_count())):
        x = np.ones(len(mesh.devices.flat), np.float32)
        print(f"rank {{me}}: sum", step(x), flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,mesh_ranks", [(2, None), (3, (0, 1))], ids=["all-ranks", "ranks-0-1-of-3"])
def test_a_rank_that_exits_before_the_first_call_is_named_within_seconds(tmp_path, n, mesh_ranks):
    script = _LEAVES.format(mesh_ranks=mesh_ranks, leave="sys.exit(0)")
    status, out, seconds = run_spmd_run(script, n, tmp_path, timeout=90,
                                        env={"SPMD_COLLECTIVE_TIMEOUT": "30"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status == 1, out
    assert "rank 0: sum" not in out, out
    assert ("spmd-run: rank 1 finished while rank 0 waits for it in the first call of "
            "jit(step) (agreeing on the program); the job of") in out, out
    assert seconds < 25, f"took {seconds:.0f}s (the deadline is 30s):\n{out}"


@pytest.mark.timeout(120)
def test_a_rank_that_skips_the_first_call_is_reported_by_the_deadline(tmp_path):
    # Plain mpiexec (no spmd-run): the deadline alone must end the wait.
    script = _LEAVES.format(mesh_ranks=None, leave="time.sleep(60); sys.exit(0)")
    status, out, seconds = run_mpi(script, 2, tmp_path, timeout=90,
                                   env={"SPMD_COLLECTIVE_TIMEOUT": "3"})
    assert status is not None, f"the job hung (killed after {seconds:.0f}s):\n{out}"
    assert status != 0, out
    assert "CollectiveTimeoutError: rank 0: the first call of jit(step) over ranks [0, 1] did " \
           "not complete within 3s (SPMD_COLLECTIVE_TIMEOUT=3)" in out, out
    assert "rank 0 is agreeing on the program (no data has moved yet)" in out, out
    assert "ranks that never arrived: [1]" in out, out
    assert "rank 1: never arrived" in out, out
    assert seconds < 40, f"took {seconds:.0f}s:\n{out}"


# A data collective whose first use sets up the communicator of a new group of ranks
# (no agreement before it: a direct backend call).
_SETUP = textwrap.dedent("""
    import sys, time
    import numpy as np
    import spmd
    from spmd.collectives import mpi
    me = spmd.process_index()
    if me == 1:
        sys.exit(0)
    mpi.allreduce(np.ones(4, np.float32), (0, 1), "sum", what="psum")
""")


@pytest.mark.timeout(120)
def test_setting_up_a_communicator_is_watched_too(tmp_path):
    status, out, seconds = run_spmd_run(_SETUP, 2, tmp_path, timeout=90,
                                        env={"SPMD_COLLECTIVE_TIMEOUT": "30"})
    assert status == 1, f"status {status} after {seconds:.0f}s:\n{out}"
    assert ("spmd-run: rank 1 finished while rank 0 waits for it in psum (setting up the "
            "communicator of its ranks)") in out, out
    assert seconds < 25, f"took {seconds:.0f}s:\n{out}"


# A checkpoint's save protocol is collective over every process too (its own
# communicator): a rank that exits instead of saving is named, not waited for.
_SAVE = textwrap.dedent("""
    import sys
    import numpy as np
    import spmd
    from spmd import P, NamedSharding
    from spmd import checkpointing as ckpt
    me = spmd.process_index()
    mesh = spmd.make_mesh((spmd.device_count(),), ("d",))
    x = spmd.device_put(np.arange(8, dtype=np.float32), NamedSharding(mesh, P("d")))
    if me == 1:
        sys.exit(0)
    ckpt.save({ckpt_dir!r}, {{"x": x}}, step=1)
    print("rank 0: saved", flush=True)
""")


@pytest.mark.timeout(120)
def test_a_rank_that_exits_instead_of_saving_a_checkpoint_is_named(tmp_path):
    script = _SAVE.format(ckpt_dir=str(tmp_path / "ck"))
    status, out, seconds = run_spmd_run(script, 2, tmp_path, timeout=90,
                                        env={"SPMD_COLLECTIVE_TIMEOUT": "30"})
    assert status == 1, f"status {status} after {seconds:.0f}s:\n{out}"
    assert "rank 0: saved" not in out, out
    assert "spmd-run: rank 1 finished while rank 0 waits for it in checkpointing (" in out, out
    assert seconds < 25, f"took {seconds:.0f}s:\n{out}"
