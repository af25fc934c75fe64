"""``examples/train_mlp.py``, the main job: data- and tensor-parallel training.

- Its model in-process: the sharded loss and gradients equal the same MLP on
  one device; the gradient program holds exactly the communication the
  Megatron split promises (one forward ``psum`` over ``'model'``, one
  all-reduce over ``'data'`` per parameter plus the loss ``pmean``).
- The script itself in a subprocess: in one process on 8 and on 4 simulated
  devices, under ``mpiexec -n 4`` and under ``spmd-run -n 4`` (these two skip
  cleanly when the running interpreter has no mpiexec or mpi4py); each must
  exit 0 and print a held-out accuracy above 0.9.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import spmd
import spmd.numpy as snp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "train_mlp.py")
BIN = os.path.dirname(sys.executable)
# Launch timeouts: a run takes ~5 s alone on 2 cores; leave room for a loaded machine.
RUN_TIMEOUT = 240

needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                   reason="scikit-learn (the digits data) is not installed; "
                                          "`make venv` installs it")


def load_example():
    spec = importlib.util.spec_from_file_location("example_train_mlp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ex():
    return load_example()


def batch(n: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 64)).astype(np.float32)
    labels = rng.integers(0, 10, n)
    return x, np.eye(10, dtype=np.float32)[labels], labels.astype(np.int32)


# ------------------------------------------------------------ in-process

def test_default_mesh_shapes(ex):
    assert [ex.default_mesh_shape(n) for n in (1, 2, 4, 8)] == [(1, 1), (2, 1), (2, 2), (4, 2)]
    assert ex.mesh_shape("8,1", 8) == (8, 1)
    with pytest.raises(SystemExit, match="needs 6 devices"):
        ex.mesh_shape("3,2", 8)


def _numpy_loss(params, x, y):
    (w1, b1), (w2, b2), (w3, b3) = [(np.asarray(w, np.float64), np.asarray(b, np.float64))
                                    for w, b in params]
    h = np.maximum(x @ w1 + b1, 0)
    h = np.maximum(h @ w2 + b2, 0)
    z = h @ w3 + b3
    z = z - z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -np.mean(np.sum(y * log_p, axis=1))


@pytest.mark.skipif(spmd.device_count() < 8, reason="needs 8 simulated devices")
@pytest.mark.parametrize("shape", [(4, 2), (2, 4), (8, 1), (1, 8)])
def test_sharded_loss_and_grads_match_one_device(ex, shape):
    mesh = spmd.make_mesh(shape, ("data", "model"))
    _, _, loss = ex.make_functions(mesh, 0.05, 0.9)
    params = ex.init_params()
    x, y, _ = batch()
    value, grads = spmd.value_and_grad(loss)(params, x, y)
    np.testing.assert_allclose(float(value), _numpy_loss(params, x, y), rtol=1e-5)

    def one_device(params, x, y):
        log_p = spmd.nn.log_softmax(_plain_logits(params, x))
        return -snp.mean(snp.sum(y * log_p, axis=-1))

    want = spmd.grad(one_device)(params, x, y)
    for g, w in zip(spmd.tree_util.tree_leaves(grads), spmd.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)


def _plain_logits(params, x):
    (w1, b1), (w2, b2), (w3, b3) = params
    h = spmd.nn.relu(x @ w1 + b1)
    h = spmd.nn.relu(h @ w2 + b2)
    return h @ w3 + b3


def _collectives(program) -> Counter:
    from spmd.compiler.core.ir import ClosedProgram, Program

    names = ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute")
    found: Counter = Counter()

    def walk(p):
        p = p.program if isinstance(p, ClosedProgram) else p
        for eqn in p.eqns:
            if eqn.primitive.name in names:
                found[(eqn.primitive.name, tuple(eqn.params.get("axes", ())))] += 1
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(sub, (ClosedProgram, Program)):
                        walk(sub)

    walk(program)
    return found


@pytest.mark.skipif(spmd.device_count() < 8, reason="needs 8 simulated devices")
def test_gradient_program_communication(ex):
    mesh = spmd.make_mesh((4, 2), ("data", "model"))
    _, _, loss = ex.make_functions(mesh, 0.05, 0.9)
    params = ex.init_params()
    x, y, _ = batch()
    counts = _collectives(spmd.make_jaxpr(spmd.value_and_grad(loss))(params, x, y))
    # Forward: the Megatron psum over 'model' and the loss pmean over 'data'.
    # Backward: one all-reduce over 'data' per parameter (6), none over 'model'
    # (psum transposes to pvary; W1, b1, W2 are split over 'model').
    assert counts == Counter({("psum", ("model",)): 1, ("psum", ("data",)): 1 + 6})


@pytest.mark.skipif(spmd.device_count() < 8, reason="needs 8 simulated devices")
def test_step_and_accuracy_count(ex):
    mesh = spmd.make_mesh((4, 2), ("data", "model"))
    step, correct_count, loss = ex.make_functions(mesh, 0.05, 0.9)
    params = ex.init_params()
    velocity = spmd.tree_util.tree_map(np.zeros_like, params)
    x, y, labels = batch(64)
    first = float(loss(params, x, y))
    for _ in range(30):
        params, velocity, value = step(params, velocity, x, y)
    assert float(value) < 0.5 * first
    # The accuracy count (with padding weighted 0) against numpy's argmax.
    pred = np.asarray(_plain_logits(params, x)).argmax(axis=1)
    weight = np.ones(64, np.float32)
    weight[-4:] = 0
    got = float(correct_count(params, x, labels, weight))
    assert got == float(np.sum((pred == labels)[:-4]))


# ------------------------------------------------------------- the script

def _clean_env(**extra) -> dict:
    """This environment without the variables of an enclosing MPI launch."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _accuracy(out: str) -> float:
    m = re.search(r"held-out accuracy: ([0-9.]+)", out)
    assert m, f"no accuracy line in the output:\n{out}"
    return float(m.group(1))


