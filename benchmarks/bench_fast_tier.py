"""The fast tier of checkpoints (``checkpointing.save(..., local=True)``): what saving
every step costs, how long a restart takes from a lost node to training again, and
how fast 100 MB come back from memory.  Goals (issue 57):

- ``overhead``: the transformer example (``examples/train_transformer.py``, data
  parallel, weakly scaled as in ``bench_scaling.py``) under ``spmd-run``, saving to
  memory every step (``--save-local-every 1``) against the same job without it (the
  floor, both with ``--ckpt-dir``), alternating, in the same call; the nodes are
  simulated (``SPMD_SIMULATE_NODES=2``) so that every save also sends its copy to
  the other node's rank.  Median tokens/s of each variant; goal ``off / on - 1 <=
  3%``.
- ``recovery``: the example (the ``overhead`` model) on 4 ranks over 2 emulated
  nodes (root: :mod:`spmd.testing.emulated_nodes`), ``spmd-run --min-ranks 2``;
  node1 killed after step 8; the seconds from the kill to the first training step
  of the next attempt (on node0's 2 ranks, restored from memory), and their parts
  (the launcher noticing; start-up, mesh and restore; the first step, which
  compiles).  Median over rounds; goal <= 10 s.
- ``restore``: 4 ranks (2 simulated nodes) save 100 MB of float32 state to memory;
  the files node1's ranks wrote are removed (as with node1), and the 4 ranks restore
  onto another sharding: node0's ranks read every block, their own and node1's
  copies, and send each rank its part.  The restore's time on the slowest rank,
  median over rounds; goal <= 1 s.

    python benchmarks/bench_fast_tier.py --parts overhead,restore --ranks 8
    sudo python benchmarks/bench_fast_tier.py --parts recovery     # emulated nodes

Results go to ``benchmarks/results/fast_tier.json`` (table ``fast_tier`` in
docs/results.md); each part's rows replace that part's earlier ones.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

import common  # noqa: E402
from bench_scaling import MODEL, SEQS_PER_RANK, job_env  # noqa: E402

GOALS = {"overhead": 0.03, "recovery": 10.0, "restore": 1.0}
EXAMPLE = os.path.join("examples", "train_transformer.py")


def example_args(width: int, steps: int, ckpt: str, stats: str,
                 data: str | None = None) -> list[str]:
    """The example, ``width`` ranks' worth of batch (weak scaling), data parallel over
    ``data`` devices (default: all)."""
    return [EXAMPLE, "--mesh", f"data={data or width},model=1",
            "--batch", str(SEQS_PER_RANK * width),
            *MODEL, "--steps", str(steps), "--sample", "0", "--log-every", "1",
            "--ckpt-dir", ckpt, "--stats", stats]


# ------------------------------------------------------------------ overhead

def overhead_job(n: int, steps: int, mpiexec: str, local: bool) -> float:
    """Tokens/s per rank of one job, saving to memory every step or not."""
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats")
        cmd = [sys.executable, "-m", "spmd.launch", "--mpiexec", mpiexec, "--no-prefix",
               "-n", str(n), *example_args(n, steps, os.path.join(tmp, "ck"), stats),
               *(["--save-local-every", "1"] if local else [])]
        env = dict(job_env(), SPMD_SIMULATE_NODES="2")
        proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True,
                              timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
        with open(sorted(glob.glob(stats + ".rank*.json"))[0]) as f:
            return json.load(f)["tokens_per_s"] / n


def measure_overhead(n: int, steps: int, rounds: int, mpiexec: str) -> dict:
    overhead_job(n, min(steps, 10), mpiexec, False)  # (not counted: a cold start)
    runs: dict = {"off": [], "on": []}
    for k in range(rounds):
        for mode in ("off", "on") if k % 2 == 0 else ("on", "off"):
            runs[mode].append(overhead_job(n, steps, mpiexec, mode == "on"))
            print(f"overhead round {k + 1}, {mode}: {runs[mode][-1]:,.0f} tokens/s per rank",
                  flush=True)
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    return {"part": "overhead", "ranks": n, "nodes": "2 simulated", "steps": steps,
            "tokens_per_s_per_rank_off": off, "tokens_per_s_per_rank_on": on,
            "rounds_off": runs["off"], "rounds_on": runs["on"], "value": off / on - 1,
            "goal": GOALS["overhead"], "met": off / on - 1 <= GOALS["overhead"]}


# ------------------------------------------------------------------ recovery

class _Lines:
    """A job's output lines, each with the time it arrived."""

    def __init__(self, proc):
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, pattern: str, after: float = 0.0) -> float | None:
        for t, line in list(self.lines):
            if t >= after and re.search(pattern, line):
                return t
        return None

    def wait(self, pattern: str, limit_s: float, after: float = 0.0) -> float:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            t = self.first(pattern, after)
            if t is not None:
                return t
            time.sleep(0.01)
        raise SystemExit(f"no line {pattern!r} within {limit_s}s:\n" +
                         "\n".join(line for _, line in self.lines[-40:]))


