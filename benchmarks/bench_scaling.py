"""Weak scaling on many cores: the transformer example with a fixed batch per rank.

    .venv/bin/python benchmarks/bench_scaling.py --ranks 1,2,4,8,12 --steps 150 --rounds 2

Runs ``examples/train_transformer.py --mesh data=N,model=1`` (``--d-model 128 --layers 4
--heads 4``, 16 sequences per rank, one BLAS thread per rank) on N ranks for
each N, the N interleaved over ``--rounds`` rounds so that a slow phase of the
machine hits every N alike, and writes ``benchmarks/results/scaling.json`` and a
markdown table:

- tokens per second per rank (the steady steps after the first, which traces
  and compiles), the median over the rounds;
- efficiency: that figure against the same figure at 2 ranks (the first
  multi-process job: one rank pays no collective at all);
- the share of the steady steps' time spent in collectives, the largest over
  the ranks (``spmd.distributed.collective_time``: waiting for a slower rank
  counts), median over the rounds.

Ranks are started by ``--mpiexec`` (default: the one next to this Python) as a
user starts them, each with ``OPENBLAS_NUM_THREADS=1``; ``--launcher spmd-run``
starts them through ``spmd-run`` instead (which sets the thread counts itself).
The goal (issue 54): >= 90% efficiency at 8 ranks and >= 85% at 12, with the
collective share <= 8% at 12 ranks, on a machine with >= 12 cores.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import common  # noqa: E402

MODEL = ["--d-model", "128", "--layers", "4", "--heads", "4"]
SEQS_PER_RANK = 16
CONTEXT = 64  # the example's --context default: tokens per sequence
GOALS = {8: 0.90, 12: 0.85}
SHARE_GOAL = (12, 0.08)


def skip_reason() -> str:
    """``run.py`` skips this module: it launches its own MPI jobs on many cores."""
    return "launches its own MPI jobs on many cores: python benchmarks/bench_scaling.py"


# ``--bind``: each process runs on one core of its own (its rank on the node, or
# its copy's index), as ``mpiexec -bind-to core`` would place it.
_BOUND = ("import os, runpy, sys; "
          "r = int(os.environ.get('MPI_LOCALRANKID') or os.environ.get('PMI_RANK') or "
          "os.environ.get('SPMD_BENCH_COPY') or 0); "
          "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[r % len(os.sched_getaffinity(0))]}); "
          "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
BIND = False


def example_args(n: int, steps: int, stats: str) -> list[str]:
    """The example's command line on ``n`` ranks, weakly scaled, its stats to ``stats``."""
    return [os.path.join("examples", "train_transformer.py"), "--mesh", f"data={n},model=1",
            "--batch", str(SEQS_PER_RANK * n), *MODEL, "--steps", str(steps),
            "--sample", "0", "--log-every", str(steps), "--stats", stats]


def job_env() -> dict:
    """The environment of a job: one device and one BLAS thread per process, the
    repository on the path."""
    return dict(os.environ, SPMD_NUM_DEVICES="1", OPENBLAS_NUM_THREADS="1",
                OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))


def command(n: int, steps: int, stats: str, mpiexec: str, launcher: str) -> list[str]:
    """The job of ``n`` ranks: the example as a user runs it, weakly scaled."""
    script = example_args(n, steps, stats)
    if BIND:
        script = ["-c", _BOUND, *script]
    if n == 1:
        return [sys.executable, *script]
    if launcher == "spmd-run":
        return [sys.executable, "-m", "spmd.launch", "--mpiexec", mpiexec, "--no-prefix",
                "-n", str(n), *script]
    return [mpiexec, "-n", str(n), sys.executable, *script]


def run_one(n: int, steps: int, mpiexec: str, launcher: str) -> dict:
    """One job of ``n`` ranks: its tokens/s per rank and collective shares."""
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats")
        cmd = command(n, steps, stats, mpiexec, launcher)
        env = job_env()
        proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True,
                              timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
        ranks = [json.load(open(p)) for p in sorted(glob.glob(stats + ".rank*.json"))]
    if len(ranks) != n:
        raise SystemExit(f"{' '.join(cmd)}: {len(ranks)} stats files, expected {n}")
    return {"tokens_per_s": ranks[0]["tokens_per_s"],
            "tokens_per_s_per_rank": ranks[0]["tokens_per_s"] / n,
            "comm_share": [r["comm_share"] or 0.0 for r in ranks],
            "final_loss": ranks[0]["final_loss"],
            "command": " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c
                                for c in cmd)}


