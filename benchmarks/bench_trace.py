"""What a trace costs a training step: the transformer example with and without
``spmd-run --trace``, and in one process with and without ``spmd.profiler.trace``.

The program is the one users run (``examples/train_transformer.py``, data
parallel, weakly scaled as in ``bench_scaling.py``); the floor is the same job
without a trace, run in the same call, alternating (off, on, off, on, ...), so
that a slow phase of the machine hits both alike.  Each job reports its steady
tokens/s (after the first step, which compiles); a variant's figure is the
median over its rounds, and the overhead is ``off / on - 1`` of those medians.
Goal (issue 56): at most 3%.  A traced job also gives its merged trace's size,
its event count and the time ``spmd-run`` took to merge it.

    python benchmarks/bench_trace.py --ranks 2,4 --rounds 5 --steps 60
    python benchmarks/bench_trace.py --ranks 8 --mpiexec $(which mpiexec.gforker)
    python benchmarks/bench_trace.py --ranks 1 --devices 8   # one process, simulated

Results go to ``benchmarks/results/trace.json`` (table ``trace`` in docs/results.md).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import common  # noqa: E402
from bench_scaling import CONTEXT, MODEL, SEQS_PER_RANK, job_env  # noqa: E402

GOAL = 0.03


def command(n: int, devices: int, steps: int, stats: str, mpiexec: str,
            trace: str | None) -> list[str]:
    """The example on ``n`` ranks (``devices`` simulated devices when ``n == 1``),
    weakly scaled; traced to ``trace`` when given."""
    width = n if n > 1 else devices
    script = [os.path.join("examples", "train_transformer.py"), "--mesh",
              f"data={width},model=1", "--batch", str(SEQS_PER_RANK * width), *MODEL,
              "--steps", str(steps), "--sample", "0", "--log-every", str(steps),
              "--stats", stats]
    if n == 1:
        return [sys.executable, *script, *(["--profile", trace] if trace else [])]
    return [sys.executable, "-m", "spmd.launch", "--mpiexec", mpiexec, "--no-prefix",
            "-n", str(n), *(["--trace", trace] if trace else []), *script]


def run_job(n: int, devices: int, steps: int, mpiexec: str, traced: bool) -> dict:
    """One job: tokens/s per rank; with a trace, its size and the job's wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats")
        trace = os.path.join(tmp, "trace.json.gz") if traced else None
        cmd = command(n, devices, steps, stats, mpiexec, trace)
        env = dict(job_env(), SPMD_NUM_DEVICES=str(devices if n == 1 else 1))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True,
                              timeout=1800)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
        ranks = [json.load(open(p)) for p in sorted(glob.glob(stats + ".rank*.json"))]
        out = {"tokens_per_s_per_rank": ranks[0]["tokens_per_s"] / n, "wall_s": wall,
               "command": " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c
                                   for c in cmd)}
        if traced:
            with gzip.open(trace, "rt") as f:
                events = json.load(f)["traceEvents"]
            out.update(trace_bytes=os.path.getsize(trace), events=len(events),
                       summary=proc.stderr[proc.stderr.rfind("spmd timeline"):][:2000]
                       if "spmd timeline" in proc.stderr else "")
        return out


def summarize(runs: dict) -> list[dict]:
    rows = []
    for (n, devices), modes in sorted(runs.items()):
        off = statistics.median(r["tokens_per_s_per_rank"] for r in modes["off"])
        on = statistics.median(r["tokens_per_s_per_rank"] for r in modes["on"])
        traced = modes["on"][-1]
        rows.append({"ranks": n, "devices": devices if n == 1 else n,
                     "tokens_per_s_per_rank_off": off, "tokens_per_s_per_rank_on": on,
                     "rounds_off": [r["tokens_per_s_per_rank"] for r in modes["off"]],
                     "rounds_on": [r["tokens_per_s_per_rank"] for r in modes["on"]],
                     "overhead": off / on - 1, "goal": GOAL, "met": off / on - 1 <= GOAL,
                     "trace_bytes": traced.get("trace_bytes"), "events": traced.get("events"),
                     "summary": traced.get("summary", ""),
                     "command_on": traced["command"], "command_off": modes["off"][-1]["command"]})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| job | tokens/s per rank, no trace (floor) | traced | overhead "
             "| trace (events, size) | goal <= 3% |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        job = (f"{r['ranks']} ranks, spmd-run --trace" if r["ranks"] > 1
               else f"1 process, {r['devices']} simulated devices, spmd.profiler.trace")
        size = (f"{r['events']:,} events, {r['trace_bytes'] / 1e6:.1f} MB gz"
                if r.get("events") else "-")
        lines.append(f"| {job} | {r['tokens_per_s_per_rank_off'] / 1e3:.2f}k "
                     f"| {r['tokens_per_s_per_rank_on'] / 1e3:.2f}k | {r['overhead']:+.1%} "
                     f"| {size} | {'met' if r['met'] else 'not met'} |")
    return "\n".join(lines)


def save(args, argv, provenance: dict, runs: dict) -> None:
    """Write the rounds so far to ``args.out``."""
    if args.commit:
        provenance["commit"] = args.commit
    result = {"benchmark": "the cost of a trace to examples/train_transformer.py",
              "date": common.now_iso(), **provenance, "machine": common.machine_info(),
              "steps": args.steps, "rounds": len(next(iter(runs.values()))["on"]),
              "tokens_per_step_per_rank": SEQS_PER_RANK * CONTEXT, "rows": summarize(runs)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts (1: one process)")
    ap.add_argument("--devices", type=int, default=8, help="simulated devices when --ranks 1")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5, help="jobs of each variant, alternating")
    ap.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    ap.add_argument("--commit", default=None, help="the commit measured (where git is missing)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "trace.json"))
    args = ap.parse_args(argv)
    provenance = common.provenance()
    runs: dict = {}
    counts = [int(c) for c in args.ranks.split(",")]
    # One job first, not counted: the first job on a fresh machine reads every file
    # from disk (a third slower in the runs recorded), whichever variant it is.
    run_job(counts[0], args.devices, min(args.steps, 10), args.mpiexec, False)
    for k in range(args.rounds):
        for n in counts:
            modes = runs.setdefault((n, args.devices), {"off": [], "on": []})
            for mode in ("off", "on") if k % 2 == 0 else ("on", "off"):
                r = run_job(n, args.devices, args.steps, args.mpiexec, mode == "on")
                modes[mode].append(r)
                print(f"round {k + 1}: {n} ranks, trace {mode}: "
                      f"{r['tokens_per_s_per_rank']:,.0f} tokens/s per rank", flush=True)
        save(args, argv, provenance, runs)  # (after every round: a cut-short call keeps them)
    print(table(summarize(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
