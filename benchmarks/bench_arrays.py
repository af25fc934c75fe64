"""Arrays spread over processes: memory per rank and the cost of a jitted elementwise
``shard_map``, on 1, 2 and 4 MPI ranks (one device each).

``python benchmarks/run.py arrays`` launches the MPI jobs itself (with the venv's
``mpiexec``); each rank of a job runs this file with ``--worker``:

- ``rss_growth[4 ranks x 128 MiB]``: on 4 ranks, the growth of each rank's peak
  resident set (``VmHWM``, reset just before) while it creates a ``P('d')``
  array of 128 MiB per rank (``make_array_from_callback``) and two jitted
  elementwise ``shard_map`` results of it; goal: <= 3.5 x the local shard (the
  ideal is 3: the input and the two results).  Variants: ``local shard`` (the
  block's bytes: the baseline) and ``spmd`` (one sample per rank).
- ``peak_rss[128 MiB/rank]``: the same job's per-rank peak resident set on 1, 2
  and 4 ranks (weak scaling); goal: 2 and 4 ranks within 10% of 1 rank.
- ``elementwise[16 MiB/rank]``: on 4 ranks, ``jit(shard_map(lambda b: b * 2.0))``
  of a ``P('d')`` array against numpy's ``local * 2.0`` on the same block,
  interleaved; the ranks time in turn (it does not communicate, and the others
  wait without spinning), and the samples of every rank are pooled; goal:
  ratio <= 1.2.

``--quick`` uses 32 MiB per rank and fewer samples.  The values are checked
before anything is measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# (common puts the repo root on sys.path too)
from common import interleave, reset_peak, row, status_bytes  # noqa: E402

MIB = 1024 * 1024
COLS = 1024
MEMORY_GOAL = 3.5
WEAK_GOAL = 1.10
SPEED_GOAL = 1.2
_TAG = "BENCH_ARRAYS_RESULT "


# ------------------------------------------------------------------ workers

def _mesh_and_fns():
    import numpy as np
    import spmd
    from spmd import NamedSharding, P

    # One device per process (a single process alone would otherwise simulate several).
    firsts = [next(d for d in spmd.devices() if d.process_index == p)
              for p in range(spmd.process_count())]
    mesh = spmd.Mesh(np.array(firsts, dtype=object), ("d",))
    s = NamedSharding(mesh, P("d"))
    double = spmd.jit(spmd.shard_map(lambda b: b * 2.0, mesh=mesh, in_specs=P("d"),
                                     out_specs=P("d")))
    plus = spmd.jit(spmd.shard_map(lambda b: b + 1.0, mesh=mesh, in_specs=P("d"),
                                   out_specs=P("d")))
    return mesh, s, double, plus


def _make(s, mesh, mib: int):
    import numpy as np
    import spmd

    rows = mib * MIB // 4 // COLS
    return spmd.make_array_from_callback(
        (rows * mesh.size, COLS), s,
        lambda idx: np.full((rows, COLS), 1.0 + idx[0].start / rows, np.float32))


def memory_worker(mib: int) -> dict:
    """Peak RSS growth of one rank: a P('d') array of ``mib`` MiB and two results."""
    import numpy as np
    import spmd

    mesh, s, double, plus = _mesh_and_fns()
    small = _make(s, mesh, 1)  # traces and compiles (per shape: the big one traces again)
    double(small), plus(small)
    del small
    gc.collect()
    _world().Barrier()
    base = status_bytes("VmRSS")
    reset_peak()
    a = _make(s, mesh, mib)
    y1 = double(a)
    y2 = plus(a)
    peak = status_bytes("VmHWM")
    me = spmd.process_index()
    for y, want in ((y1, 2.0 * (1 + me)), (y2, 2.0 + me)):
        block = np.asarray(y.addressable_shards[0].data)
        assert block.shape == (mib * MIB // 4 // COLS, COLS) and block[0, 0] == want, \
            (block.shape, block[0, 0], want)
    return {"growth": peak - base, "peak": peak, "local_bytes": a.nbytes // mesh.size}


def speed_worker(mib: int, repeats: int) -> dict:
    """Each rank in turn times its block (the operation does not communicate), while
    the others wait without spinning: 2 cores cannot run 4 timing ranks at once."""
    import time

    import numpy as np

    mesh, s, double, _ = _mesh_and_fns()
    a = _make(s, mesh, mib)
    local = np.asarray(a.addressable_shards[0].data)
    np.testing.assert_array_equal(np.asarray(double(a).addressable_shards[0].data), local * 2.0)
    comm = _world()
    times = None
    for turn in range(comm.Get_size()):
        if turn == comm.Get_rank():
            times = interleave({"numpy": lambda: local * 2.0, "spmd": lambda: double(a)},
                               repeats=repeats, target_s=0.01)
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(0.002)
    return times


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def worker_main(argv) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["memory", "speed"], required=True)
    ap.add_argument("--mib", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args(argv)
    out = memory_worker(args.mib) if args.worker == "memory" else \
        speed_worker(args.mib, args.repeats)
    everyone = _world().gather(out, root=0)
    if _world().Get_rank() == 0:
        print(_TAG + json.dumps(everyone), flush=True)


# ------------------------------------------------------------------ driver

def _launch(n: int, *args: str) -> list:
    """Run this file with ``--worker ...`` on ``n`` ranks; rank 0's gathered results."""
    venv_bin = os.path.dirname(sys.executable)
    mpiexec = os.path.join(venv_bin, "mpiexec")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", SPMD_LOCAL_DEVICES="1")
    cmd = [mpiexec, "-n", str(n), sys.executable, os.path.abspath(__file__), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith(_TAG):
            return json.loads(line[len(_TAG):])
    raise RuntimeError(f"bench_arrays: {' '.join(cmd)} failed (exit {proc.returncode}):\n"
                       f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def skip_reason() -> str | None:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        return f"needs {mpiexec} (the mpich wheel: `make venv`)"
    if not os.path.exists("/proc/self/clear_refs"):
        return "needs Linux's /proc/self/clear_refs to reset the peak resident set"
    return None


def run(quick: bool) -> list[dict]:
    mib = 32 if quick else 128
    speed_mib = 16
    rows = []
    peaks = {}
    for n in (1, 2, 4):
        res = _launch(n, "--worker", "memory", "--mib", str(mib))
        peaks[n] = [r["peak"] for r in res]
        if n == 4:
            local = res[0]["local_bytes"]
            bench = f"rss_growth[4 ranks x {mib} MiB]"
            rows.append(row(bench, "local shard", [local], unit="MiB"))
            rows.append(row(bench, "spmd", [r["growth"] for r in res], baseline="local shard",
                            goal_ratio=MEMORY_GOAL, unit="MiB",
                            note="growth of each rank's peak RSS: input + 2 jitted results"))
    bench = f"peak_rss[{mib} MiB/rank]"
    rows.append(row(bench, "1 rank", peaks[1], unit="MiB"))
    for n in (2, 4):
        rows.append(row(bench, f"{n} ranks", peaks[n], baseline="1 rank",
                        goal_ratio=WEAK_GOAL, unit="MiB", note="per-rank peak RSS"))
    times = _launch(4, "--worker", "speed", "--mib", str(speed_mib),
                    "--repeats", str(10 if quick else 40))
    pooled = {k: [t for r in times for t in r[k]] for k in ("numpy", "spmd")}
    bench = f"elementwise[4 ranks x {speed_mib} MiB]"
    rows.append(row(bench, "numpy", pooled["numpy"], note="local * 2.0 on the block"))
    rows.append(row(bench, "spmd", pooled["spmd"], baseline="numpy", goal_ratio=SPEED_GOAL,
                    note="jit(shard_map(b * 2.0)) of a P('d') array"))
    return rows


if __name__ == "__main__":
    worker_main(sys.argv[1:])
