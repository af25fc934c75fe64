"""Data-parallel training of an MLP on 8 simulated devices with ``shard_map``.

Run with ``python examples/data_parallel_mlp.py``.  The parameters are
replicated (``P()``), the batch is split over the mesh axis ``'batch'``
(``P('batch')``); inside the ``shard_map`` each device computes the loss of its
part of the batch and ``lax.pmean`` averages it.  ``spmd.grad`` is taken
OUTSIDE the ``shard_map``: the transpose of the replicated-parameter input is a
``psum`` over ``'batch'`` of each parameter's per-device gradient (JEP 17111),
and the loss cotangent needs no communication at all.  The data come from a
random "teacher" network plus noise; SGD drives the loss well down.
"""

from __future__ import annotations

import functools

import numpy as np

import spmd
import spmd.numpy as snp
from spmd import P, lax

N_DEVICES = 8
SIZES = (16, 64, 64, 1)
GLOBAL_BATCH = 512
LEARNING_RATE = 0.1
STEPS = 300
PRINT_EVERY = 50

mesh = spmd.make_mesh((N_DEVICES,), ("batch",))


def init_params(sizes=SIZES, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """LeCun-normal weights (variance 1/fan_in, from spmd.random) and zero biases."""
    init = spmd.nn.initializers.variance_scaling(1.0, "fan_in", "normal")
    keys = spmd.random.split(spmd.random.key(seed), len(sizes) - 1)
    return [(np.asarray(init(k, (m, n))), np.zeros(n, np.float32))
            for k, m, n in zip(keys, sizes[:-1], sizes[1:])]


def predict(params, x):
    for w, b in params[:-1]:
        x = snp.tanh(x @ w + b)
    w, b = params[-1]
    return x @ w + b


@functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("batch"), P("batch")),
                   out_specs=P())
def loss(params, x, y):
    """The mean squared error over the global batch; each device sees its rows only."""
    local = snp.mean((predict(params, x) - y) ** 2)
    return lax.pmean(local, "batch")


@spmd.jit
def train_step(params, x, y):
    value, grads = spmd.value_and_grad(loss)(params, x, y)
    new = spmd.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return new, value


def make_data(n: int = GLOBAL_BATCH, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets from a random teacher MLP, with a little noise."""
    rng = np.random.default_rng(seed)
    teacher = init_params(SIZES, seed=seed + 100)
    x = rng.standard_normal((n, SIZES[0])).astype(np.float32)
    h = x
    for w, b in teacher[:-1]:
        h = np.tanh(h @ (2.0 * w) + rng.standard_normal(b.shape).astype(np.float32) * 0.1)
    y = h @ teacher[-1][0] * 2.0
    y = (y + 0.05 * rng.standard_normal(y.shape)).astype(np.float32)
    return x, y


def count_collectives(program) -> dict[str, int]:
    """Equations per collective name, counted inside nested programs too."""
    from spmd.compiler.core.ir import ClosedProgram, Program

    names = ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute")
    counts = dict.fromkeys(names, 0)

    def walk(p):
        p = p.program if isinstance(p, ClosedProgram) else p
        for eqn in p.eqns:
            if eqn.primitive.name in counts:
                counts[eqn.primitive.name] += 1
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(sub, (ClosedProgram, Program)):
                        walk(sub)

    walk(program)
    return counts


def main() -> None:
    params = init_params()
    x, y = make_data()
    grad_program = spmd.make_jaxpr(spmd.value_and_grad(loss))(params, x, y)
    counts = count_collectives(grad_program)
    n_params = len(spmd.tree_util.tree_leaves(params))
    print(f"psum equations in the value_and_grad program: {counts['psum']} "
          f"({n_params} parameters + 1 forward pmean); other collectives: "
          f"{sum(counts.values()) - counts['psum']}")

    losses = []
    for step in range(STEPS):
        params, value = train_step(params, x, y)
        losses.append(float(value))
        if step % PRINT_EVERY == 0 or step == STEPS - 1:
            print(f"step {step:4d}  loss {losses[-1]:.5f}")
    # The sharded loss of the trained parameters against numpy on the whole batch.
    ref = np.mean((_predict_numpy(params, x) - y) ** 2)
    np.testing.assert_allclose(float(loss(params, x, y)), ref, rtol=1e-4)
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    print(f"final loss {losses[-1]:.5f} < 0.5 x first loss {losses[0]:.5f}: ok")


def _predict_numpy(params, x):
    params = [(np.asarray(w), np.asarray(b)) for w, b in params]
    for w, b in params[:-1]:
        x = np.tanh(x @ w + b)
    w, b = params[-1]
    return x @ w + b


if __name__ == "__main__":
    main()
