"""The fast tier across processes on one machine: ``spmd-run`` gives every attempt of a
run the same ``SPMD_JOB_ID``, so the attempt after a lost rank (``--min-ranks``: on
fewer ranks) restores the step the previous one kept in memory, onto its own mesh;
and once the run has ended, however it ended, its memory is gone.

(On one machine there is no copy on another node: the lost rank's node, and its
memory, are still there.  Across nodes: tests/multinode/test_fast_recovery.py.)  The
jobs run under ``python -m spmd.launch`` with a time limit.
"""

from __future__ import annotations

import glob
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.launch.jobs import Launch  # noqa: E402

from spmd.launch import cli, memory_tier  # noqa: E402

LIMIT_S = 150

# Attempt 0 on 4 ranks keeps step 3 in memory (a 12 x 4 array split over the ranks,
# and a count), then rank 3 dies; the next attempt restores onto a mesh of its size,
# the array split along the other axis, and each rank checks its own block.
_JOB = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import spmd
    from spmd import P, NamedSharding, checkpointing

    CKPT = sys.argv[1]
    WHOLE = np.arange(48.0, dtype=np.float32).reshape(12, 4)
    attempt, me = os.environ["SPMD_RESTART_ATTEMPT"], spmd.process_index()
    n = spmd.process_count()
    mesh = spmd.make_mesh((n,), ("i",))
    print(f"JOB {me} {os.environ['SPMD_JOB_ID']}", flush=True)
    if attempt == "0":
        x = spmd.make_array_from_callback((12, 4), NamedSharding(mesh, P("i")),
                                          lambda idx: WHOLE[idx])
        checkpointing.save(CKPT, {"x": x, "count": np.int64(3)}, step=3, local=True)
        if me == 3:
            os.kill(os.getpid(), 9)
        time.sleep(60)
    step = checkpointing.latest_step(CKPT, local=True)
    target = {"x": NamedSharding(mesh, P(None, "i") if 4 % n == 0 else P()),
              "count": np.int64(0)}
    out = checkpointing.restore(CKPT, target)
    for shard in out["x"].addressable_shards:
        assert np.array_equal(np.asarray(shard.data), WHOLE[shard.index]), shard.index
    print(f"RESTORED {me} of {n}: step {step} count {int(out['count'])}", flush=True)
""")


def _ran(script: str, n: int, tmp_path, **launch) -> str:
    """The output of ``script`` run on ``n`` ranks with the checkpoint directory as its
    argument, which must succeed."""
    job = Launch(script, n, tmp_path, args=[tmp_path / "ck"], **launch)
    status = job.wait(LIMIT_S)
    assert status == 0, job.out[-5000:]
    return job.out


def _tiers() -> set[str]:
    return set(glob.glob(os.path.join(memory_tier.SHM, memory_tier.PREFIX + "*")))


def test_the_attempt_after_a_lost_rank_restores_from_memory(tmp_path):
    before = _tiers()
    job = Launch(_JOB, 4, tmp_path, options=["--max-restarts", "1", "--min-ranks", "2"],
                 args=[tmp_path / "ck"])
    status = job.wait(LIMIT_S)
    out = job.out
    assert status == 0, out[-5000:]
    assert "spmd-run: attempt 2 of 2 on 3 ranks" in out, out[-5000:]
    for r in range(3):
        assert f"RESTORED {r} of 3: step 3 count 3" in out, out[-5000:]
    jobs = {line.split()[-1] for line in out.splitlines() if "JOB " in line}
    assert len(jobs) == 1, jobs  # one id for both attempts
    assert not os.path.exists(tmp_path / "ck")  # nothing was on disk
    assert _tiers() == before  # removed at the end


def test_a_failed_run_leaves_no_memory_either(tmp_path):
    before = _tiers()
    job = Launch(_JOB, 4, tmp_path, args=[tmp_path / "ck"])  # no restart
    status = job.wait(LIMIT_S)
    assert status not in (0, None), job.out[-5000:]
    assert "JOB 0 " in job.out, job.out[-5000:]
    assert _tiers() == before


def test_every_attempt_gets_the_runs_id():
    ns = cli.parse_args(["-n", "2", "--max-restarts", "3", "t.py"])
    ns.job_id = "abc123"
    assert cli.build_env(ns, "/tmp/x", environ={}, attempt=2)[memory_tier.JOB_ENV] == "abc123"
    assert memory_tier.JOB_ENV in cli._EXPORTED  # (Open MPI is told to pass it on)


# Nodes simulated on one machine (SPMD_SIMULATE_NODES=2: ranks 0-1 and 2-3): each
# rank's copy goes to the other node's rank; with the files node1's ranks wrote
# gone, as with node1, the step still restores whole from node0's copies.
_COPIES = textwrap.dedent("""
    import glob, os, sys
    import numpy as np
    import spmd
    from spmd import P, NamedSharding, checkpointing
    from spmd.checkpointing import memory

    CKPT = sys.argv[1]
    WHOLE = np.arange(96.0, dtype=np.float32).reshape(8, 12)
    me = spmd.process_index()
    mesh = spmd.make_mesh((2, 2), ("a", "b"))
    x = spmd.make_array_from_callback((8, 12), NamedSharding(mesh, P("a", "b")),
                                      lambda idx: WHOLE[idx])
    where = checkpointing.save(CKPT, {"x": x}, step=2, local=True)
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()
    if me == 0:
        names = sorted(os.listdir(where))
        print("FILES " + " ".join(names), flush=True)
        for name in names:  # what node1's ranks wrote: lost with node1
            if ".w2." in name or ".w3." in name:
                os.remove(os.path.join(where, name))
    MPI.COMM_WORLD.Barrier()
    out = checkpointing.restore(CKPT, {"x": NamedSharding(mesh, P(None, ("a", "b")))})
    for shard in out["x"].addressable_shards:
        assert np.array_equal(np.asarray(shard.data), WHOLE[shard.index]), shard.index
    print(f"RESTORED {me}", flush=True)
