"""The same benchmarks at two commits, alternating in one run: what did a change cost?

A redesign promises "behaviour and speed stay as they are"; this measures the speed
half.  Each tree runs the benchmark programs as they are at its commit, on the same
machine in the same hour, in rounds whose order flips (base then head, head then
base, ...), so a slow phase of the machine hits both alike::

    python benchmarks/against.py --base 4508cd4                    # head: HEAD
    python benchmarks/against.py --base-tree /tmp/a --head-tree .  # two checkouts
    python benchmarks/against.py --base 4508cd4 --benches call_path,mpi --rounds 3

Given commits, both are checked out into temporary git worktrees (the committed
trees, not the working directory); given folders, both are copied.  Either way each
copy gets *this* ``benchmarks/`` folder, so the same measuring code times each
commit's library (an older commit's benchmarks may lack an option, or time
differently).  Every run writes its results file into a temporary folder of its
own; the rows' medians are gathered per round.  The results
file ``benchmarks/results/against.json`` holds, per row, the medians of each round
at base and at head; its table (``make_tables.py``) gives the median of the rounds'
medians and their ratio head / base, which is the regression (1.00: none).

Benchmarks (``BENCHES``): ``call_path`` (``bench_call_path.py`` under MPI, 2 ranks),
``engine`` (``bench_engine.py``: the transformer step, one device and a 4x2 mesh;
only spmd's rows are compared), ``mpi`` (``bench_mpi.py`` under MPI, 2 ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402

# name -> (command in the tree, with {python} {mpiexec} {out}; the results file's stem)
BENCHES = {
    "call_path": ("{mpiexec} -n 2 {python} benchmarks/against.py --as-rank {out} "
                  "benchmarks/bench_call_path.py --rounds 20 --out {out}", "call_path_n2"),
    "engine": ("{python} benchmarks/bench_engine.py --rounds 8 --no-memory --out {out}", "engine"),
    "mpi": ("{mpiexec} -n 2 {python} benchmarks/against.py --as-rank {out} "
            "benchmarks/bench_mpi.py --out {out}", "mpi_n2"),
}


def medians(doc: dict) -> dict:
    """``"benchmark / variant" -> median seconds`` of one results file (spmd's rows of
    the engine's own format; every timed row of the others)."""
    found = {}
    for r in doc["rows"]:
        if "config" in r:  # bench_engine: one row per config and mesh, times per engine
            if r["times_s"].get("spmd"):
                found[f"engine {r['config']} mesh {r['mesh']} / spmd"] = \
                    statistics.median(r["times_s"]["spmd"])
        elif r.get("times_s"):
            found[f"{r['benchmark']} / {r['variant']}"] = \
                r.get("median_s") or statistics.median(r["times_s"])
    return found


def run_once(tree: str, bench: str, python: str, mpiexec: str) -> dict:
    """One run of ``bench`` in ``tree``; its rows' medians."""
    command, stem = BENCHES[bench]
    with tempfile.TemporaryDirectory(prefix="spmd-against-") as out:
        argv = command.format(python=python, mpiexec=mpiexec, out=out).split()
        # The tree first: its spmd, not an installed one (other entries stay: a
        # machine may bring mpi4py or numba on PYTHONPATH).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        # Output into files, not pipes: a launcher's forwarding (MPICH's gforker) may
        # close a pipe before the last rank's last line.
        log = os.path.join(out, "output.txt")
        with open(log, "w") as sink:
            done = subprocess.run(argv, cwd=tree, env=env, stdout=sink,
                                  stderr=subprocess.STDOUT, timeout=1800)
        if done.returncode != 0:
            # (errors="replace": two ranks' lines may interleave inside a character)
            text = ""
            for name in sorted(os.listdir(out)):
                if name.endswith(".txt"):
                    with open(os.path.join(out, name), encoding="utf-8",
                              errors="replace") as f:
                        text += f"--- {name}\n" + f.read()
            raise SystemExit(f"against.py: {bench} failed in {tree} (exit "
                             f"{done.returncode}):\n{text[-4000:]}")
        with open(os.path.join(out, f"{stem}.json")) as f:
            return medians(json.load(f))


def checkout(which: str, commit: str | None, tree: str | None, where: str) -> str:
    """A copy of ``tree`` (or a git worktree of ``commit``) under ``where``, holding this
    ``benchmarks/`` folder; its path."""
    path = os.path.join(where, which)
    if tree:
        shutil.copytree(tree, path, ignore=shutil.ignore_patterns(
            ".git", ".venv*", "__pycache__", "build", ".snap*", ".whl*"))
        if not os.path.exists(os.path.join(path, "COMMIT")) and _commit(tree):
            with open(os.path.join(path, "COMMIT"), "w") as f:
                f.write(_commit(tree) + "\n")
    else:
        subprocess.run(["git", "worktree", "add", "--detach", path, commit],
                       cwd=os.path.dirname(HERE), check=True, capture_output=True)
        with open(os.path.join(path, "COMMIT"), "w") as f:
            f.write(_commit(path) + "\n")
    shutil.rmtree(os.path.join(path, "benchmarks"), ignore_errors=True)
    shutil.copytree(HERE, os.path.join(path, "benchmarks"),
                    ignore=shutil.ignore_patterns("__pycache__", "results"))
    os.makedirs(os.path.join(path, "benchmarks", "results"))
    return path


def compare(trees: dict, benches: list, rounds: int, python: str, mpiexec: str) -> list:
    """Rows ``{"benchmark", "base_s": [...], "head_s": [...]}``: per round, each
    tree's median, the order of the trees flipping every round."""
    found: dict = {}
    for r in range(rounds):
        order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
        for bench in benches:
            for which in order:
                t0 = time.perf_counter()
                for key, value in run_once(trees[which], bench, python, mpiexec).items():
                    found.setdefault(key, {"base_s": [], "head_s": []})
                    found[key][f"{which}_s"].append(value)
                print(f"round {r + 1}/{rounds}: {bench} at {which} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return [{"benchmark": k, **v} for k, v in found.items()
            if len(v["base_s"]) == len(v["head_s"]) == rounds]


def table(rows: list) -> str:
    """The Markdown table of an ``against.json`` (``make_tables.py`` calls it): the
    measured rows (spmd's, and the floors', whose code the commits share: their ratio
    is the machine's drift between the runs), the median over rounds at each commit,
    and head / base."""
    lines = ["| benchmark / variant | base | head | head / base |",
             "| --- | --- | --- | --- |"]
    derived = ("added", " vs ", "faster floor")  # computed from the measured rows
    for r in rows:
        if any(w in r["benchmark"].split(" / ")[-1] for w in derived):
            continue
        b, h = statistics.median(r["base_s"]), statistics.median(r["head_s"])
        lines.append(f"| {r['benchmark']} | {common.fmt_time(b, 'us')} | "
                     f"{common.fmt_time(h, 'us')} | {h / b:.2f} |")
    return "\n".join(lines)


def as_rank(logdir: str, script: str, *args: str) -> None:
    """Run ``script`` as this MPI rank with its output in ``logdir/rank<N>.txt``: a
    launcher's forwarding of ranks' output (MPICH's gforker) may close its pipe
    before the last line, and the rank then dies of a broken pipe."""
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    sink = open(os.path.join(logdir, f"rank{rank}.txt"), "w")
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-rank"]:
        as_rank(*argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="the commit to compare against")
    ap.add_argument("--head", default="HEAD", help="the commit measured (default HEAD)")
    ap.add_argument("--base-tree", help="a checkout to compare against (instead of --base)")
    ap.add_argument("--head-tree", help="the checkout measured (instead of --head)")
    ap.add_argument("--benches", default=",".join(BENCHES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mpiexec", default=_mpiexec())
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args(argv)
    benches = args.benches.split(",")
    unknown = sorted(set(benches) - BENCHES.keys())
    if unknown:
        ap.error(f"--benches: unknown {unknown}; known: {sorted(BENCHES)}")
    if not (args.base or args.base_tree):
        ap.error("give --base COMMIT or --base-tree DIR")
    for name in ("base_tree", "head_tree"):
        folder = getattr(args, name)
        if folder and not os.path.isdir(os.path.join(folder, "spmd")):
            ap.error(f"--{name.replace('_', '-')} {folder!r}: not a checkout of spmd (it "
                     "has no spmd/ folder); give the repository's root")
    common.provenance()
    with tempfile.TemporaryDirectory(prefix="spmd-against-trees-") as where:
        try:
            trees = {"base": checkout("base", args.base, args.base_tree, where),
                     "head": checkout("head", args.head, args.head_tree, where)}
            commits = {k: _tree_commit(t) for k, t in trees.items()}
            t0 = time.perf_counter()
            rows = compare(trees, benches, args.rounds, sys.executable, args.mpiexec)
            seconds = time.perf_counter() - t0
        finally:
            shutil.rmtree(where, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=os.path.dirname(HERE))
    for row in rows:
        row.update(variant="head vs base", base_commit=commits["base"],
                   head_commit=commits["head"], rounds=args.rounds)
    # The results file's commit is the one measured (head); the rows name both.  (Read
    # from the copies: this script's own tree may be a folder without git.)
    common._PROVENANCE.update(commit=commits["head"], dirty=False)
    print(f"\nbase {commits['base']}, head {commits['head']}, {args.rounds} rounds\n\n"
          + table(rows))
    if not args.no_save:
        import run as runner

        path = runner.save("against", rows, False, seconds, os.path.join(HERE, "results"))
        print(f"\nsaved {os.path.relpath(path)}")
    return 0


def _mpiexec() -> str:
    """The MPI launcher beside this Python (the venv's MPICH), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else (shutil.which("mpiexec") or "mpiexec")


def _commit(tree: str) -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True,
                          text=True)
    return done.stdout.strip()


def _tree_commit(tree: str) -> str | None:
    """The commit a copy holds: named in its ``COMMIT`` file (written for a worktree;
    a copied folder without git brings its own, e.g. ``git archive``'s caller's), else
    git's."""
    path = os.path.join(tree, "COMMIT")
    if os.path.exists(path):
        return open(path).read().strip()
    return _commit(tree) or None


if __name__ == "__main__":
    sys.exit(main())
