"""A jitted MLP against hand-written numpy; per-call overhead; trace+compile time.

Measured (all in one process, variants interleaved):

- ``mlp_forward[batch=B]``: a 784-512-512-10 tanh MLP forward pass in float32,
  ``spmd.jit`` against the same computation written directly in numpy
  (goals: ratio <= 1.15 at batch 32, <= 1.05 at batch 1024).  A diagnostic
  third variant calls the generated code directly on the flat arrays, which
  separates the cost of the code from that of the call's argument handling.
- ``call[N eqn]``: a jitted chain of ``N`` additions ``x + float32(1)`` on a float32[4]
  argument (N = 1, 100) against the same Python function run on numpy.
- ``per_equation``: the slope between the two, (t(100) - t(1)) / 99 per
  sample pair: what one more equation costs.  DESIGN.md section 8 asks for no
  per-equation interpretation, so the jitted slope should match numpy's
  (goal: ratio <= 1.2).
- ``trace_compile[mlp]``: the first call of a fresh ``spmd.jit(f)`` minus a
  steady call of the same function: tracing, passes and code generation.

Run it alone with ``python benchmarks/run.py mlp`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import numpy as np

from common import first_call_times, interleave, row

import spmd
import spmd.numpy as snp

SIZES = (784, 512, 512, 10)


def make_params(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = (0.1 * rng.standard_normal(n_out)).astype(np.float32)
        params.append((w, b))
    return params


def mlp_spmd(params, x):
    """The model as a user writes it with spmd.numpy."""
    *hidden, (w_out, b_out) = params
    for w, b in hidden:
        x = snp.tanh(snp.dot(x, w) + b)
    return snp.dot(x, w_out) + b_out


def mlp_numpy(params, x):
    """The floor: the same computation written directly in numpy."""
    (w1, b1), (w2, b2), (w3, b3) = params
    h = np.tanh(x @ w1 + b1)
    h = np.tanh(h @ w2 + b2)
    return h @ w3 + b3


# A float32 constant on both sides: the jitted code adds a float32 literal, and a
# Python float would cost the numpy baseline a conversion per operation (about
# 96 against 63 us per 100 operations), flattering the jitted side.
ONE = np.float32(1.0)


def chain(n: int):
    """A function of ``n`` additions that cannot be constant-folded (x is an argument)."""
    def f(x):
        for _ in range(n):
            x = x + ONE
        return x

    f.__name__ = f"chain{n}"
    return f


def _bench_mlp(batch: int, goal: float, repeats: int, rng) -> list[dict]:
    params = make_params()
    x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
    jf = spmd.jit(mlp_spmd)
    # Same numbers first: a benchmark of a wrong result is worthless.
    np.testing.assert_allclose(np.asarray(jf(params, x)), mlp_numpy(params, x),
                               rtol=2e-4, atol=2e-5)
    # The generated code alone, called on the flat list of arrays: the part of
    # a jitted call that is not argument handling (flatten, cache lookup, wrap).
    generated = jf.lower(params, x).compile()._entry.exe
    leaves = spmd.tree_util.tree_leaves((params, x))
    times = interleave({"numpy": lambda: mlp_numpy(params, x),
                        "spmd.jit": lambda: jf(params, x),
                        "generated code": lambda: generated(*leaves)},
                       repeats=repeats, target_s=0.004)
    name = f"mlp_forward[batch={batch}]"
    return [row(name, "numpy", times["numpy"]),
            row(name, "spmd.jit", times["spmd.jit"], baseline="numpy", goal_ratio=goal),
            row(name, "generated code", times["generated code"], baseline="numpy",
                note="the compiled program called directly on flat arrays (diagnostic)")]


def _bench_overhead(repeats: int) -> list[dict]:
    x = np.zeros(4, np.float32)
    f1, f100 = chain(1), chain(100)
    j1, j100 = spmd.jit(f1), spmd.jit(f100)
    np.testing.assert_array_equal(np.asarray(j100(x)), f100(x))
    times = interleave({"numpy1": lambda: f1(x), "jit1": lambda: j1(x),
                        "numpy100": lambda: f100(x), "jit100": lambda: j100(x)},
                       repeats=repeats, target_s=0.002)
    slope = lambda a, b: [(t100 - t1) / 99 for t1, t100 in zip(times[a], times[b])]
    note = "x + float32(1) chain on float32[4]"
    return [
        row("call[1 eqn]", "python+numpy", times["numpy1"], unit="us", note=note),
        row("call[1 eqn]", "spmd.jit", times["jit1"], baseline="python+numpy", unit="us",
            goal_max_s=20e-6, note=note),
        row("call[100 eqn]", "python+numpy", times["numpy100"], unit="us", note=note),
        row("call[100 eqn]", "spmd.jit", times["jit100"], baseline="python+numpy", unit="us",
            note=note),
        row("per_equation", "python+numpy", slope("numpy1", "numpy100"), unit="us",
            note="(t100 - t1) / 99"),
        row("per_equation", "spmd.jit", slope("jit1", "jit100"), baseline="python+numpy",
            unit="us", goal_ratio=1.2, note="(t100 - t1) / 99"),
    ]


def _bench_compile(repeats: int, rng) -> list[dict]:
    params = make_params()
    x = rng.standard_normal((32, SIZES[0])).astype(np.float32)

    def make():
        jf = spmd.jit(mlp_spmd)  # fresh: its cache is empty, so the first call traces
        return lambda: jf(params, x)

    firsts, steadies = first_call_times(make, repeats=repeats)
    return [row("trace_compile[mlp]", "first call", firsts),
            row("trace_compile[mlp]", "steady call", steadies),
            row("trace_compile[mlp]", "trace+compile", [f - s for f, s in zip(firsts, steadies)],
                note="first call minus steady call")]


def run(quick: bool = False) -> list[dict]:
    rng = np.random.default_rng(1)
    scale = 4 if quick else 1
    rows = []
    # About 15 s in all on 2 cores (a quarter of that with quick=True).
    rows += _bench_mlp(32, 1.15, repeats=300 // scale, rng=rng)
    rows += _bench_mlp(1024, 1.05, repeats=100 // scale, rng=rng)
    rows += _bench_overhead(repeats=500 // scale)
    rows += _bench_compile(repeats=60 // scale, rng=rng)
    return rows


if __name__ == "__main__":
    import sys

    from common import summarize, table

    print(table(summarize(run(quick="--quick" in sys.argv))))
