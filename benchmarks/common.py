"""Timing utilities shared by the ``benchmarks/bench_*.py`` modules.

Rules every benchmark follows (see ``docs/performance.md``):

- Variants that are compared run in one process, interleaved (A, B, A, B, ...),
  so that slow phases of the machine (frequency changes, a neighbour's load)
  hit every variant alike.
- Each variant is warmed up first; each sample times a loop of ``number`` calls
  (calibrated so that a sample lasts a few milliseconds: the timer's own cost
  disappears); many samples are taken and their median is reported with the
  interquartile range.
- The garbage collector is off while timing, as in :mod:`timeit`.

A benchmark module defines ``run(quick: bool) -> list[dict]``; each dict is a
row made by :func:`row`.  ``benchmarks/run.py`` computes the statistics,
ratios against the baseline row and the pass/fail of each goal.

Example::

    times = interleave({"numpy": f_np, "spmd": f_jit}, repeats=50)
    rows = [row("mlp", "numpy", times["numpy"]),
            row("mlp", "spmd", times["spmd"], baseline="numpy", goal_ratio=1.15)]
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

# The environment spmd's programs run in under spmd-run (and when spmd is imported
# before numpy): OpenBLAS's threads sleep soon after a call instead of spinning on the
# cores the engine's threads use (spmd/config.py).  Read by OpenBLAS when numpy loads;
# the numpy floors are unaffected (docs/history/2026-12-05-engine-rounds.md).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # so that a checkout runs without `pip install -e .`
    sys.path.insert(0, _REPO)

clock = time.perf_counter


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):  # not on this platform
        return None


# The load before this process did any work: a results file records it, so that a
# table can say when its numbers were measured on a machine busy with other jobs.
LOAD_AT_START = _load_average()


# ----------------------------------------------------------------- timing

def time_once(fn: Callable[[], Any], number: int = 1) -> float:
    """Seconds per call of ``fn`` over a loop of ``number`` calls."""
    t0 = clock()
    for _ in range(number):
        fn()
    return (clock() - t0) / number


def calibrate(fn: Callable[[], Any], target_s: float) -> int:
    """How many calls of ``fn`` make one sample of at least ``target_s`` seconds."""
    per_call = statistics.median(time_once(fn) for _ in range(3))
    return max(1, math.ceil(target_s / max(per_call, 1e-9)))


def interleave(variants: dict[str, Callable[[], Any]], *, repeats: int, warmup: int = 3,
               target_s: float = 0.002, number: dict[str, int] | None = None
               ) -> dict[str, list[float]]:
    """Time the variants alternately; return ``{name: [seconds per call, ...]}``.

    Each of the ``repeats`` rounds takes one sample of every variant; the order
    within a round rotates, so that no variant always runs first after another.

    >>> t = interleave({"a": lambda: None, "b": lambda: None}, repeats=5)
    >>> sorted(t), len(t["a"])
    (['a', 'b'], 5)
    """
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    number = dict(number or {})
    for name in names:
        number.setdefault(name, calibrate(variants[name], target_s))
    times: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                times[name].append(time_once(variants[name], number[name]))
    finally:
        if was_enabled:
            gc.enable()
    return times


def first_call_times(make: Callable[[], Callable[[], Any]], *, repeats: int,
                     steady_calls: int = 20) -> tuple[list[float], list[float]]:
    """Time the first call of fresh callables, and steady calls of the same ones.

    ``make()`` builds a fresh callable (e.g. ``lambda: (lambda: spmd.jit(f)(x))``).
    Returns ``(first_call_seconds, steady_call_seconds)``, one entry per repeat;
    the steady time of a repeat is the median of ``steady_calls`` later calls.
    """
    firsts, steadies = [], []
    for _ in range(repeats):
        gc.collect()
        t0 = clock()
        fn = make()
        fn()
        firsts.append(clock() - t0)
        steadies.append(statistics.median(time_once(fn) for _ in range(steady_calls)))
    return firsts, steadies


# -------------------------------------------------------------- statistics

def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """``(q1, median, q3)`` of ``xs`` (inclusive method; a single value repeats)."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, med, q3


