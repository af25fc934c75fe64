"""The main job for now: trace, print, compile and run a small training step.

Run with ``make demo``.  It traces an MLP loss, prints the program and its
gradient program, then trains on a synthetic regression task with the jitted
gradient and checks the loss falls.
"""

import numpy as np

import spmd
import spmd.numpy as snp


def init(rng, sizes):
    return [(rng.standard_normal((m, n)).astype(np.float32) / np.sqrt(m),
             np.zeros(n, np.float32)) for m, n in zip(sizes[:-1], sizes[1:])]


def predict(params, x):
    for w, b in params[:-1]:
        x = snp.tanh(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def loss(params, x, y):
    return snp.mean((predict(params, x) - y) ** 2)


@spmd.jit
def sgd_step(params, x, y):
    value, grads = spmd.value_and_grad(loss)(params, x, y)
    new = spmd.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return new, value


def main():
    rng = np.random.default_rng(0)
    params = init(rng, [4, 32, 32, 1])
    x = rng.standard_normal((256, 4)).astype(np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)

    print("The traced loss:")
    print(spmd.make_jaxpr(loss)(params, x, y))
    print("\nThe optimised per-call program of one SGD step:")
    print(sgd_step.lower(params, x, y).as_text())

    first = None
    for step in range(300):
        params, value = sgd_step(params, x, y)
        first = float(value) if first is None else first
        if step % 50 == 0:
            print(f"step {step:3d}  loss {float(value):.4f}")
    print(f"final loss {float(value):.4f} (from {first:.4f})")
    assert float(value) < 0.5 * first, "the loss did not fall"


if __name__ == "__main__":
    main()
