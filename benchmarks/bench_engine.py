"""The engine: the transformer example's training step against JAX + optax and PyTorch.

    .venv-bench/bin/python benchmarks/bench_engine.py [--rounds R] [--configs small,big]
                                                      [--meshes 1,4x2] [--no-save]

(``make bench-engine`` builds ``.venv-bench``, the project plus the optional floors
``jax``, ``optax`` and ``torch==2.13.0``, and runs it.)  Without jax or torch the
rows of that engine are left out and the table says why.

One process, the engines interleaved (spmd, JAX, PyTorch, spmd, ...) after five
warm-up steps each (spmd's row loops are compiled in the background from its
second step and used from its fifth: ``spmd.compiler.engine.loops.SWITCH_AT``), each
engine's turn two steps of which the second is timed (a
training loop's steady state: a step timed right after another library's step was
10-25% slower, measured for spmd after PyTorch and PyTorch after JAX, 2026-12-05:
the other library's threads still spinning and its buffers in the caches), from
the same initial parameters and the same batches (``benchmarks/engine_floors.py`` holds the JAX and PyTorch versions;
the first step's losses are compared and recorded):

- configs: ``small`` is the example's default (d=64, 2 layers, 4 heads, context 64,
  batch 32); ``big`` is d=256, 4 layers, 8 heads, context 128, batch 16;
- meshes: ``1`` (one device: spmd's ``make_step`` on a 1 x 1 mesh, ``jax.jit``,
  PyTorch eager on 2 threads) and ``4x2`` (data=4 x model=2 of 8 simulated devices
  in this process: spmd's ``make_step``; ``jax.jit(jax.shard_map)`` with the same
  specs on 8 host devices).

JAX's one-device step runs in the process that also holds its 8 host devices (XLA
is configured once per process); measured alone, in a process of one host device,
it was 20-25% faster on the small config.  Each step's time includes placing the
batch (what a training loop does); the
first step (tracing and compiling) is recorded apart (`first step s`).  Memory
(item 5 of issue 25): each engine alone in a fresh process, the peak resident set
of 3 steps after the five warm-up steps (whose peak, compilation's, is forgotten)
above the resident set before its first step, with parameters and optimizer state in
place (and numba imported, for spmd, as the floors' libraries are) (`step peak MiB`: the step's buffers, freed or kept, and compiled code;
Linux only, ``--no-memory`` skips it); the results file also has the resident set
between steps above that baseline (``held_bytes``).  The
``% of matmul`` column is the step's matrix-product work (counted from spmd's
program: ``2 * m * n * k`` of every ``dot_general``) over the step's time and the
float32 matmul rate measured in the same run (a 2048 x 2048 product in numpy),
the issue's measure of how much of the machine a step uses.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time

os.environ.setdefault("SPMD_NUM_DEVICES", "8")
# As spmd-run sets it for its ranks (spmd/config.py says why); numpy loads below.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (HERE, REPO):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402

import common  # noqa: E402
import engine_floors as ef  # noqa: E402

CONFIGS = {  # name: (example arguments, batch)
    "small": (["--d-model", "64", "--layers", "2", "--heads", "4", "--context", "64"], 32),
    "big": (["--d-model", "256", "--layers", "4", "--heads", "8", "--context", "128"], 16),
}
MESHES = {"1": (1, 1), "4x2": (4, 2)}
STEPS, WARMUP_LR, LR = 60, 10, 1e-2  # the example's schedule (--steps 60 --warmup 10)
# Goals (issue 25): the step no slower than the faster floor on one device, than JAX
# on the simulated mesh; on the big config at least 40% of the matmul rate.
GOAL_RATIO, GOAL_MATMUL_SHARE = 1.0, 0.40


def skip_reason() -> str:
    """``run.py`` skips this module: it needs the optional floors (.venv-bench) and
    takes minutes; ``make bench-engine`` runs it."""
    return "needs jax/optax/torch in .venv-bench: `make bench-engine`"


def matmul_rate(n: int = 2048, repeats: int = 7) -> float:
    """FLOP/s of numpy's float32 ``a @ b`` on this machine now (best of ``repeats``)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    a @ b
    best = min(common.time_once(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best


def matmul_flops(closed) -> int:
    """``2 m n k`` summed over the ``dot_general`` equations of a program, nested ones
    included (a ``shard_map`` body counts once per device of its mesh), and over the
    products of the attention kernel's equations that the same maths in ordinary
    operations makes (two forward; the backward's four, not its recomputed scores)."""
    from spmd.compiler.core.ir import ClosedProgram, Program

    def walk(program, times):
        total = 0
        for e in program.eqns:
            if e.primitive.name == "dot_general":
                (lc, _), _ = e.params["dimension_numbers"]
                k = int(np.prod([e.inputs[0].aval.shape[i] for i in lc], dtype=np.int64))
                total += times * 2 * int(np.prod(e.outputs[0].aval.shape)) * k
            elif e.primitive.name in ("attention", "attention_grad"):
                B, T, N, H = e.inputs[0].aval.shape
                one = 2 * B * N * T * e.inputs[1].aval.shape[1] * H
                if e.primitive.name == "attention":
                    total += times * 2 * one
                else:  # dv, dp (for dq and dk), dq, dk: those asked for
                    wq, wk, wv, _ = e.params["wants"]
                    total += times * one * (wq + wk + wv + (wq or wk))
            reps = times
            if e.primitive.name == "shard_map":
                reps = times * int(np.prod(list(e.params["mesh"].shape.values())))
            for v in e.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if isinstance(sub, ClosedProgram):
                        total += walk(sub.program, reps)
                    elif isinstance(sub, Program):
                        total += walk(sub, reps)
        return total

    return walk(closed.program if hasattr(closed, "program") else closed.jaxpr, 1)


def _spmd_engine(config: str, mesh_shape):
    """(step(batch_np) -> loss, params as numpy, FLOPs of one step, cfg dict)."""
    import spmd
    import examples.train_transformer as T
    from spmd import optim

    argv, batch = CONFIGS[config]
    args = T.parse_args(argv + ["--batch", str(batch), "--steps", str(STEPS)])
    cfg = T.Config(args)
    mesh = spmd.make_mesh(mesh_shape, ("data", "model"))
    specs = T.param_specs(cfg, False)
    schedule = optim.warmup_cosine_decay_schedule(0.0, LR, WARMUP_LR, STEPS, end_value=LR / 10)
    opt = optim.adamw(schedule, b2=0.99, weight_decay=0.01,
                      mask=lambda p: spmd.tree_util.tree_map(lambda x: x.ndim > 1, p))
    step, _ = T.make_step(cfg, mesh, specs, opt)
    params = T.init_params(cfg, specs, mesh, 0)
    box = {"params": params, "state": opt.init(params)}
    params_np = spmd.tree_util.tree_map(np.asarray, params)

    def run(batch_np):
        placed = T._put_batch(batch_np, mesh)
        box["params"], box["state"], loss = step(box["params"], box["state"], placed)
        return float(loss)

    flops = matmul_flops(spmd.make_jaxpr(step)(box["params"], box["state"],
                                               T._put_batch(_batches(config, 1)[0], mesh)))
    cfgd = {"d_model": cfg.d, "heads": cfg.heads, "layers": cfg.layers,
            "context": cfg.context, "vocab": cfg.vocab}
    return run, params_np, flops, cfgd


def _batches(config: str, n: int) -> list[np.ndarray]:
    import examples.train_transformer as T

    argv, batch = CONFIGS[config]
    corpus = T.load_corpus()
    context = int(argv[argv.index("--context") + 1])
    return [T.batch_at(corpus, k, batch, context, 0) for k in range(1, n + 1)]


def _floor(make):
    box = {}

    def run(batch_np):
        box["state"], loss = box["step"](box["state"], batch_np)
        return float(loss)

    box["step"], box["state"] = make()
    return run


def _engines(config: str, mesh: str, only: str | None = None):
    """``({name: step(batch) -> loss}, absent reasons, flops)`` of one cell (``only``:
    just that engine, after spmd's own setup, which gives the parameters)."""
    run_spmd, params_np, flops, cfgd = _spmd_engine(config, MESHES[mesh])
    engines, absent = {"spmd": run_spmd}, {}
    why = ef.jax_available() if only in (None, "jax") else "not asked"
    if why is None:
        shape = None if mesh == "1" else MESHES[mesh]
        engines["jax"] = _floor(lambda: ef.make_jax_step(cfgd, params_np, shape, LR,
                                                         WARMUP_LR, STEPS))
    else:
        absent["jax"] = why
    if mesh == "1":
        why = ef.torch_available() if only in (None, "torch") else "not asked"
        if why is None:
            engines["torch"] = _floor(lambda: ef.make_torch_step(cfgd, params_np, LR,
                                                                 WARMUP_LR, STEPS))
        else:
            absent["torch"] = why
    if only is not None:
        engines = {k: v for k, v in engines.items() if k == only}
    return engines, absent, flops


_MEMORY_TAG = "BENCH_ENGINE_MEMORY "


def memory_one(config: str, mesh: str, engine: str) -> None:
    """In a fresh process: the peak resident set of 3 steps of ``engine`` (after
    :func:`_warm_up_steps` warm-up steps, whose own peak is forgotten: compilation is
    not counted) above the
    resident set before its first step, when the parameters and optimizer state exist
    (the memory its steps run in: their buffers, whether freed or kept between steps,
    and the compiled code), and the resident set between steps above that same
    baseline.  Printed as JSON after :data:`_MEMORY_TAG`."""
    import gc
    import json

    engines, _, _ = _engines(config, mesh, only=engine)
    if engine not in engines:
        print(_MEMORY_TAG + json.dumps(None), flush=True)
        return
    run = engines[engine]
    warm = _warm_up_steps()
    batches = _batches(config, warm + 3)
    if engine == "spmd":
        # The compiler of the row loops is imported before the baseline, as JAX's
        # and PyTorch's libraries are: its code is not the step's memory.
        with contextlib.suppress(ImportError):
            importlib.import_module("numba")
    gc.collect()
    before = common.status_bytes("VmRSS")
    for b in batches[:warm]:
        run(b)
    gc.collect()
    steady = common.status_bytes("VmRSS")
    common.reset_peak()  # the peak starts again from here
    for b in batches[warm:]:
        run(b)
    peak = common.status_bytes("VmHWM")
    print(_MEMORY_TAG + json.dumps({"step_peak_bytes": peak - before,
                                    "held_bytes": steady - before}), flush=True)


def measure_memory(config: str, mesh: str, engines) -> dict:
    """:func:`memory_one` of each engine, each in its own process."""
    import json
    import subprocess

    out = {}
    for name in engines:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-one",
                               config, mesh, name], capture_output=True, text=True,
                              timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_MEMORY_TAG)]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"memory of {name} on {config} {mesh} failed:\n"
                               f"{proc.stderr[-2000:]}")
        out[name] = json.loads(lines[-1][len(_MEMORY_TAG):])
    return out