def row(benchmark: str, variant: str, times: list[float], *, baseline: str | None = None,
        goal_ratio: float | None = None, goal_max_s: float | None = None, unit: str = "ms",
        note: str = "") -> dict:
    """One result row: ``times`` are seconds (per call, or a derived quantity).

    ``baseline`` names the variant of the same ``benchmark`` that the ratio is
    taken against; ``goal_ratio`` is the largest acceptable ratio of medians,
    ``goal_max_s`` the largest acceptable median in seconds.  ``unit`` is how the
    table shows times: ``"s"``, ``"ms"`` or ``"us"`` (or ``"MiB"`` for a row of byte
    counts).
    """
    if unit not in UNITS:
        raise ValueError(f"row: unit must be one of {sorted(UNITS)}, got {unit!r}")
    return {"benchmark": benchmark, "variant": variant, "times_s": [float(t) for t in times],
            "baseline": baseline, "goal_ratio": goal_ratio, "goal_max_s": goal_max_s,
            "unit": unit, "note": note}


UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6,
         "MiB": 1 / 2 ** 20,  # a memory row holds bytes in ``times_s`` (bench_arrays.py)
         "%": 100.0}  # a fraction row holds fractions (bench_pipeline.py's bubbles)


def summarize(rows: list[dict]) -> list[dict]:
    """Add median/IQR, the ratio against the baseline row and the goal's verdict."""
    by_key = {(r["benchmark"], r["variant"]): r for r in rows}
    for r in rows:
        q1, med, q3 = quantiles(r["times_s"])
        r.update(median_s=med, q1_s=q1, q3_s=q3, n=len(r["times_s"]))
    for r in rows:
        r["ratio"] = None
        if r["baseline"] is not None:
            base = by_key.get((r["benchmark"], r["baseline"]))
            if base is None:
                raise KeyError(f"{r['benchmark']}/{r['variant']}: baseline variant "
                               f"{r['baseline']!r} has no row")
            r["ratio"] = r["median_s"] / base["median_s"] if base["median_s"] > 0 else math.inf
        verdicts = []
        if r["goal_ratio"] is not None:
            verdicts.append(r["ratio"] is not None and r["ratio"] <= r["goal_ratio"])
        if r["goal_max_s"] is not None:
            verdicts.append(r["median_s"] <= r["goal_max_s"])
        r["passed"] = all(verdicts) if verdicts else None
    return rows


def fmt_time(seconds: float, unit: str) -> str:
    v = seconds * UNITS[unit]
    text = f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return f"{text} {'µs' if unit == 'us' else unit}"


