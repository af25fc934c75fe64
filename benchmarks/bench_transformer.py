"""The transformer example on 1, 2 and 4 ranks: tokens per second and per-rank memory.

    .venv/bin/python benchmarks/bench_transformer.py [--steps 20]

Launches ``spmd-run -n N examples/train_transformer.py`` for each configuration
below (the default model), collects each rank's ``--stats`` file, and writes
``benchmarks/results/transformer.json`` (with the git commit and the commands)
and a markdown table on stdout:

- tokens per second after the first step (which traces and compiles);
- per rank: peak RSS, the bytes of parameters and of optimizer state its
  devices hold, and the share of the steady steps' time it spent in MPI
  collectives (``spmd.distributed.collective_time``: waiting for the other
  ranks counts as communication).  With ``--fsdp`` the parameter and optimizer bytes per rank must
  fall as 1/D (D = the 'data' size): the ``1/D check`` column divides the
  non-FSDP bytes by D and compares.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RUN = os.path.join(os.path.dirname(sys.executable), "spmd-run")

CONFIGS = [  # (ranks, mesh, fsdp)
    (1, "data=1,model=1", False),
    (2, "data=2,model=1", False),
    (2, "data=2,model=1", True),
    (4, "data=2,model=2", False),
    (4, "data=2,model=2", True),
    (4, "data=4,model=1", False),
    (4, "data=4,model=1", True),
]


def skip_reason() -> str:
    """``run.py`` skips this module: it launches its own MPI jobs (minutes, not
    seconds) and writes its own results; ``make bench-transformer`` runs it."""
    return ("launches its own spmd-run jobs: `make bench-transformer` "
            "(= .venv/bin/python benchmarks/bench_transformer.py --steps 20)")


def run_one(ranks: int, mesh: str, fsdp: bool, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats")
        cmd = [RUN, "-n", str(ranks), os.path.join("examples", "train_transformer.py"),
               "--mesh", mesh, "--steps", str(steps), "--sample", "0", "--log-every",
               str(steps), "--stats", stats] + (["--fsdp"] if fsdp else [])
        env = dict(os.environ, SPMD_NUM_DEVICES="1")
        proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True,
                              timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        ranks_stats = [json.load(open(p)) for p in sorted(glob.glob(stats + ".rank*.json"))]
    return {"command": " ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c
                                for c in cmd),
            "ranks": ranks, "mesh": mesh, "fsdp": fsdp,
            "tokens_per_s": ranks_stats[0]["tokens_per_s"],
            "final_loss": ranks_stats[0]["final_loss"],
            "per_rank": [{k: s[k] for k in ("rank", "peak_rss_bytes", "param_bytes",
                                            "opt_state_bytes", "comm_share")}
                         for s in ranks_stats]}


def table(rows: list[dict]) -> str:
    base = {r["mesh"]: r for r in rows if not r["fsdp"]}
    lines = ["| ranks | mesh | FSDP | tokens/s | peak RSS / rank (MiB) | params / rank (KiB) "
             "| optimizer state / rank (KiB) | time in collectives (ranks' range) | 1/D check |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        rss = max(p["peak_rss_bytes"] for p in r["per_rank"]) / 2 ** 20
        params = max(p["param_bytes"] for p in r["per_rank"]) / 1024
        opt = max(p["opt_state_bytes"] for p in r["per_rank"]) / 1024
        shares = [p["comm_share"] or 0.0 for p in r["per_rank"]]
        comm = "-" if r["ranks"] == 1 else \
            f"{100 * min(shares):.0f}-{100 * max(shares):.0f}%"
        check = ""
        if r["fsdp"]:
            d = int(r["mesh"].split(",")[0].split("=")[1])
            ref = base.get(r["mesh"])  # the same mesh without FSDP
            if ref is not None:
                want = max(p["param_bytes"] + p["opt_state_bytes"] for p in ref["per_rank"]) / d
                got = max(p["param_bytes"] + p["opt_state_bytes"] for p in r["per_rank"])
                check = f"{got / want:.2f} x (1/{d} of non-FSDP)"
        lines.append(f"| {r['ranks']} | {r['mesh']} | {'yes' if r['fsdp'] else 'no'} | "
                     f"{r['tokens_per_s']:,.0f} | {rss:.0f} | {params:.0f} | {opt:.0f} | {comm} | "
                     f"{check} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    rows = [run_one(n, mesh, fsdp, args.steps) for n, mesh, fsdp in CONFIGS]
    sys.path.insert(0, HERE)
    import common

    out = {"benchmark": "transformer", "date": common.now_iso(), **common.provenance(),
           "machine": common.machine_info(), "rows": rows}
    path = os.path.join(HERE, "results", "transformer.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(table(rows))
    print(f"(written to {os.path.relpath(path, REPO)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