def _run(cmd, **env) -> str:
    proc = subprocess.run(cmd, cwd=REPO, env=_clean_env(**env), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-4000:]}"
    return proc.stdout


@needs_sklearn
@pytest.mark.parametrize("devices,mesh", [("8", "data=4 x model=2"), ("4", "data=2 x model=2")])
def test_script_in_one_process(devices, mesh):
    out = _run([sys.executable, SCRIPT, "--epochs", "3"], SPMD_NUM_DEVICES=devices)
    assert f"mesh {mesh} over {devices} devices in 1 process(es)" in out
    assert "epoch   3/3  loss" in out
    assert _accuracy(out) > 0.9
    assert "wall time:" in out and "accuracy > 0.9: ok" in out


def _mpiexec() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return None
    local = os.path.join(BIN, "mpiexec")
    return local if os.access(local, os.X_OK) else shutil.which("mpiexec")


@needs_sklearn
def test_script_under_mpiexec():
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec or mpi4py is not available to this interpreter (`make venv`)")
    out = _run([mpiexec, "-n", "4", sys.executable, SCRIPT, "--epochs", "3"])
    assert "mesh data=2 x model=2 over 4 devices in 4 process(es)" in out
    # Rank 0 alone prints.
    assert out.count("held-out accuracy:") == 1
    assert _accuracy(out) > 0.9


@needs_sklearn
def test_script_under_spmd_run():
    if _mpiexec() is None:
        pytest.skip("mpiexec or mpi4py is not available to this interpreter (`make venv`)")
    launcher = os.path.join(BIN, "spmd-run")
    cmd = [launcher] if os.access(launcher, os.X_OK) else [sys.executable, "-m", "spmd.launch"]
    out = _run(cmd + ["-n", "4", SCRIPT, "--epochs", "3"])
    assert "over 4 devices in 4 process(es)" in out
    assert _accuracy(out) > 0.9
