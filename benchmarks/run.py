"""Run the benchmarks, print a table, save the results as JSON.

Usage::

    python benchmarks/run.py              # every benchmarks/bench_*.py
    python benchmarks/run.py mlp          # only bench_mlp.py (names with or without bench_)
    python benchmarks/run.py --quick      # fewer repetitions: a smoke run (< 30 s)
    python benchmarks/run.py --strict     # exit 1 if any goal is missed

Each ``bench_<name>.py`` defines ``run(quick: bool) -> list[dict]`` (rows made by
``common.row``), and may define ``skip_reason() -> str | None``: a reason it
cannot run in this process (``bench_mpi.py`` runs only under mpiexec; see
``make bench-mpi``) makes the runner print it and go on.  Results go to
``benchmarks/results/<name>.json`` with the date, the machine (CPU, cores, numpy and its BLAS) and every raw timing; a ``--quick``
run writes ``benchmarks/results/tmp_quick_<name>.json`` instead (ignored by git),
so that a smoke run never overwrites the recorded numbers.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402  (needs HERE on sys.path; it puts the repo root there too)


def discover() -> dict[str, str]:
    """``{name: path}`` of every ``bench_<name>.py`` beside this file."""
    paths = sorted(glob.glob(os.path.join(HERE, "bench_*.py")))
    return {os.path.basename(p)[len("bench_"):-len(".py")]: p for p in paths}


def select(available: dict[str, str], wanted: list[str]) -> dict[str, str]:
    if not wanted:
        return available
    chosen = {}
    for w in wanted:
        name = w.removeprefix("bench_").removesuffix(".py")
        if name not in available:
            raise SystemExit(f"run.py: no benchmark named {w!r}; available: "
                             f"{', '.join(available) or '(none)'}")
        chosen[name] = available[name]
    return chosen


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)) and not callable(
            getattr(module, "skip_reason", None)):
        raise SystemExit(f"run.py: {path} defines no run(quick) function")
    return module


def save(name: str, rows: list[dict], quick: bool, seconds: float, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    fname = f"tmp_quick_{name}.json" if quick else f"{name}.json"
    path = os.path.join(out_dir, fname)
    doc = {"benchmark": name, "date": common.now_iso(), **common.provenance(), "quick": quick,
           "wall_seconds": round(seconds, 2), "machine": common.machine_info(), "rows": rows}
    tmp = path + ".partial"
    with open(tmp, "w") as f:  # write then rename: never a half-written results file
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--no-save", action="store_true", help="do not write JSON results")
    ap.add_argument("--out", default=os.path.join(HERE, "results"),
                    help="directory for the JSON results (default: benchmarks/results)")
    args = ap.parse_args(argv)

    chosen = select(discover(), args.names)
    common.provenance()  # the commit and tree state now, before anything runs
    info = common.machine_info()
    print(f"# {common.now_iso()}  {info['cpu']}, {info['usable_cores']} usable cores, "
          f"Python {info['python']}, numpy {info['numpy']}, BLAS {_blas_name(info['blas'])}"
          + ("  (quick)" if args.quick else ""), flush=True)
    all_rows, failed = [], []
    for name, path in chosen.items():
        module = load(name, path)
        # A module may say it cannot run here (bench_mpi.py: only under mpiexec).
        reason = getattr(module, "skip_reason", lambda: None)()
        if reason:
            print(f"\n## {name}: skipped: {reason}", flush=True)
            continue
        t0 = time.perf_counter()
        rows = common.summarize(module.run(quick=args.quick))
        seconds = time.perf_counter() - t0
        print(f"\n## {name} ({seconds:.1f} s)\n\n{common.table(rows)}", flush=True)
        if not args.no_save:
            print(f"\nsaved {os.path.relpath(save(name, rows, args.quick, seconds, args.out))}")
            if not args.quick and os.path.abspath(args.out) == os.path.join(HERE, "results"):
                regenerate_tables()
        all_rows += rows
        failed += [f"{name}: {r['benchmark']} / {r['variant']}" for r in rows
                   if r["passed"] is False]
    if failed:
        print("\ngoals missed:\n  " + "\n  ".join(failed))
    return 1 if failed and args.strict else 0


def regenerate_tables() -> None:
    """Rewrite the results tables of docs/results.md from the recorded runs."""
    import make_tables

    make_tables.main([])
    print(f"updated {os.path.relpath(make_tables.DOC)} (benchmarks/make_tables.py)")


def _blas_name(blas: dict) -> str:
    if blas.get("source") == "threadpoolctl":
        return ", ".join(f"{lib.get('internal_api')} {lib.get('version')} "
                         f"({lib.get('num_threads')} threads)" for lib in blas["libraries"])
    return f"{blas.get('name')} {blas.get('version')}"


if __name__ == "__main__":
    sys.exit(main())
