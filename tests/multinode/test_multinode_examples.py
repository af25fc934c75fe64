"""Both examples on emulated nodes: they train (the loss falls; the MLP passes its
own accuracy bar) and give the one-node run's losses, on 2 nodes (2 ranks each)
and on 3 nodes.

The one-node reference is one process with one device: the same global batches in
the same order, so only the order of floating-point sums differs between the runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.mpi import REPO_ROOT
from tests.multinode.conftest import job_env, python

pytestmark = pytest.mark.timeout(300)

MLP = REPO_ROOT / "examples" / "train_mlp.py"
TRANSFORMER = REPO_ROOT / "examples" / "train_transformer.py"
# Few steps of small models: 3 epochs of 14 steps (batch 96, divisible by 2 and 3);
# 20 steps of a 2-layer transformer (batch 12).
MLP_ARGS = ["--epochs", "3", "--batch", "96"]
TRANSFORMER_ARGS = ["--d-model", "32", "--heads", "4", "--layers", "2", "--context", "16",
                    "--batch", "12", "--steps", "20", "--sample", "0", "--log-every", "10"]

# Each layout's node count, and each example's ranks per node and --mesh.  On 3 nodes
# the MLP runs one rank per node (data parallel only) and the transformer 2+1+1
# ranks, so that one 'model' pair and both 'data' pairs span two nodes.
LAYOUTS = {
    "2nodes": dict(count=2, mlp=(2, "2,2"), transformer=(2, "data=2,model=2")),
    "3nodes": dict(count=3, mlp=(1, "3,1"), transformer=([2, 1, 1], "data=2,model=2")),
}


def _run_one_process(argv: list) -> str:
    """An example in one process with one device (no MPI): its output."""
    out = subprocess.run([sys.executable, *map(str, argv)], env=job_env({"SPMD_NUM_DEVICES": "1"}),
                         capture_output=True, text=True, timeout=240, cwd=str(REPO_ROOT),
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _mlp_result(text: str) -> tuple[list[float], float]:
    """The MLP's printed epoch losses and held-out accuracy."""
    losses = [float(v) for v in re.findall(r"epoch\s+\d+/\d+\s+loss ([0-9.]+)", text)]
    accuracy = re.findall(r"held-out accuracy: ([0-9.]+)", text)
    assert len(losses) == 3 and len(accuracy) == 1, text[-3000:]
    return losses, float(accuracy[0])


def _transformer_losses(stats) -> list[float]:
    """The 20 losses rank 0 recorded (``--stats``): full precision, not the printed 4 digits."""
    with open(f"{stats}.rank0.json") as f:
        losses = json.load(f)["losses"]
    assert len(losses) == 20
    return losses


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """The examples' one-node results, each run once for the module, when first asked."""
    done: dict = {}

    def result(example: str):
        if example not in done:
            if example == "mlp":
                done[example] = _mlp_result(_run_one_process([MLP, "--mesh", "1,1", *MLP_ARGS]))
            else:
                stats = tmp_path_factory.mktemp("one_node") / "stats"
                _run_one_process([TRANSFORMER, "--mesh", "data=1,model=1", *TRANSFORMER_ARGS,
                                  "--stats", stats])
                done[example] = _transformer_losses(stats)
        return done[example]

    return result


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mlp_trains_as_on_one_node(make_nodes, one_node, layout):
    nodes = make_nodes(LAYOUTS[layout]["count"])
    slots, mesh = LAYOUTS[layout]["mlp"]
    out = python(nodes, slots, MLP, "--mesh", mesh, *MLP_ARGS)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data, model = mesh.split(",")
    ranks = sum(slots) if isinstance(slots, list) else slots * nodes.count
    assert f"mesh data={data} x model={model} over {ranks} devices in {ranks} process(es)" \
        in out.stdout
    losses, accuracy = _mlp_result(out.stdout)
    assert "accuracy > 0.9: ok" in out.stdout and accuracy > 0.9
    assert losses[-1] < 0.5 * losses[0], losses
    # Printed to 4 digits: the tolerance covers that rounding and the sums' order.
    ref_losses, _ = one_node("mlp")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-3, atol=2e-4)
    assert nodes.leftovers() == {}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_transformer_trains_as_on_one_node(make_nodes, one_node, tmp_path, layout):
    nodes = make_nodes(LAYOUTS[layout]["count"])
    slots, mesh = LAYOUTS[layout]["transformer"]
    stats = tmp_path / "stats"
    out = python(nodes, slots, TRANSFORMER, "--mesh", mesh, *TRANSFORMER_ARGS, "--stats", stats)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    losses = _transformer_losses(stats)
    assert np.mean(losses[-5:]) < 0.85 * losses[0], losses
    # The documented bound for sharded runs against one device (docs/training.md).
    np.testing.assert_allclose(losses, one_node("transformer"), rtol=1e-4)
    assert nodes.leftovers() == {}