def _warm_up_steps() -> int:
    """Steps before measuring: until spmd's row loops are compiled and in use
    (``spmd.compiler.engine.loops.SWITCH_AT``), as in a training run after its first
    steps; every engine gets as many."""
    from spmd.compiler.engine import loops

    return max(2, loops.SWITCH_AT)


def measure(config: str, mesh: str, rounds: int) -> dict:
    """One (config, mesh) cell: every available engine's step times, interleaved."""
    engines, absent, flops = _engines(config, mesh)
    batches = _batches(config, 2 + 2 * rounds)
    first_loss, first_s = {}, {}
    for name, run in engines.items():  # the first step traces and compiles
        t0 = common.clock()
        first_loss[name] = run(batches[0])
        first_s[name] = common.clock() - t0
    for name, run in engines.items():
        for _ in range(_warm_up_steps() - 1):
            run(batches[1])
    times = {name: [] for name in engines}
    for k in range(rounds):
        lead, timed = batches[2 + 2 * k], batches[3 + 2 * k]
        for name, run in engines.items():
            # Each engine's timed step follows a step of its own, as in a training
            # loop: a step run right after another library's ran 10-25% slower (its
            # threads still spinning, its buffers in the caches), whichever engine.
            run(lead)
            t0 = common.clock()
            run(timed)
            times[name].append(common.clock() - t0)
    return {"config": config, "mesh": mesh, "flops": flops, "times_s": times,
            "first_loss": first_loss, "first_step_s": first_s, "absent": absent}


