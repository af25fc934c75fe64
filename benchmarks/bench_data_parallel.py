"""Data-parallel training step on 8 simulated devices against the same step on one.

Measured (in one process, variants interleaved), for global batches 256 and 2048:

- ``dp_train_step[form=..., batch=B]``: one SGD step of a 784-512-512-10 tanh MLP
  with softmax cross-entropy in float32.  Variants:

  - ``1 device``: ``spmd.jit`` of ``value_and_grad`` of the plain loss (the baseline);
  - ``8 devices``: the same step on a mesh of 8 simulated devices (the local
    backend runs them as one stacked program), written in one of the two forms
    users write:

    - ``grad outside``: ``value_and_grad`` of a ``shard_map``'ed loss whose local
      losses are ``lax.pmean``'ed (the JAX tutorial's form);
    - ``grad inside``: a jitted ``shard_map`` whose body takes ``value_and_grad``
      of the local loss and ``lax.pmean``s each gradient, then updates (the form
      DDP-style code has; ``check_vma=False``, since with typed axes the gradient
      of an invariant parameter is already the sum over devices);

    goal: ratio <= 1.3 at batch 256, <= 1.15 at batch 2048 (issue 12);
  - ``8 devices generated code`` (diagnostic): the compiled program called on flat arrays;
  - ``numpy`` (diagnostic): the step written by hand in numpy, the compute floor.

Run it alone with ``python benchmarks/run.py data_parallel`` (``--quick`` for a
smoke run).  ``python benchmarks/bench_data_parallel.py --source`` prints the
generated code of the jitted steps.
"""

from __future__ import annotations

import numpy as np

import dp_step
from common import interleave, row

import spmd

BATCHES = (256, 2048)
GOALS = {256: 1.3, 2048: 1.15}
N_DEVICES = 8
SIZES, LR = dp_step.SIZES, dp_step.LR
make_params, make_batch = dp_step.make_params, dp_step.make_batch


def make_steps(mesh) -> dict:
    """``{name: jitted step}``: one device, and 8 devices in the two forms
    (benchmarks/dp_step.py)."""
    return dp_step.make_steps(mesh, "batch")


def step_numpy(params, x, y):
    """The floor: forward and backward of the same step written directly in numpy."""
    (w1, b1), (w2, b2), (w3, b3) = params
    h1 = np.tanh(x @ w1 + b1)
    h2 = np.tanh(h1 @ w2 + b2)
    logits = h2 @ w3 + b3
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=-1, keepdims=True)
    logp = logits - m - np.log(s)
    n = x.shape[0]
    value = -np.sum(y * logp) / n
    g_logits = (e / s * y.sum(axis=-1, keepdims=True) - y) / n
    g_w3, g_b3 = h2.T @ g_logits, g_logits.sum(0)
    g_h2 = (g_logits @ w3.T) * (1 - h2 * h2)
    g_w2, g_b2 = h1.T @ g_h2, g_h2.sum(0)
    g_h1 = (g_h2 @ w2.T) * (1 - h1 * h1)
    g_w1, g_b1 = x.T @ g_h1, g_h1.sum(0)
    grads = [(g_w1, g_b1), (g_w2, g_b2), (g_w3, g_b3)]
    return [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, grads)], value


def _check_same(steps, params, x, y) -> None:
    """Every step computes the same new parameters and loss as the numpy step."""
    ref_leaves = spmd.tree_util.tree_leaves(step_numpy(params, x, y))
    for name, step in steps.items():
        for got, want in zip(spmd.tree_util.tree_leaves(step(params, x, y)), ref_leaves):
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-5,
                                       err_msg=name)


def run(quick: bool = False) -> list[dict]:
    mesh = spmd.make_mesh((N_DEVICES,), ("batch",))
    steps = make_steps(mesh)
    params = make_params()
    rows = []
    for batch in BATCHES:
        x, y = make_batch(batch)
        _check_same(steps, params, x, y)
        leaves = spmd.tree_util.tree_leaves((params, x, y))
        for form in ("grad outside", "grad inside"):
            step = steps[form]
            generated = step.lower(params, x, y).compile()._entry.exe
            one = steps["1 device"]
            times = interleave({"1 device": lambda: one(params, x, y),
                                "8 devices": lambda: step(params, x, y),
                                "8 devices code": lambda: generated(*leaves),
                                "numpy": lambda: step_numpy(params, x, y)},
                               repeats=8 if quick else 30, target_s=0.05)
            name = f"dp_train_step[{form}, batch={batch}]"
            rows += [row(name, "1 device", times["1 device"],
                         note="spmd.jit(value_and_grad(loss)) + SGD, no shard_map"),
                     row(name, "8 devices", times["8 devices"], baseline="1 device",
                         goal_ratio=GOALS[batch], note=f"{form} a shard_map over 8 "
                         "simulated devices, pmean"),
                     row(name, "8 devices generated code", times["8 devices code"],
                         baseline="1 device",
                         note="the compiled program on flat arrays (diagnostic)"),
                     row(name, "numpy", times["numpy"], baseline="1 device",
                         note="hand-written numpy step (diagnostic floor)")]
    return rows


def print_sources() -> None:
    mesh = spmd.make_mesh((N_DEVICES,), ("batch",))
    params = make_params()
    x, y = make_batch(BATCHES[0])
    for name, step in make_steps(mesh).items():
        print(f"# ---- {name}\n{step.lower(params, x, y).compile().source}")


if __name__ == "__main__":
    import sys

    from common import summarize, table

    if "--source" in sys.argv:
        print_sources()
    else:
        print(table(summarize(run(quick="--quick" in sys.argv))))
