"""Does an all-reduce progress while Python computes?  (A diagnostic for overlap.)

Overlapping a gradient bucket's all-reduce with the rest of the backward pass
(issue 12, item 3) needs the communication to move while the rank is busy in
numpy.  This script measures, on the MPI library at hand (PyPI's ``mpich``
wheel here), three ways of running an all-reduce of ``--mib`` MiB next to
``--compute-ms`` of numpy matrix products:

- ``serial``: compute, then ``Allreduce`` (what a program without overlap does);
- ``Iallreduce``: start a nonblocking all-reduce, compute, then ``Wait``; MPICH
  without an asynchronous progress thread advances it only inside MPI calls, so
  the wait may still carry most of the transfer;
- ``Iallreduce + Test``: the same, calling ``Test`` between the products (a
  program could place such calls between equations);
- ``thread``: a Python thread runs the blocking ``Allreduce`` while the main
  thread computes (numpy releases the GIL inside BLAS).

Each variant's median step time is printed with the time spent in the final
wait, and the overlap achieved: ``(serial - variant) / min(compute, comm)``
(1 = full overlap, 0 = none).  Run::

    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/mpi_overlap_probe.py

Nothing is saved; the numbers only decide which mechanism to build.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time


def main(argv=None) -> int:
    import numpy as np
    from mpi4py import MPI

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=4.0, help="all-reduce size per rank")
    ap.add_argument("--compute-ms", type=float, default=20.0, help="numpy work to overlap")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    buf = np.ones(int(args.mib * 2**20 / 4), np.float32)
    out = np.empty_like(buf)
    a = np.random.default_rng(rank).standard_normal((256, 256)).astype(np.float32)

    def product():
        return a @ a

    # How many products make the compute time asked for (calibrated once, on rank 0).
    t0 = time.perf_counter()
    for _ in range(20):
        product()
    per = (time.perf_counter() - t0) / 20
    reps = comm.bcast(max(1, round(args.compute_ms / 1e3 / per)) if rank == 0 else None)

    def compute(test=None):
        for _ in range(reps):
            product()
            if test is not None:
                test()

    def serial():
        compute()
        comm.Allreduce(buf, out)
        return 0.0

    def nonblocking(test: bool):
        req = comm.Iallreduce(buf, out)
        compute(req.Test if test else None)
        w = time.perf_counter()
        req.Wait()
        return time.perf_counter() - w

    def threaded():
        th = threading.Thread(target=comm.Allreduce, args=(buf, out))
        th.start()
        compute()
        w = time.perf_counter()
        th.join()
        return time.perf_counter() - w

    def comm_only():
        comm.Allreduce(buf, out)
        return 0.0

    def compute_only():
        compute()
        return 0.0

    variants = {"compute only": compute_only, "all-reduce only": comm_only, "serial": serial,
                "Iallreduce": lambda: nonblocking(False),
                "Iallreduce + Test": lambda: nonblocking(True)}
    if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
        variants["thread"] = threaded
    times = {k: [] for k in variants}
    waits = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            comm.Barrier()
            t = time.perf_counter()
            waits[name].append(fn())
            times[name].append(time.perf_counter() - t)
    med = {k: comm.allreduce(statistics.median(v), op=MPI.MAX) for k, v in times.items()}
    wait = {k: comm.allreduce(statistics.median(v), op=MPI.MAX) for k, v in waits.items()}
    if rank == 0:
        base = min(med["compute only"], med["all-reduce only"])
        print(f"{comm.Get_size()} ranks, {args.mib:g} MiB all-reduce, {reps} products "
              f"(~{args.compute_ms:g} ms), thread level {MPI.Query_thread()} "
              f"(MULTIPLE = {MPI.THREAD_MULTIPLE}), {MPI.Get_library_version().splitlines()[0]}\n")
        print("| variant | median | final wait | overlap |\n| --- | --- | --- | --- |")
        for name in variants:
            overlap = (med["serial"] - med[name]) / base if name not in (
                "compute only", "all-reduce only") and base > 0 else None
            print(f"| {name} | {med[name] * 1e3:.2f} ms | {wait[name] * 1e3:.2f} ms | "
                  f"{'-' if overlap is None else f'{overlap:.2f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