def fmt_goal(r: dict) -> str:
    parts = []
    if r["goal_ratio"] is not None:
        parts.append(f"ratio <= {r['goal_ratio']:g}")
    if r["goal_max_s"] is not None:
        parts.append(f"<= {fmt_time(r['goal_max_s'], r['unit'])}")
    return ", ".join(parts) or "-"


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table (also readable on a terminal)."""
    head = ["benchmark", "variant", "median", "IQR", "ratio", "goal", "result"]
    body = []
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "-"}[r["passed"]]
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        iqr = fmt_time(r["q3_s"] - r["q1_s"], r["unit"])
        body.append([r["benchmark"], r["variant"], fmt_time(r["median_s"], r["unit"]), iqr,
                     ratio, fmt_goal(r), verdict])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(head), sep] + [line(b) for b in body])


# ------------------------------------------------------ benchmarks on MPI ranks

def mpi_only(stem: str) -> str:
    """The reason ``benchmarks/run.py`` gives for skipping an MPI benchmark with its own
    :func:`mpi_main`."""
    return (f"runs on 2 or more MPI ranks with its own main: spmd-run -n 2 "
            f"benchmarks/bench_{stem}.py")


def mpi_main(stem: str, doc: str, measure: Callable[[int], list[dict]], argv=None, *,
             rounds: int = 30, footer: Callable[[list[dict]], str] | None = None) -> int:
    """The ``main`` of ``benchmarks/bench_<stem>.py`` run on MPI ranks (``spmd-run -n 2
    benchmarks/bench_<stem>.py [--rounds R] [--no-save] [--out DIR]``): every rank calls
    ``measure(rounds)``, which returns the rows (the same on every rank); rank 0 prints
    the table (and ``footer(rows)``) and saves ``results/<stem>_n<ranks>.json``.  On
    fewer than 2 ranks it says so and returns 0.

    >>> sys.exit(mpi_main("call_path", __doc__, measure, rounds=40))  # doctest: +SKIP
    """
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--no-save", action="store_true", help="print only")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results"))
    args = ap.parse_args(argv)
    import spmd

    if spmd.process_count() < 2:
        print(f"bench_{stem}: skipped: run it on 2 or more MPI ranks "
              f"(spmd-run -n 2 benchmarks/bench_{stem}.py)")
        return 0
    from mpi4py import MPI

    import run as runner

    provenance()
    t0 = time.perf_counter()
    rows = measure(args.rounds)
    seconds = time.perf_counter() - t0
    if MPI.COMM_WORLD.Get_rank() == 0:
        rows = summarize(rows)
        name = f"{stem}_n{MPI.COMM_WORLD.Get_size()}"
        print(f"## {name} ({seconds:.1f} s)\n\n{table(rows)}", flush=True)
        if footer is not None:
            print(f"\n{footer(rows)}")
        if not args.no_save:
            path = runner.save(name, rows, False, seconds, args.out)
            print(f"\nsaved {os.path.relpath(path)}")
    return 0


# ------------------------------------------------------------ resident memory

def status_bytes(field: str) -> int:
    """A byte count of ``/proc/self/status`` (``VmRSS``, ``VmHWM``; Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Reset VmHWM to the current resident set (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


# ----------------------------------------------------------------- machine

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _blas() -> dict:
    """The BLAS numpy uses: threadpoolctl's live view when installed, else the build config."""
    try:
        import threadpoolctl

        return {"source": "threadpoolctl", "libraries": [
            {k: v for k, v in lib.items() if k in ("internal_api", "version", "num_threads",
                                                  "threading_layer", "architecture")}
            for lib in threadpoolctl.threadpool_info()]}
    except ImportError:
        pass
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return {"source": "numpy.show_config", "name": blas.get("name"),
                "version": blas.get("version"),
                "configuration": blas.get("openblas configuration")}
    except Exception as e:  # the config layout differs between numpy versions
        return {"source": "unavailable", "error": repr(e)}


_PROVENANCE: dict = {}


def provenance() -> dict:
    """What produced a result: the git commit (and whether the tree had changes) and
    the command line, with the launcher when the process is an MPI rank.  Read once,
    at the first call (runners call it before measuring): the code that ran is the
    code of that moment, whatever the tree holds when the results are saved."""
    if not _PROVENANCE:
        _PROVENANCE.update(_read_provenance())
    return dict(_PROVENANCE)


def _read_provenance() -> dict:
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
    launcher = f"mpiexec -n {size} " if size and size != "1" else ""
    return {"commit": git("rev-parse", "HEAD"),
            # Changes to recorded results and docs do not change what was measured.
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                              ":(exclude)benchmarks/results", ":(exclude)docs")),
            "command": launcher + "python " + " ".join(sys.argv)}


def machine_info() -> dict:
    """Where the numbers were measured: CPU, cores, Python, numpy and its BLAS."""
    import numpy as np

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "usable_cores": usable,
            "platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "blas": _blas(),
            "load_average_at_start": LOAD_AT_START, "load_average_at_end": _load_average(),
            "blas_threads_env": {k: os.environ[k] for k in
                                 ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                  "OPENBLAS_THREAD_TIMEOUT", "SPMD_NUM_THREADS")
                                 if k in os.environ}}


def now_iso() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")
