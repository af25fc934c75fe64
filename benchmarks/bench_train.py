"""One SGD training step of an MLP: ``spmd.jit(value_and_grad)`` against numpy.

Measured (all in one process, variants interleaved):

- ``train_step[batch=B]``: one SGD step of the 784-512-512-10 tanh MLP in
  float32 with softmax cross-entropy on one-hot labels.  The spmd step is
  what a user writes: the loss through ``spmd.nn.log_softmax``, its gradient
  by ``spmd.value_and_grad``, the update by ``tree_map``, all under one
  ``spmd.jit``.  The floor is the same step written by hand in numpy: the
  forward pass, the textbook backward pass (``softmax - y``, ``h.T @ g``,
  ``g @ w.T``, ``1 - h**2``) and the update, reusing temporaries where a
  competent numpy user would (in-place ``*=``, ``out=``).  Both are
  functional: they return the loss and new parameters, leaving their inputs
  alone.  Goals: ratio <= 1.15 at batch 256, <= 1.05 at batch 2048.
- ``trace_compile[train_step]``: the first call of a fresh ``spmd.jit(step)``
  minus a steady call (tracing, autodiff, passes, code generation).

Run it alone with ``python benchmarks/run.py train`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import numpy as np

from common import first_call_times, interleave, row

import spmd
import spmd.numpy as snp

from bench_mlp import SIZES, make_params  # noqa: F401  (the same model and weights)

LR = 0.1


def make_batch(batch: int, rng) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
    labels = rng.integers(0, SIZES[-1], batch)
    return x, np.eye(SIZES[-1], dtype=np.float32)[labels]


# ------------------------------------------------------------------- spmd

def mlp(params, x):
    *hidden, (w_out, b_out) = params
    for w, b in hidden:
        x = snp.tanh(snp.dot(x, w) + b)
    return snp.dot(x, w_out) + b_out


def loss_fn(params, x, y):
    """Mean softmax cross-entropy of one-hot labels ``y``."""
    logp = spmd.nn.log_softmax(mlp(params, x))
    return -snp.mean(snp.sum(y * logp, axis=-1))


def step_spmd(params, x, y):
    """One SGD step as a user writes it: returns the loss and the new parameters."""
    loss, grads = spmd.value_and_grad(loss_fn)(params, x, y)
    return loss, spmd.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)


# ------------------------------------------------------------------ numpy

def step_numpy(params, x, y, xp=np, lr=LR):
    """The floor: the same step by hand (forward, manual backward, update), over the
    array module ``xp`` (numpy here; CuPy in bench_gpu)."""
    (w1, b1), (w2, b2), (w3, b3) = params
    n = x.shape[0]
    h1 = xp.tanh(x @ w1 + b1)
    h2 = xp.tanh(h1 @ w2 + b2)
    z = h2 @ w3 + b3
    z -= z.max(axis=1, keepdims=True)
    e = xp.exp(z)
    s = e.sum(axis=1, keepdims=True)
    loss = -(y * (z - xp.log(s))).sum() / n
    # d loss / d z = (softmax(z) - y) / n  (each row of y sums to 1)
    dz = xp.divide(e, s, out=e)
    dz -= y
    dz /= n
    gw3, gb3 = h2.T @ dz, dz.sum(axis=0)
    dh = dz @ w3.T
    dh *= 1 - h2 * h2
    gw2, gb2 = h1.T @ dh, dh.sum(axis=0)
    dh = dh @ w2.T
    dh *= 1 - h1 * h1
    gw1, gb1 = x.T @ dh, dh.sum(axis=0)
    new = []
    for (w, b), (gw, gb) in zip(params, ((gw1, gb1), (gw2, gb2), (gw3, gb3))):
        gw *= lr
        gb *= lr
        new.append((xp.subtract(w, gw, out=gw), xp.subtract(b, gb, out=gb)))
    return loss, new


# -------------------------------------------------------------- benchmarks

def check_same(jf, params, x, y) -> None:
    """The two steps compute the same loss and the same updated parameters."""
    loss_j, new_j = jf(params, x, y)
    loss_n, new_n = step_numpy(params, x, y)
    np.testing.assert_allclose(float(loss_j), float(loss_n), rtol=1e-5)
    for (wj, bj), (wn, bn) in zip(new_j, new_n):
        np.testing.assert_allclose(np.asarray(wj), wn, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(bj), bn, rtol=1e-4, atol=1e-6)


def _bench_step(batch: int, goal: float, repeats: int, rng) -> list[dict]:
    params = make_params()
    x, y = make_batch(batch, rng)
    jf = spmd.jit(step_spmd)
    check_same(jf, params, x, y)  # a benchmark of a wrong result is worthless
    times = interleave({"numpy": lambda: step_numpy(params, x, y),
                        "spmd.jit": lambda: jf(params, x, y)},
                       repeats=repeats, target_s=0.004)
    name = f"train_step[batch={batch}]"
    return [row(name, "numpy", times["numpy"]),
            row(name, "spmd.jit", times["spmd.jit"], baseline="numpy", goal_ratio=goal)]


def _bench_compile(repeats: int, rng) -> list[dict]:
    params = make_params()
    x, y = make_batch(256, rng)

    def make():
        jf = spmd.jit(step_spmd)  # fresh: its cache is empty, so the first call traces
        return lambda: jf(params, x, y)

    firsts, steadies = first_call_times(make, repeats=repeats, steady_calls=5)
    return [row("trace_compile[train_step]", "first call", firsts),
            row("trace_compile[train_step]", "steady call", steadies),
            row("trace_compile[train_step]", "trace+compile",
                [f - s for f, s in zip(firsts, steadies)], note="first call minus steady call")]


def run(quick: bool = False) -> list[dict]:
    rng = np.random.default_rng(2)
    scale = 4 if quick else 1
    rows = []
    # About 10 s in all on an idle 2-core machine (a quarter of that with quick=True).
    rows += _bench_step(256, 1.15, repeats=120 // scale, rng=rng)
    rows += _bench_step(2048, 1.05, repeats=40 // scale, rng=rng)
    rows += _bench_compile(repeats=20 // scale, rng=rng)
    return rows


if __name__ == "__main__":
    import sys

    from common import summarize, table

    print(table(summarize(run(quick="--quick" in sys.argv))))