def recovery_round(tmp: str, steps: int) -> dict:
    from spmd.testing.emulated_nodes import EmulatedNodes

    nodes = EmulatedNodes(os.path.join(tmp, "nodes"), 2)
    launcher = [a for arg in nodes.launcher_args() for a in ("--mpiexec-arg", arg)]
    cmd = [sys.executable, "-m", "spmd.launch", "-n", "4", "--hosts", "node0:2,node1:2",
           *launcher, "--max-restarts", "1", "--min-ranks", "2",
           *example_args(4, steps, os.path.join(tmp, "ck"), os.path.join(tmp, "stats"), "-1"),
           "--save-local-every", "1"]
    env = dict(job_env(), **nodes.env())
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines = _Lines(proc)
    try:
        lines.wait(r"step 8 loss", 600)
        killed = time.monotonic()
        assert nodes.kill_node(1)
        banner = lines.wait(r"spmd-run: attempt 2 of 2", 300, killed)
        resumed = lines.wait(r"resumed from step", 300, killed)
        training = lines.wait(r"step \d+ loss", 300, resumed)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        for k in range(2):
            nodes.kill_node(k)
    text = "\n".join(line for _, line in lines.lines)
    if proc.returncode != 0:
        raise SystemExit(f"the recovery job failed:\n{text[-4000:]}")
    return {"seconds": training - killed, "noticed_s": banner - killed,
            "started_and_restored_s": resumed - banner, "first_step_s": training - resumed,
            "resumed_from": int(re.findall(r"resumed from step (\d+)", text)[0]),
            "left_in_shm": nodes.leftovers()}


def measure_recovery(steps: int, rounds: int) -> dict:
    got = []
    for k in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            got.append(recovery_round(tmp, steps))
        print(f"recovery round {k + 1}: {got[-1]['seconds']:.2f} s "
              f"({got[-1]['noticed_s']:.2f} noticed, {got[-1]['started_and_restored_s']:.2f} "
              f"started and restored, {got[-1]['first_step_s']:.2f} first step)", flush=True)
    value = statistics.median(r["seconds"] for r in got)
    parts = {key: statistics.median(r[key] for r in got)
             for key in ("noticed_s", "started_and_restored_s", "first_step_s")}
    return {"part": "recovery", "ranks": "4 -> 2", "nodes": "2 emulated", "steps": steps,
            "rounds": got, **parts, "value": value, "goal": GOALS["recovery"],
            "met": value <= GOALS["recovery"]}


# ------------------------------------------------------------------ restore