""")


def test_copies_go_to_the_other_node_and_stand_in_for_it(tmp_path):
    out = _ran(_COPIES, 4, tmp_path, env={"SPMD_SIMULATE_NODES": "2"})
    files = next(line for line in out.splitlines() if "FILES " in line).split("FILES ")[1]
    assert files.split() == ["commit.r0", "commit.r1", "commit.r2", "commit.r3",
                             *[f"r{r}.w{w}.{ext}" for r, w in [(0, 0), (0, 2), (1, 1), (1, 3),
                                                              (2, 0), (2, 2), (3, 1), (3, 3)]
                               for ext in ("bin", "json")]], files
    assert all(f"RESTORED {r}" in out for r in range(4)), out[-5000:]


# Ranks that disagree: rank 1 loses its job id before restoring.  Every rank still
# takes part in the listing (none waits for another), and the step rank 0's node
# holds whole is restored on both.
_DISAGREE = textwrap.dedent("""
    import os, sys
    import numpy as np
    import spmd
    from spmd import P, NamedSharding, checkpointing

    CKPT = sys.argv[1]
    WHOLE = np.arange(16.0, dtype=np.float32)
    me = spmd.process_index()
    mesh = spmd.make_mesh((2,), ("i",))
    x = spmd.make_array_from_callback((16,), NamedSharding(mesh, P("i")), lambda i: WHOLE[i])
    checkpointing.save(CKPT, {"x": x}, step=4, local=True)
    if me == 1:
        del os.environ["SPMD_JOB_ID"]
    out = checkpointing.restore(CKPT, {"x": NamedSharding(mesh, P())})
    assert np.array_equal(np.asarray(out["x"]), WHOLE)
    print(f"RESTORED {me}", flush=True)
""")


def test_ranks_that_disagree_on_the_job_id_restore_alike(tmp_path):
    out = _ran(_DISAGREE, 2, tmp_path)
    assert "RESTORED 0" in out and "RESTORED 1" in out, out[-5000:]


def test_the_hosts_removal_pass_runs_only_for_a_job_that_kept_memory(tmp_path):
    import argparse

    from spmd.launch import multihost

    launch_dir = tmp_path / "attempt"
    launch_dir.mkdir()
    assert not memory_tier.used(str(launch_dir))
    memory_tier.note_used({"SPMD_LAUNCH_DIR": str(launch_dir)})  # (a rank's first save)
    assert memory_tier.used(str(launch_dir))
    memory_tier.note_used({})  # (no launch directory: nothing, no error)
    ns = argparse.Namespace(remote=True, rank_hosts=["nodeA", "nodeB"], job_id="j1",
                            tier_used=False, launch_dir=str(tmp_path), mpiexec_args=[],
                            hostfile=None, placement=None)
    # Nothing kept in memory: no pass (an mpiexec that does not exist is never run).
    multihost.remove_memory_tier(ns, str(tmp_path / "no-mpiexec"), "mpich", {},
                                 ["nodeA", "nodeB"])
    ns.tier_used = True
    with pytest.raises(OSError):
        multihost.remove_memory_tier(ns, str(tmp_path / "no-mpiexec"), "mpich", {},
                                     ["nodeA", "nodeB"])


# A process that cannot make its part of a save (here rank 1's leaf has a dtype
# checkpoints do not store: ranks that disagree) is not agreed on when the save is
# asked for (that would hold every step for the slowest process) but in the
# background write: every rank raises from wait(), naming rank 1 and its reason,
# nothing is committed, and the next save goes on.  With copies between simulated
# nodes, so the failing rank's partner waits for a copy that says it failed.
_ONE_FAILS = textwrap.dedent("""
    import os, sys
    import numpy as np
    import spmd
    from spmd import P, NamedSharding, checkpointing
    from spmd.checkpointing import CheckpointError

    CKPT = sys.argv[1]
    me = spmd.process_index()
    mesh = spmd.make_mesh((2,), ("i",))
    x = spmd.make_array_from_callback((8,), NamedSharding(mesh, P("i")),
                                      lambda i: np.arange(8.0)[i])
    bad = {"x": x, "y": np.array([1 + 2j]) if me == 1 else np.array([1.0])}
    pending = checkpointing.save_async(CKPT, bad, step=1, local=True)
    try:
        pending.wait()
        print(f"NO ERROR {me}", flush=True)
    except CheckpointError as e:
        print(f"RAISED {me}: {e}", flush=True)
    where = checkpointing.save(CKPT, {"x": x, "y": np.array([1.0])}, step=2, local=True)
    commits = sorted(n for n in os.listdir(os.path.dirname(where)) if not n.startswith("."))
    print(f"STEPS {me}: {commits} {checkpointing.latest_step(CKPT, local=True)}", flush=True)
""")


def test_a_process_that_fails_its_part_of_a_save_fails_it_on_every_process(tmp_path):
    out = _ran(_ONE_FAILS, 2, tmp_path, env={"SPMD_SIMULATE_NODES": "2"})
    for r in range(2):
        line = next(l for l in out.splitlines() if f"RAISED {r}:" in l)
        assert "in-memory save of step 1" in line and "failed on process(es) [1]" in line, line
        assert r"the leaf at ['y'] has dtype complex128" in line, line
        assert f"STEPS {r}: ['step_2.a0.s1'] 2" in out, out[-5000:]
    assert "NO ERROR" not in out, out[-5000:]
