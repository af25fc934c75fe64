"""Checkpoints across node layouts: a sharded training state saved by 4 ranks on 2
emulated nodes restores, value for value, in one process (one node) and on 3 ranks
of 3 nodes; a chunk damaged on disk is an error on every rank of the 3-node job,
and the previous step still restores.

The values compared are those the saving job wrote (no arithmetic between save and
restore), so they must be equal, bit for bit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P
from spmd import checkpointing as ckpt
from tests.multinode.conftest import python

pytestmark = pytest.mark.timeout(300)

# The state: an affine model's parameters, sharded as a data- and tensor-parallel
# run shards them, Adam's moments placed like them, Adam's step count, and an
# unplaced numpy leaf (process 0 writes it).  Its dimensions fit the saving mesh
# (2 x 2) and the restoring ones ((3,) and 4 x 2).
_STATE = """
import numpy as np, spmd, spmd.numpy as snp
from spmd import P, NamedSharding

W_SHAPE, B_SHAPE, X_SHAPE = (12, 6), (6,), (12, 12)
opt = spmd.optim.adam(1e-2)


def state_like(mesh, w_spec, b_spec, fill=None):
    \"\"\"The training state on ``mesh``: zeros, or ``fill``'s values when given.\"\"\"
    def put(shape, spec, value):
        v = np.zeros(shape, np.float32) if value is None else value
        return spmd.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda i: v[i])
    fill = fill or {}
    params = {"w": put(W_SHAPE, w_spec, fill.get("w")), "b": put(B_SHAPE, b_spec, fill.get("b"))}
    return {"params": params, "opt": opt.init(params), "seen": np.zeros(5, np.int64)}


def as_numpy(tree):
    \"\"\"Every leaf's global value (a collective: every rank calls it).\"\"\"
    return [np.asarray(spmd.process_allgather(x)) if isinstance(x, spmd.Array) and
            isinstance(x.sharding, NamedSharding) else np.asarray(x)
            for x in spmd.tree_util.tree_leaves(tree)]
"""

_SAVE = _STATE + """
import json, socket, sys
from spmd import checkpointing as ckpt

directory, expected = sys.argv[1], sys.argv[2]
mesh = spmd.make_mesh((2, 2), ("data", "model"))
rng = np.random.default_rng(0)
state = state_like(mesh, P("data", "model"), P("model"),
                   {"w": rng.standard_normal(W_SHAPE).astype(np.float32),
                     "b": rng.standard_normal(B_SHAPE).astype(np.float32)})
X = rng.standard_normal(X_SHAPE).astype(np.float32)
x = spmd.make_array_from_callback(X_SHAPE, NamedSharding(mesh, P("data", None)), lambda i: X[i])


def loss(params, x):
    return snp.mean((x @ params["w"] + params["b"]) ** 2)


@spmd.jit
def train_step(params, opt_state, x):
    grads = spmd.grad(loss)(params, x)
    updates, opt_state = opt.update(grads, opt_state, params)
    return spmd.optim.apply_updates(params, updates), opt_state


for step in (1, 2):
    params, opt_state = train_step(state["params"], state["opt"], x)
    state = {"params": params, "opt": opt_state, "seen": np.arange(5, dtype=np.int64) * step}
    ckpt.save(directory, state, step=step)
    values = as_numpy(state)
    if spmd.process_index() == 0:
        np.savez(f"{expected}/step{step}.npz", *values)
with open(f"{expected}/saved.{spmd.process_index()}.json", "w") as f:
    json.dump([spmd.process_index(), socket.gethostname()], f)
"""

_RESTORE_3 = _STATE + """
import json, os, socket, sys
from mpi4py import MPI
from spmd import checkpointing as ckpt

directory, expected = sys.argv[1], sys.argv[2]
mesh = spmd.make_mesh((3,), ("i",))
target = state_like(mesh, P("i", None), P("i"))


def check(restored, step):
    \"\"\"Each block this rank holds, and each unplaced leaf, equals the saved value.\"\"\"
    want = np.load(f"{expected}/step{step}.npz")
    leaves = spmd.tree_util.tree_leaves(restored)
    assert len(leaves) == len(want.files), (len(leaves), want.files)
    for k, leaf in enumerate(leaves):
        w = want[f"arr_{k}"]
        if isinstance(leaf, spmd.Array) and isinstance(leaf.sharding, NamedSharding):
            assert leaf.sharding.mesh == mesh
            for s in leaf.addressable_shards:
                np.testing.assert_array_equal(np.asarray(s.data), w[s.index], err_msg=f"leaf {k}")
        else:
            np.testing.assert_array_equal(np.asarray(leaf), w, err_msg=f"leaf {k}")
        assert np.dtype(leaf.dtype) == w.dtype, (k, leaf.dtype, w.dtype)


