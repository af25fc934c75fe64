"""The shard_map examples run, and the programs they build carry exactly the
communication JEP 17111 promises (counted in the printed programs, nested
programs included).

- ``examples/shard_map_matmuls.py`` and ``examples/data_parallel_mlp.py`` run
  in a subprocess, exit 0 and print their check lines.
- The data-parallel gradient holds one ``psum`` per parameter (plus the forward
  ``pmean``'s when the loss value is computed too) and no other collective.
- ``grad`` of ``matmul_basic`` adds exactly one ``psum`` (over ``'i'``, for ``b``).
- Transposing ``shard_map(lambda x: x, P(), P())``, and transposing that again,
  adds no communication.
- ``grad`` of ``psum(g(x), 'i')`` over ``P('i')`` inputs adds no collective: the
  transpose of ``psum`` is ``pvary``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.compiler.core.ir import ClosedProgram, Program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
COLLECTIVES = ("psum", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute")

pytestmark = pytest.mark.skipif(spmd.device_count() < 8,
                                reason="the examples use meshes of 8 simulated devices")


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def matmuls():
    return load_example("shard_map_matmuls")


@pytest.fixture(scope="module")
def dp():
    return load_example("data_parallel_mlp")


# ---------------------------------------------------------------- helpers

def _sub_programs(value):
    """The programs held by one eqn parameter (a program, or a tuple of them)."""
    if isinstance(value, (ClosedProgram, Program)):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_programs(v)


def collective_eqns(program) -> list:
    """Every collective equation of ``program`` and of the programs nested in its params."""
    program = program.program if isinstance(program, ClosedProgram) else program
    found = []
    for eqn in program.eqns:
        if eqn.primitive.name in COLLECTIVES:
            found.append(eqn)
        for value in eqn.params.values():
            for sub in _sub_programs(value):
                found += collective_eqns(sub)
    return found


def collective_counts(program) -> Counter:
    """``Counter({(name, axes): count})`` over the collectives of ``program``."""
    return Counter((e.primitive.name, tuple(e.params.get("axes", ())))
                   for e in collective_eqns(program))


def test_collective_counter_sees_nested_programs():
    mesh = spmd.make_mesh((8,), ("i",))
    f = spmd.shard_map(lambda x: lax.cond(True, lambda v: lax.psum(v, "i"),
                                          lambda v: lax.psum(v * 2.0, "i"), x),
                       mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    counts = collective_counts(spmd.make_jaxpr(spmd.jit(f))(np.ones(8, np.float32)))
    assert counts == Counter({("psum", ("i",)): 2})


# ----------------------------------------------------------- the scripts

def run_script(name: str, timeout: float = 300) -> str:
    env = dict(os.environ, SPMD_NUM_DEVICES="8",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, f"{name}.py")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_matmuls_script_runs():
    out = run_script("shard_map_matmuls")
    for name in ("matmul_basic", "matmul_reduce_scatter", "matmul_allgather",
                 "collective_matmul"):
        assert f"{name}: ok" in out
    assert "shard_map[program=" in out and "psum[axes=('j',)]" in out


def test_data_parallel_script_runs():
    out = run_script("data_parallel_mlp")
    assert "psum equations in the value_and_grad program: 7 (6 parameters" in out
    assert "other collectives: 0" in out
    assert "step    0  loss" in out
    assert "< 0.5 x first loss" in out and out.rstrip().endswith(": ok")


# ------------------------------------------------- the examples' programs

def test_matmul_programs_against_numpy(matmuls):
    for fn, shapes in [(matmuls.matmul_basic, (8, 16, 4)),
                       (matmuls.matmul_reduce_scatter, (8, 16, 8)),
                       (matmuls.matmul_allgather, (16, 32, 8)),
                       (matmuls.collective_matmul, (16, 8, 32))]:
        a, b = matmuls.operands(*shapes, seed=3)
        np.testing.assert_allclose(np.asarray(fn(a, b)), a @ b, rtol=1e-4, atol=1e-4)


def test_matmul_collectives(matmuls):
    a, b = matmuls.operands(8, 16, 8)
    count = lambda f: collective_counts(spmd.make_jaxpr(f)(a, b))  # noqa: E731
    assert count(matmuls.matmul_basic) == Counter({("psum", ("j",)): 1})
    assert count(matmuls.matmul_reduce_scatter) == Counter({("psum_scatter", ("j",)): 1})
    a, b = matmuls.operands(16, 8, 32)
    assert count(matmuls.matmul_allgather) == Counter({("all_gather", ("i",)): 1})
    # One ppermute in the loop body, none for the last chunk.
    assert count(matmuls.collective_matmul) == Counter({("ppermute", ("i",)): 1})


def test_grad_of_matmul_basic_has_one_backward_psum(matmuls):
    a, b = matmuls.operands(8, 16, 4)
    loss = lambda a, b: snp.sum(matmuls.matmul_basic(a, b) ** 2)  # noqa: E731
    grad_prog = spmd.make_jaxpr(spmd.grad(loss, argnums=(0, 1)))(a, b)
    # The forward psum over 'j' (the loss needs c) and one backward psum over 'i':
    # b is replicated over 'i', so its cotangent sums over 'i'; a's needs none.
    assert collective_counts(grad_prog) == Counter({("psum", ("j",)): 1,
                                                    ("psum", ("i",)): 1})
    # The backward pass alone.
    _, f_vjp = spmd.vjp(matmuls.matmul_basic, a, b)
    ct = np.ones((8, 4), np.float32)
    assert collective_counts(spmd.make_jaxpr(f_vjp)(ct)) == Counter({("psum", ("i",)): 1})
    ga, gb = spmd.grad(loss, argnums=(0, 1))(a, b)
    c = a @ b
    np.testing.assert_allclose(np.asarray(ga), 2 * c @ b.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gb), a.T @ (2 * c), rtol=1e-4, atol=1e-4)


def test_data_parallel_gradient_collectives(dp):
    params = dp.init_params()
    x, y = dp.make_data(64)
    n_params = len(spmd.tree_util.tree_leaves(params))
    vg = collective_counts(spmd.make_jaxpr(spmd.value_and_grad(dp.loss))(params, x, y))
    # One all-reduce per parameter gradient plus the forward pmean's, nothing else;
    # in particular none on the loss cotangent (pmean transposes to pvary).
    assert vg == Counter({("psum", ("batch",)): n_params + 1})
    # grad alone does not need the loss value: the forward pmean is dead code.
    g = collective_counts(spmd.make_jaxpr(spmd.grad(dp.loss))(params, x, y))
    assert g == Counter({("psum", ("batch",)): n_params})
    # The example's own counter agrees.
    assert dp.count_collectives(spmd.make_jaxpr(spmd.value_and_grad(dp.loss))(params, x, y)) \
        == {"psum": n_params + 1, "all_gather": 0, "psum_scatter": 0, "all_to_all": 0,
            "ppermute": 0}


def test_data_parallel_gradient_matches_single_device(dp):
    params = dp.init_params()
    x, y = dp.make_data(64)

    def loss_one_device(params, x, y):
        return snp.mean((dp.predict(params, x) - y) ** 2)

    got = spmd.grad(dp.loss)(params, x, y)
    want = spmd.grad(loss_one_device)(params, x, y)
    for g, w in zip(spmd.tree_util.tree_leaves(got), spmd.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def test_data_parallel_training_loss_falls(dp):
    params = dp.init_params()
    x, y = dp.make_data(256)
    first = None
    for _ in range(60):
        params, value = dp.train_step(params, x, y)
        first = float(value) if first is None else first
    assert float(value) < 0.5 * first


def test_transpose_of_replicated_identity_has_no_collective():
    mesh = spmd.make_mesh((8,), ("i",))
    ident = spmd.shard_map(lambda x: x, mesh=mesh, in_specs=P(), out_specs=P())
    x = np.arange(16, dtype=np.float32)
    _, transpose = spmd.vjp(ident, x)
    assert collective_counts(spmd.make_jaxpr(transpose)(x)) == Counter()
    # The transpose of the transpose (the vjp of the linear function `transpose`).
    _, transpose2 = spmd.vjp(transpose, x)
    assert collective_counts(spmd.make_jaxpr(transpose2)((x,))) == Counter()
    (back,) = transpose2((x,))
    np.testing.assert_array_equal(np.asarray(back), x)


def test_grad_of_psum_has_only_the_forward_psum():
    mesh = spmd.make_mesh((8,), ("i",))
    f = spmd.shard_map(lambda x: lax.psum(snp.sum(snp.sin(x)), "i"), mesh=mesh,
                       in_specs=P("i"), out_specs=P())
    x = np.linspace(-2, 2, 16, dtype=np.float32)
    # The value needs the forward psum; its transpose is pvary: no backward collective.
    vg = collective_counts(spmd.make_jaxpr(spmd.value_and_grad(f))(x))
    assert vg == Counter({("psum", ("i",)): 1})
    # grad drops the unused forward value, and with it the only psum.
    assert collective_counts(spmd.make_jaxpr(spmd.grad(f))(x)) == Counter()
    np.testing.assert_allclose(np.asarray(spmd.grad(f)(x)), np.cos(x), rtol=1e-6)
