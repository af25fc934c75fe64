"""Would thread ranks speed up a simulated mesh?  (A diagnostic for the engine.)

The idea measured: run a simulated mesh's devices in groups, one group per core,
each group's part of the program in its own thread (a "thread rank").  This
script stands each half of the ``small`` 4 x 2 transformer step of
``bench_engine.py`` by a 2 x 2 step over half the batch (the same per-device
blocks) and times:

- ``one half``: one such step alone;
- ``two halves, threads``: two of them at once, one per thread of this process;
- ``two halves, processes``: two of them at once, one per process;
- ``GIL probe``: one half while a second thread counts in pure Python.

Each engine runs on one thread here (``SPMD_NUM_THREADS=1``, ``OPENBLAS_NUM_THREADS=1``)
so that the halves are the only parallelism.  Ideal thread ranks would run two
halves in the time of one.

    .venv-bench/bin/python benchmarks/engine_threads_probe.py

Nothing is saved; the numbers only decide what to build (docs/performance.md).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

os.environ.setdefault("SPMD_NUM_DEVICES", "8")
os.environ["SPMD_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
for p in (HERE, os.path.dirname(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

STEPS = 15


def half_step():
    """(run(batch) -> loss, three batches) of the small config on a 2 x 2 mesh at half
    the benchmark's batch: each device's blocks are those of the 4 x 2 step."""
    import bench_engine as B

    argv, batch = B.CONFIGS["small"]
    B.CONFIGS["small"] = (argv, batch // 2)
    run, *_ = B._spmd_engine("small", (2, 2))
    batches = B._batches("small", 3)
    for b in batches:  # compile and warm up
        run(b)
    return run, batches


def timed(run, batches, n=STEPS) -> float:
    ts = []
    for i in range(n):
        t0 = time.perf_counter()
        run(batches[i % len(batches)])
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def in_threads(halves) -> float:
    ts = []
    for i in range(STEPS):
        threads = [threading.Thread(target=run, args=(bs[i % len(bs)],)) for run, bs in halves]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def gil_probe(run, batches) -> tuple[float, float]:
    """(ms per step, the counter's rate as a fraction of its rate alone) while a thread
    counts in pure Python."""
    def count(stop, out):
        n = 0
        while not stop:
            n += 1
        out.append(n)

    def counter_for(seconds, work=None):
        stop, out = [], []
        t = threading.Thread(target=count, args=(stop, out))
        t.start()
        t0, steps = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            if work is None:
                time.sleep(0.01)
            else:
                work(batches[steps % len(batches)])
                steps += 1
        elapsed = time.perf_counter() - t0
        stop.append(1)
        t.join()
        return out[0] / elapsed, elapsed / max(steps, 1)

    alone, _ = counter_for(1.0)
    shared, per_step = counter_for(2.0, run)
    return per_step * 1e3, shared / alone


def child(start_at: float) -> None:
    run, batches = half_step()
    while time.time() < start_at:
        time.sleep(0.001)
    print(f"{timed(run, batches):.1f}", flush=True)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(float(sys.argv[2]))
        return 0
    halves = [half_step() for _ in range(2)]
    alone = timed(*halves[0])
    threads = in_threads(halves)
    probe_ms, counter_share = gil_probe(*halves[0])
    # Two processes, each building its half, then timing at the same moment.
    start_at = time.time() + 30
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(start_at)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    per_proc = [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    print(f"one half alone:             {alone:7.1f} ms")
    print(f"two halves, threads:        {threads:7.1f} ms  ({2 * alone / threads:.2f}x the "
          "throughput of one thread)")
    print(f"two halves, processes:      {max(per_proc):7.1f} ms  "
          f"({2 * alone / max(per_proc):.2f}x)")
    print(f"GIL probe: one half took    {probe_ms:7.1f} ms beside a counting thread, "
          f"which ran at {counter_share:.0%} of its rate alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