for step in (1, 2):
    check(ckpt.restore(directory, target, step=step), step)

# Damage step 2: truncate the chunk of w that node1's rank wrote (block [6:12, 0:3]).
MPI.COMM_WORLD.Barrier()
if spmd.process_index() == 0:
    meta = ckpt.saved_metadata(directory, 2)
    leaf = next(l for l in meta["leaves"] if l["path"] == "['params']['w']")
    chunk = os.path.join(ckpt.step_dir(directory, 2), leaf["file"], "c", "1", "0")
    with open(chunk, "r+b") as f:
        f.truncate(100)
MPI.COMM_WORLD.Barrier()
try:
    ckpt.restore(directory, target, step=2)
    error = None
except ckpt.CheckpointError as e:
    error = str(e)
latest = ckpt.latest_step(directory)
check(ckpt.restore(directory, target), 1)
with open(f"{expected}/restored.{spmd.process_index()}.json", "w") as f:
    json.dump([spmd.process_index(), socket.gethostname(), error, latest], f)
"""


def _rows(directory, tag: str) -> list:
    """The rows the ranks wrote to ``<tag>.<rank>.json`` (files, not the job's output:
    lines of different ranks may interleave there), by rank."""
    return sorted(json.loads(p.read_text()) for p in directory.glob(f"{tag}.*.json"))


def _restore_in_one_process(directory, expected, spmd_mesh):
    """Restore both steps in this process (one node, 8 simulated devices), placed
    another way again, and compare every leaf with what was saved."""
    mesh = spmd_mesh((4, 2), ("x", "y"))
    shardings = {"w": NamedSharding(mesh, P("x", "y")), "b": NamedSharding(mesh, P("y"))}
    params = {k: spmd.make_array_from_callback(shape, s, lambda i, shape=shape:
                                               np.zeros(shape, np.float32)[i])
              for (k, s), shape in zip(shardings.items(), [(12, 6), (6,)])}
    target = {"params": params, "opt": spmd.optim.adam(1e-2).init(params),
              "seen": np.zeros(5, np.int64)}
    for step in (1, 2):
        want = np.load(expected / f"step{step}.npz")
        restored = ckpt.restore(str(directory), target, step=step)
        leaves = spmd.tree_util.tree_leaves(restored)
        assert len(leaves) == len(want.files) == 8
        for k, leaf in enumerate(leaves):
            got = np.asarray(leaf)
            assert got.dtype == want[f"arr_{k}"].dtype
            np.testing.assert_array_equal(got, want[f"arr_{k}"], err_msg=f"step {step} leaf {k}")
        assert {k: v.sharding for k, v in restored["params"].items()} == shardings


def test_saved_on_2_nodes_restores_on_1_and_on_3_nodes(make_nodes, tmp_path, spmd_mesh):
    directory, expected = tmp_path / "ckpt", tmp_path / "expected"
    expected.mkdir()
    (tmp_path / "save.py").write_text(_SAVE)
    (tmp_path / "restore3.py").write_text(_RESTORE_3)

    two = make_nodes(2)
    out = python(two, 2, tmp_path / "save.py", directory, expected)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert _rows(expected, "saved") == [[0, "node0"], [1, "node0"], [2, "node1"], [3, "node1"]]
    assert ckpt.latest_step(str(directory)) == 2
    assert two.leftovers() == {}

    _restore_in_one_process(directory, expected, spmd_mesh)

    three = make_nodes(3)
    out = python(three, 1, tmp_path / "restore3.py", directory, expected)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = _rows(expected, "restored")
    assert [r[:2] for r in rows] == [[0, "node0"], [1, "node1"], [2, "node2"]]
    for _, _, error, latest in rows:
        # Every rank saw the damage, named by leaf and block; step 1 is the latest intact.
        assert error is not None and "['params']['w']" in error, error
        assert "block [6:12, 0:3]" in error and "truncated" in error, error
        assert latest == 1
    assert three.leftovers() == {}
