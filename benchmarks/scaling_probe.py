"""The cost of the weak-scaling step's gradient reduction alone, on N ranks.

    spmd-run -n 12 benchmarks/scaling_probe.py --bytes 3247104 --out probe.json

Run by ``bench_scaling.py --probe`` for each rank count: a jitted ``shard_map``
``psum`` of the transformer's gradient (``--bytes`` float32 bytes per rank: all
its parameters), against raw mpi4py ``Allreduce`` of the same buffer, the two
interleaved; each call starts after a ``Barrier``, so no rank waits for
another's compute and the time is the transfer alone; a sample is the slowest
rank's time.  Rank 0 writes the medians to ``--out``.
"""

import argparse
import functools
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

import spmd
from spmd import P, lax


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n, count = comm.Get_size(), args.bytes // 4
    mesh = spmd.make_mesh((n,), ("i",))
    psum = spmd.jit(functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"),
                                      out_specs=P())(lambda x: lax.psum(x, "i")))
    x = spmd.device_put(np.ones(count * n, np.float32), spmd.NamedSharding(mesh, P("i")))
    buf, out = np.ones(count, np.float32), np.empty(count, np.float32)
    variants = {"spmd psum": lambda: psum(x).block_until_ready(),
                "mpi4py Allreduce": lambda: comm.Allreduce(buf, out)}
    times = {k: [] for k in variants}
    for _ in range(3):
        for f in variants.values():
            f()
    for _ in range(args.rounds):
        for name, f in variants.items():
            comm.Barrier()
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    slowest = {k: np.max(comm.allgather(v), axis=0).tolist() for k, v in times.items()}
    if comm.Get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": n, "bytes": args.bytes,
                       "median_s": {k: statistics.median(v) for k, v in slowest.items()}}, f)


if __name__ == "__main__":
    main()