def restore_worker(megabytes: float, rounds: int, out: str) -> None:
    """Run on every rank: save ``megabytes`` to memory, drop node1's files, restore."""
    import numpy as np
    from mpi4py import MPI

    import spmd
    from spmd import P, NamedSharding, checkpointing

    comm, me = MPI.COMM_WORLD, spmd.process_index()
    n = spmd.process_count()
    mesh = spmd.make_mesh((n,), ("i",))
    rows = int(megabytes * 1e6 / 4 / 1024 / 8) // n * n
    leaves = {f"w{j}": spmd.make_array_from_callback(
        (rows, 1024), NamedSharding(mesh, P("i")),
        lambda idx, j=j: np.full((idx[0].stop - idx[0].start, 1024), j, np.float32))
        for j in range(8)}
    target = {k: NamedSharding(mesh, P(None, "i")) for k in leaves}
    times, saves = [], []
    for k in range(rounds):
        comm.Barrier()
        t0 = time.perf_counter()
        where = checkpointing.save(out, leaves, step=k, local=True)
        saves.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        if spmd.process_index() == 0:  # what node1's ranks wrote goes, as with node1
            for name in os.listdir(where):
                if any(f".w{r}." in name for r in range(n // 2, n)):
                    os.remove(os.path.join(where, name))
        comm.Barrier()
        t0 = time.perf_counter()
        got = checkpointing.restore(out, target)
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        assert all(float(np.asarray(s.data).mean()) == j for j, x in
                   enumerate(got.values()) for s in x.addressable_shards[:1])
    if me == 0:
        total = sum(x.nbytes for x in leaves.values())
        print("RESTORE " + json.dumps({"bytes": total, "restore_s": times, "save_s": saves}),
              flush=True)


def measure_restore(n: int, megabytes: float, rounds: int, mpiexec: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "spmd.launch", "--mpiexec", mpiexec, "--no-prefix",
               "-n", str(n), os.path.abspath(__file__), "--worker", str(megabytes),
               str(rounds), os.path.join(tmp, "ck")]
        proc = subprocess.run(cmd, cwd=REPO, env=dict(job_env(), SPMD_SIMULATE_NODES="2"),
                              text=True, capture_output=True, timeout=1800)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESTORE ")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    got = json.loads(line[0][len("RESTORE "):])
    value = statistics.median(got["restore_s"])
    print(f"restore of {got['bytes'] / 1e6:.0f} MB: {value:.3f} s (median), save "
          f"{statistics.median(got['save_s']):.3f} s", flush=True)
    return {"part": "restore", "ranks": n, "nodes": "2 simulated", "bytes": got["bytes"],
            "rounds": got["restore_s"], "save_s": statistics.median(got["save_s"]),
            "value": value, "goal": GOALS["restore"], "met": value <= GOALS["restore"]}


# ------------------------------------------------------------------ results

def table(rows: list[dict]) -> str:
    lines = ["| goal | job | measured (median) | floor or parts | goal | | run |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ok = "met" if r["met"] else "not met"
        ok += (f" | {r['date'][:10]}, `{str(r.get('commit', '?'))[:7]}`, "
               f"{r['machine'].get('usable_cores', '?')} cores")
        if r["part"] == "overhead":
            lines.append(f"| save to memory every step | example, {r['ranks']} ranks, "
                         f"{r['nodes']} nodes | {r['tokens_per_s_per_rank_on'] / 1e3:.2f}k "
                         f"tokens/s per rank ({r['value']:+.1%}) | no save: "
                         f"{r['tokens_per_s_per_rank_off'] / 1e3:.2f}k | <= 3% | {ok} |")
        elif r["part"] == "recovery":
            lines.append(f"| from a lost node to training | example, {r['ranks']} ranks, "
                         f"{r['nodes']} nodes | {r['value']:.1f} s | noticed "
                         f"{r['noticed_s']:.1f} s, started and restored "
                         f"{r['started_and_restored_s']:.1f} s, first step "
                         f"{r['first_step_s']:.1f} s | <= 10 s | {ok} |")
        else:
            lines.append(f"| restore from memory | {r['bytes'] / 1e6:.0f} MB, {r['ranks']} "
                         f"ranks, {r['nodes']} nodes, node1's files gone | {r['value']:.2f} s "
                         f"| save {r['save_s']:.2f} s | <= 1 s | {ok} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        restore_worker(float(argv[1]), int(argv[2]), argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="overhead,restore")
    ap.add_argument("--ranks", type=int, default=4, help="ranks of overhead and restore")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--megabytes", type=float, default=100.0)
    ap.add_argument("--mpiexec", default=os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    ap.add_argument("--commit", default=None, help="the commit measured (where git is missing)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fast_tier.json"))
    args = ap.parse_args(argv)
    provenance = common.provenance()
    if args.commit:
        provenance["commit"] = args.commit
    rows = []
    for part in args.parts.split(","):
        if part == "overhead":
            row = measure_overhead(args.ranks, args.steps, args.rounds, args.mpiexec)
        elif part == "recovery":
            row = measure_recovery(args.steps, args.rounds)
        elif part == "restore":
            row = measure_restore(args.ranks, args.megabytes, args.rounds, args.mpiexec)
        else:
            raise SystemExit(f"--parts: unknown part {part!r} (overhead, recovery, restore)")
        rows.append(dict(row, date=common.now_iso(), **provenance,
                         machine=common.machine_info()))
    old = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            # (A row per part and size: the overhead of 2 ranks on 2 cores and of 8 on
            # 13 are both kept.)
            new = {(r["part"], str(r["ranks"])) for r in rows}
            old = [r for r in json.load(f)["rows"] if (r["part"], str(r["ranks"])) not in new]
    every = sorted(old + rows, key=lambda r: (list(GOALS).index(r["part"]), str(r["ranks"])))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:  # (the call's provenance; each row keeps its own)
        json.dump({"benchmark": "the fast tier of checkpoints (issue 57)",
                   "date": common.now_iso(), **provenance, "machine": common.machine_info(),
                   "rows": every}, f, indent=1)
    print(table(every))
    return 0


if __name__ == "__main__":
    sys.exit(main())