def run_floor(n: int, steps: int) -> float:
    """The floor of weak scaling: ``n`` one-process copies of the 1-rank job at once,
    with no communication at all; their mean tokens/s per process.  What the
    machine gives ``n`` busy processes (shared caches, memory bandwidth, the
    cores' clocks) bounds what ``n`` ranks can reach."""
    with tempfile.TemporaryDirectory() as tmp:
        env = job_env()
        procs = [subprocess.Popen(command(1, steps, os.path.join(tmp, f"s{i}"), "", "mpiexec"),
                                  cwd=REPO, env=dict(env, SPMD_BENCH_COPY=str(i)), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for i in range(n)]
        for p in procs:
            _, err = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"a one-process copy failed:\n{err[-3000:]}")
        rates = [json.load(open(f))["tokens_per_s"] for f in glob.glob(os.path.join(tmp, "s*.rank0.json"))]
    return statistics.mean(rates)


GRADIENT_BYTES = 3247104  # the model's parameters, float32 (its --stats param_bytes)


def run_probe(n: int, mpiexec: str) -> dict:
    """``scaling_probe.py`` on ``n`` ranks under spmd-run: the gradient's psum alone
    (no compute to wait for) and raw Allreduce, medians in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.json")
        cmd = [sys.executable, "-m", "spmd.launch", "--mpiexec", mpiexec, "--no-prefix",
               "-n", str(n), os.path.join(HERE, "scaling_probe.py"),
               "--bytes", str(GRADIENT_BYTES), "--out", out]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [REPO, os.environ.get("PYTHONPATH")])))
        proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True,
                              timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        return json.load(open(out))["median_s"]


def summarize(runs: dict[int, list[dict]], floors: dict[int, list[float]],
              probes: dict[int, dict] | None = None) -> list[dict]:
    """Per N: medians over the rounds, and efficiency against 2 ranks."""
    rows = []
    for n, rs in sorted(runs.items()):
        per_rank = [r["tokens_per_s_per_rank"] for r in rs]
        rows.append({"ranks": n, "tokens_per_s_per_rank": statistics.median(per_rank),
                     "rounds": per_rank,
                     "floor_tokens_per_s_per_process": (statistics.median(floors[n])
                                                        if floors.get(n) else None),
                     "comm_share_max": statistics.median(max(r["comm_share"]) for r in rs),
                     "probe_median_s": (probes or {}).get(n),
                     "command": rs[0]["command"]})
    base = next((r["tokens_per_s_per_rank"] for r in rows if r["ranks"] == 2), None)
    for r in rows:
        r["efficiency"] = r["tokens_per_s_per_rank"] / base if base else None
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| ranks | tokens/s per rank (median) | efficiency against 2 ranks "
             "| collective share (max over ranks) | floor: N copies, no MPI (tokens/s each) "
             "| goal |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        goal = []
        if r["ranks"] in GOALS:
            ok = r["efficiency"] is not None and r["efficiency"] >= GOALS[r["ranks"]]
            goal.append(f"eff >= {GOALS[r['ranks']]:.0%}: {'met' if ok else 'not met'}")
        if r["ranks"] == SHARE_GOAL[0]:
            ok = r["comm_share_max"] <= SHARE_GOAL[1]
            goal.append(f"share <= {SHARE_GOAL[1]:.0%}: {'met' if ok else 'not met'}")
        eff = f"{r['efficiency']:.0%}" if r["efficiency"] is not None else "-"
        floor = r["floor_tokens_per_s_per_process"]
        floor = f"{floor / 1e3:.2f}k" if floor else "-"
        lines.append(f"| {r['ranks']} | {r['tokens_per_s_per_rank'] / 1e3:.2f}k | {eff} "
                     f"| {r['comm_share_max']:.1%} | {floor} | {'; '.join(goal) or '-'} |")
    return "\n".join(lines)


def binding_table(rows: list[dict]) -> str:
    """``results/scaling_binding.json``: ranks left to the scheduler against ranks on a
    core each, medians of two runs, beside N one-process copies at once."""
    lines = ["| ranks | tokens/s per rank, unbound | bound | bound / unbound "
             "| collective share, unbound | bound | N copies, no MPI: unbound | bound |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['unbound'] / 1e3:.2f}k | {r['bound'] / 1e3:.2f}k "
                     f"| {r['bound'] / r['unbound']:.2f}x | {r['share_unbound']:.1%} "
                     f"| {r['share_bound']:.1%} | {r['floor_unbound'] / 1e3:.2f}k "
                     f"| {r['floor_bound'] / 1e3:.2f}k |")
    return "\n".join(lines)


def probe_table(rows: list[dict]) -> str:
    """``results/scaling_probe.json``: the gradient's psum alone (after a barrier:
    no waiting for compute) beside the step's time and its collective share."""
    lines = ["| ranks | tokens/s per rank | step (ms) | collective share (max) "
             "| the gradient's psum alone (ms) | raw mpi4py Allreduce (ms) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        step_ms = SEQS_PER_RANK * CONTEXT / r["tokens_per_s_per_rank"] * 1e3
        probe = r.get("probe_median_s") or {}  # (a run with --probe; older files: psum_s)
        psum = r.get("psum_s", probe.get("spmd psum"))
        allreduce = r.get("allreduce_s", probe.get("mpi4py Allreduce"))
        if psum is None:
            continue
        lines.append(f"| {r['ranks']} | {r['tokens_per_s_per_rank'] / 1e3:.2f}k | {step_ms:.0f} "
                     f"| {r['comm_share_max']:.1%} | {psum * 1e3:.1f} "
                     f"| {allreduce * 1e3:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,2,4,8,12", help="comma-separated rank counts")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each rank count, interleaved")
    ap.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    ap.add_argument("--launcher", choices=("mpiexec", "spmd-run"), default="mpiexec")
    ap.add_argument("--floor", action="store_true",
                    help="also run N one-process copies at once (no MPI): the machine's floor")
    ap.add_argument("--probe", action="store_true",
                    help="also time the gradient's psum alone on N ranks (scaling_probe.py)")
    ap.add_argument("--bind", action="store_true", help="each process on a core of its own")
    ap.add_argument("--commit", default=None, help="the commit measured (where git is missing)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "scaling.json"))
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.ranks.split(",")]
    global BIND
    BIND = args.bind
    provenance = common.provenance()  # the code of this moment, before the runs
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    floors: dict[int, list[float]] = {n: [] for n in counts}
    for k in range(args.rounds):
        for n in counts:
            r = run_one(n, args.steps, args.mpiexec, args.launcher)
            runs[n].append(r)
            print(f"round {k + 1}: {n} ranks: {r['tokens_per_s_per_rank']:,.0f} tokens/s per "
                  f"rank, collective share max {max(r['comm_share']):.1%}", flush=True)
            if args.floor:
                floors[n].append(run_floor(n, args.steps))
                print(f"round {k + 1}: {n} copies, no MPI: {floors[n][-1]:,.0f} tokens/s each",
                      flush=True)
    probes = {}
    if args.probe:
        for n in counts:
            if n > 1:
                probes[n] = run_probe(n, args.mpiexec)
                print(f"{n} ranks: the gradient's psum alone {probes[n]}", flush=True)
    rows = summarize(runs, floors, probes)
    if args.commit:
        provenance["commit"] = args.commit
    result = {"benchmark": "weak scaling of examples/train_transformer.py", "date": common.now_iso(),
              **provenance, "machine": common.machine_info(), "steps": args.steps,
              "seqs_per_rank": SEQS_PER_RANK, "model": " ".join(MODEL),
              "launcher": args.launcher, "bind": args.bind, "rows": rows, "floors": {str(n): f for n, f in floors.items()}, "runs": {str(n): rs for n, rs in runs.items()}}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
