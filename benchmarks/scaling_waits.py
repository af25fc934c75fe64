"""Where the weak-scaling step's collective time goes: waiting for the last rank to
arrive, or the collective's own work after it.

    python benchmarks/scaling_waits.py --ranks 2,8,12 --steps 80 [--mpiexec PATH]

Runs ``bench_scaling.py``'s job (``examples/train_transformer.py``, the same model
and 16 sequences per rank) under ``spmd-run``, every rank recording when it entered
and left each data collective over two or more ranks
(:class:`spmd.collectives.mpi.control.Collective`; the ranks of one machine share
its monotonic clock).  For each call after the first fifth of the run (tracing,
compiling, warming up), across its ranks:

- *waiting*: the last rank's arrival less each rank's (up to its exit), averaged
  over the ranks;
- *after the last arrival*: each rank's exit less the last arrival, averaged: the
  transfer and the adding, with no one left to wait for;
- which rank arrived last (calls that waited for every rank).

A started sum is two calls here, its start (which waits for no one) and its wait.

Per step these say whether the collective share of ``bench_scaling.py`` is spent
moving and adding data (which faster collectives would cut) or waiting for the
slowest rank of that step (which only evener compute would).  Writes
``results/scaling_waits.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import collections
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
from bench_scaling import CONTEXT, SEQS_PER_RANK, example_args, job_env  # noqa: E402

WARMUP_SHARE = 0.2


def skip_reason() -> str:
    """``run.py`` skips this module: it launches its own MPI jobs."""
    return "launches its own MPI jobs: python benchmarks/scaling_waits.py"


# ------------------------------------------------------------------ on a rank

def on_rank(out: str, argv: list[str]) -> None:
    """Run the script ``argv`` with every data collective's entry and exit recorded;
    at exit write them to ``out.rank<k>.json``."""
    import atexit
    import runpy

    from spmd.collectives.mpi import control as mpi_control

    events, plain_exit = [], mpi_control.Collective.__exit__

    def exit_recording(self, *exc):
        if not self.control and len(self.ranks) > 1:
            events.append((str(self.what), self.seq, self.since, mpi_control._monotonic()))
        return plain_exit(self, *exc)

    mpi_control.Collective.__exit__ = exit_recording

    def write():
        rank = os.environ.get("PMI_RANK", "0")
        with open(f"{out}.rank{rank}.json", "w") as f:
            json.dump(events, f)

    atexit.register(write)
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


# ------------------------------------------------------------------ the driver

def analyse(per_rank: list[list], steps: int) -> dict:
    """The waits of the calls every rank recorded, after the warm-up share."""
    by_seq = [{e[1]: e for e in events} for events in per_rank]
    seqs = sorted(set.intersection(*[set(s) for s in by_seq]))
    seqs = seqs[int(len(seqs) * WARMUP_SHARE):]
    waits, after, last = [], [], collections.Counter()
    for q in seqs:
        arrive = [s[q][2] for s in by_seq]
        leave = [s[q][3] for s in by_seq]
        end = max(arrive)
        # (Clamped: a started sum's start returns at once, waiting for no one; its
        # wait completes once every rank has started it and come into MPI -- the mpich
        # wheel moves nothing outside MPI calls -- which is its last arrival.)
        waits.append(statistics.mean(max(0.0, min(x, end) - a) for a, x in zip(arrive, leave)))
        after.append(statistics.mean(max(0.0, x - max(a, end)) for a, x in zip(arrive, leave)))
        if min(leave) >= end:  # a call that waited for everyone
            last[arrive.index(end)] += 1
    counted_steps = steps * (1 - WARMUP_SHARE)
    per_step = len(seqs) / counted_steps
    return {"calls_per_step": per_step,
            "waiting_ms_per_step": statistics.mean(waits) * per_step * 1e3,
            "after_last_arrival_ms_per_step": statistics.mean(after) * per_step * 1e3,
            "waiting_ms_per_call_median": statistics.median(waits) * 1e3,
            "after_last_arrival_ms_per_call_median": statistics.median(after) * 1e3,
            "last_to_arrive": {str(k): v for k, v in sorted(last.items())}}


def run_one(n: int, steps: int, mpiexec: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        stats, ev = os.path.join(tmp, "stats"), os.path.join(tmp, "events")
        cmd = [sys.executable, "-m", "spmd.launch", "--mpiexec", mpiexec, "--no-prefix",
               "-n", str(n), os.path.abspath(__file__), "--on-rank", ev,
               *example_args(n, steps, stats)]
        proc = subprocess.run(cmd, cwd=REPO, env=job_env(), text=True, capture_output=True,
                              timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
        per_rank = [json.load(open(p)) for p in sorted(glob.glob(ev + ".rank*.json"),
                                                       key=lambda p: int(p.rsplit("rank", 1)[1][:-5]))]
        ranks = [json.load(open(p)) for p in sorted(glob.glob(stats + ".rank*.json"))]
    step_ms = 1e3 * SEQS_PER_RANK * n * CONTEXT / ranks[0]["tokens_per_s"]
    row = {"ranks": n, "tokens_per_s_per_rank": ranks[0]["tokens_per_s"] / n,
           "step_ms": step_ms, "comm_share_max": max(r["comm_share"] or 0.0 for r in ranks),
           **analyse(per_rank, steps),
           "command": " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c
                               for c in cmd)}
    row["waiting_share"] = row["waiting_ms_per_step"] / step_ms
    row["after_last_arrival_share"] = row["after_last_arrival_ms_per_step"] / step_ms
    return row


def table(rows: list[dict]) -> str:
    lines = ["| ranks | step (ms) | collective share (max) | waiting for the last rank "
             "(ms/step, share) | after the last arrival (ms/step, share) | calls/step "
             "| last to arrive (rank: calls) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        last = ", ".join(f"{k}: {v}" for k, v in r["last_to_arrive"].items())
        lines.append(f"| {r['ranks']} | {r['step_ms']:.0f} | {r['comm_share_max']:.1%} "
                     f"| {r['waiting_ms_per_step']:.1f} ({r['waiting_share']:.1%}) "
                     f"| {r['after_last_arrival_ms_per_step']:.1f} "
                     f"({r['after_last_arrival_share']:.1%}) | {r['calls_per_step']:.0f} "
                     f"| {last} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--on-rank"]:
        on_rank(argv[1], argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,8,12")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    ap.add_argument("--commit", default=None, help="the commit measured (where git is missing)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "scaling_waits.json"))
    args = ap.parse_args(argv)
    common.provenance()  # (read now: the code that runs)
    load = common.machine_info()
    rows = [run_one(int(n), args.steps, args.mpiexec) for n in args.ranks.split(",")]
    for r in rows:
        print(f"{r['ranks']} ranks: waiting {r['waiting_ms_per_step']:.1f} ms/step, after the "
              f"last arrival {r['after_last_arrival_ms_per_step']:.1f} ms/step, "
              f"step {r['step_ms']:.0f} ms", flush=True)
    provenance = common.provenance()
    if args.commit:
        provenance["commit"] = args.commit
    result = {"benchmark": "scaling_waits", "date": common.now_iso(), **provenance,
              "machine": load, "machine_at_end": common.machine_info(), "steps": args.steps,
              "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
