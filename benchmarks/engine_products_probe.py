"""Where do the transformer step's products lose time?  (A diagnostic for the engine.)

On a simulated mesh the generated code runs every device's product stacked, one
numpy/BLAS call over all of them; the per-line profile showed those calls taking
longer inside the step than the same calls timed alone.  This script runs the
transformer step of ``bench_engine.py`` (``--config``, ``--mesh``), with each
``dot_general`` of the generated code wrapped to add up its time, then calls each
product of the last step again on the same operands:

- ``in the step``: the products' time inside 10 steps (per step);
- ``repeated``: each product called again right after itself (operands and
  result buffers warm in the caches), the median of 20, summed;
- ``caches flushed``: each product after a pass over 64 MiB (operands in memory
  only), the median of 10, summed.

Run with the benchmark venv (``make bench-engine`` builds it; only spmd is used)::

    .venv-bench/bin/python benchmarks/engine_products_probe.py --config small --mesh 4x2

Nothing is saved; the numbers only decide what to build (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("SPMD_NUM_DEVICES", "8")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")  # as bench_engine.py sets it
HERE = os.path.dirname(os.path.abspath(__file__))
for p in (HERE, os.path.dirname(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402

import spmd.compiler.engine.codegen as codegen  # noqa: E402

_clock = time.perf_counter
_spent = {"s": 0.0, "calls": 0}
_last: dict = {}  # each product's function and its last operands


def _timing(compile_program):
    """``compile_program`` whose programs add up the time of their products."""
    def compile_and_wrap(closed, xp=np, name="program", **kwargs):
        ex = compile_program(closed, xp, name, **kwargs)
        names = ex.fn.__globals__
        for key, fn in list(names.items()):
            if key.startswith("_dot_general_"):
                def timed(*args, _fn=fn, _key=key, **kwargs):
                    t0 = _clock()
                    out = _fn(*args, **kwargs)
                    _spent["s"] += _clock() - t0
                    _spent["calls"] += 1
                    _last[_key] = (_fn, args, kwargs)
                    return out
                names[key] = timed
        return ex

    return compile_and_wrap


def _median_time(call, rounds: int, before=None) -> float:
    call()
    times = []
    for _ in range(rounds):
        if before is not None:
            before()
        t0 = _clock()
        call()
        times.append(_clock() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="small", choices=("small", "big"))
    ap.add_argument("--mesh", default="4x2", help="1x1 or 4x2")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)

    import spmd.compiler.core.jit as jit_module

    wrapped = _timing(codegen.compile_program)
    codegen.compile_program = wrapped
    if hasattr(jit_module, "compile_program"):
        jit_module.compile_program = wrapped
    import bench_engine

    mesh = tuple(int(s) for s in args.mesh.split("x"))
    run, _, _, _ = bench_engine._spmd_engine(args.config, mesh)
    batches = bench_engine._batches(args.config, args.steps + 2)
    for b in batches[:2]:
        run(b)
    _spent.update(s=0.0, calls=0)
    t0 = _clock()
    for b in batches[2:]:
        run(b)
    step = (_clock() - t0) / args.steps
    in_step = _spent["s"] / args.steps
    calls = [(fn, a, kw) for fn, a, kw in _last.values()]
    warm = sum(_median_time(lambda: fn(*a, **kw), 20) for fn, a, kw in calls)
    big = np.ones(16 << 20, np.float32)  # 64 MiB: more than the caches

    def flush():
        big[::1024] += 1.0
        big.sum()

    cold = sum(_median_time(lambda: fn(*a, **kw), 10, flush) for fn, a, kw in calls)
    print(f"{args.config} {args.mesh}: step {step * 1e3:.1f} ms; its {len(calls)} products: "
          f"in the step {in_step * 1e3:.1f} ms, repeated {warm * 1e3:.1f} ms, caches flushed "
          f"{cold * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
