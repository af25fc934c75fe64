"""Recovery from the in-memory checkpoints (``save(..., local=True)``) after a node is
lost: the transformer example on 4 ranks over 2 emulated nodes keeps its state in
memory every step, node1 is killed mid-training, and ``spmd-run --min-ranks 2`` goes
on with node0's 2 ranks from the step that node0's memory holds whole (its own
blocks and the copies of node1's), not from disk, where nothing was saved yet.

Checked: the losses after the restart equal, bit for bit, those of a 2-rank run
resumed from the same step of an uninterrupted run's checkpoint (same program, same
node), and the uninterrupted 4-rank run's within float32 summation order; a second
node lost while the job recovers; every node's ``/dev/shm`` is left empty.  Each job
has a time limit."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from tests.multinode.launcher import REPO_ROOT, Run, emulated

pytestmark = pytest.mark.timeout(400)

LIMIT_S = 200
STEPS = 12
TRANSFORMER = REPO_ROOT / "examples" / "train_transformer.py"
ARGS = ["--d-model", "32", "--heads", "4", "--layers", "2", "--context", "16", "--batch",
        "12", "--steps", str(STEPS), "--sample", "0", "--log-every", "1",
        "--mesh", "data=-1,model=2"]


def _example(nodes, hosts: str, n: int, ckpt, stats, tmp_path, *more, options=()):
    return Run(nodes, ["-n", str(n), "--hosts", hosts, *emulated(nodes), *options],
               TRANSFORMER, [*ARGS, "--ckpt-dir", ckpt, "--stats", stats, *more],
               cwd=tmp_path)


def _losses(stats) -> list[float]:
    with open(f"{stats}.rank0.json") as f:
        return json.load(f)["losses"]


def _resumed_from(out: str) -> list[int]:
    return [int(k) for k in re.findall(r"resumed from step (\d+)", out)]


def test_node1_lost_training_goes_on_from_memory(make_nodes, tmp_path):
    nodes = make_nodes(2)
    job = _example(nodes, "node0:2,node1:2", 4, tmp_path / "ck", tmp_path / "elastic",
                   tmp_path, "--save-local-every", "1",
                   options=["--max-restarts", "1", "--min-ranks", "2"])
    status = job.lose_node(nodes, 1, "step 5 loss", 1, LIMIT_S)
    out = job.out
    assert status == 0, out[-5000:]
    assert "spmd-run: attempt 2 of 2 on 2 ranks (node0:2): node1 lost" in out, out[-5000:]
    resumed = _resumed_from(out)
    assert len(resumed) == 1 and 4 <= resumed[0] < STEPS, out[-5000:]
    k = resumed[0]
    elastic = _losses(tmp_path / "elastic")
    assert len(elastic) == STEPS - k
    assert not (tmp_path / "ck" / f"step_{k}").exists()  # (read from memory: disk had none)
    assert nodes.leftovers() == {}

    # The uninterrupted run on the same nodes, a checkpoint on disk every step.
    full = _example(nodes, "node0:2,node1:2", 4, tmp_path / "full", tmp_path / "full",
                    tmp_path, "--save-every", "1", "--keep", str(STEPS))
    assert full.wait(LIMIT_S) == 0, full.out[-5000:]
    uninterrupted = _losses(tmp_path / "full")
    # 2 ranks on node0 from that run's step k: what the restart computed, bit for bit.
    shutil.copytree(tmp_path / "full" / f"step_{k}", tmp_path / "from_k" / f"step_{k}")
    again = _example(nodes, "node0:2", 2, tmp_path / "from_k", tmp_path / "again", tmp_path)
    assert again.wait(LIMIT_S) == 0, again.out[-5000:]
    assert _resumed_from(again.out) == [k], again.out[-5000:]
    assert _losses(tmp_path / "again") == elastic
    np.testing.assert_allclose(elastic, uninterrupted[k:], rtol=1e-4)
    assert nodes.leftovers() == {}


def test_a_second_node_lost_while_recovering(make_nodes, tmp_path):
    # node1 lost: the spare node2 takes its place; node2 lost as that attempt restores
    # (rank 0 prints the model just before): the third attempt runs on node0 alone,
    # from the same memory (node0 holds its own blocks and the copies of node1's).
    nodes = make_nodes(3)
    job = _example(nodes, "node0:2,node1:2", 4, tmp_path / "ck", tmp_path / "elastic",
                   tmp_path, "--save-local-every", "1",
                   options=["--max-restarts", "2", "--min-ranks", "2", "--spare", "node2:2"])
    try:
        assert job.wait_for("step 4 loss", 1, LIMIT_S), job.out[-3000:]
        assert nodes.kill_node(1)
        assert job.wait_for("spmd-run: attempt 2 of 3 on 4 ranks (node0:2,node2:2)", 1,
                            LIMIT_S), job.out[-3000:]
        assert job.wait_for("corpus: ", 2, LIMIT_S), job.out[-3000:]
        assert nodes.kill_node(2)
        status = job.wait(LIMIT_S)
    finally:
        if job.proc.poll() is None:
            job.wait(0)
    out = job.out
    assert status == 0, out[-5000:]
    assert "spmd-run: attempt 3 of 3 on 2 ranks (node0:2): node2 lost" in out, out[-5000:]
    resumed = _resumed_from(out)
    assert resumed and resumed[-1] >= 3, out[-5000:]
    assert len(_losses(tmp_path / "elastic")) == STEPS - resumed[-1]
    assert nodes.leftovers() == {}