def _median(xs):
    return float(np.median(xs)) if xs else None


def table(rows: list[dict]) -> str:
    """The Markdown table of the results rows (``make_tables.py`` calls it)."""
    rate = next((r["matmul_rate"] for r in rows if "matmul_rate" in r), None)
    head = ["config", "mesh", "spmd ms", "JAX ms", "PyTorch ms", "spmd / JAX",
            "spmd / PyTorch", "% of matmul rate (spmd)", "goal", "result", "losses (step 1)",
            "first step s (spmd, JAX)", "step peak MiB (spmd, JAX, PyTorch)"]
    body = []
    for r in rows:
        if "config" not in r:
            continue
        t = {k: _median(v) for k, v in r["times_s"].items()}
        s, j, p = t.get("spmd"), t.get("jax"), t.get("torch")
        floors = [x for x in (j, p) if x is not None]
        best = min(floors) if floors else None
        share = r["flops"] / (s * rate) if rate else None
        goal = "<= 1.0 of the faster floor" if r["mesh"] == "1" else "<= 1.0 of JAX"
        ok = best is not None and s / (best if r["mesh"] == "1" else j) <= GOAL_RATIO
        if r["config"] == "big":
            goal += f", >= {GOAL_MATMUL_SHARE:.0%} of matmul"
            ok = ok and share is not None and share >= GOAL_MATMUL_SHARE
        fmt = lambda x: "-" if x is None else f"{1e3 * x:.1f}"  # noqa: E731
        ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"  # noqa: E731
        losses = ", ".join(f"{k} {v:.6f}" for k, v in r["first_loss"].items())
        first = r.get("first_step_s", {})
        firsts = ", ".join(f"{first[k]:.2f}" for k in ("spmd", "jax") if k in first) or "-"
        mem = r.get("memory", {})
        peaks = ", ".join(f"{mem[k]['step_peak_bytes'] / 2 ** 20:.0f}"
                          for k in ("spmd", "jax", "torch") if mem.get(k)) or "-"
        body.append([r["config"], r["mesh"], fmt(s), fmt(j), fmt(p), ratio(s, j), ratio(s, p),
                     "-" if share is None else f"{share:.0%}", goal,
                     "-" if best is None else ("pass" if ok else "FAIL"), losses, firsts,
                     peaks])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(head), "| " + " | ".join("-" * w for w in widths) + " |"] + [line(b) for b in body]
    absent = {k: v for r in rows if "absent" in r for k, v in r["absent"].items()}
    if absent:
        out.append("\n" + "; ".join(f"{k}: not measured ({v})" for k, v in sorted(absent.items())))
    if rate:
        out.append(f"\nfloat32 matmul rate in this run: {rate / 1e9:.0f} GFLOP/s (2048 x 2048).")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=0, help="timed steps per engine "
                    "(default: 15 for small, 6 for big)")
    ap.add_argument("--configs", default="small,big")
    ap.add_argument("--meshes", default="1,4x2")
    ap.add_argument("--no-save", action="store_true", help="print only")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the per-engine memory runs (one process each)")
    ap.add_argument("--memory-one", nargs=3, metavar=("CONFIG", "MESH", "ENGINE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_one:
        memory_one(*args.memory_one)
        return 0
    common.provenance()
    t0 = time.perf_counter()
    rate = matmul_rate()
    rows = []
    for config in args.configs.split(","):
        for mesh in args.meshes.split(","):
            rounds = args.rounds or (15 if config == "small" else 6)
            rows.append(measure(config, mesh, rounds))
            if not args.no_memory and os.path.exists("/proc/self/clear_refs"):
                rows[-1]["memory"] = measure_memory(config, mesh, rows[-1]["times_s"])
            print(f"{config} {mesh}: " + ", ".join(
                f"{k} {1e3 * _median(v):.1f} ms" for k, v in rows[-1]["times_s"].items()),
                flush=True)
    rate = max(rate, matmul_rate())
    rows.append({"matmul_rate": rate})
    seconds = time.perf_counter() - t0
    print("\n" + table(rows))
    if not args.no_save:
        import run as runner

        path = runner.save("engine", rows, False, seconds, args.out)
        print(f"\nsaved {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
