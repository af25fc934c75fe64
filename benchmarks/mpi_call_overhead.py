"""Where the fixed cost of a small ``psum`` goes, layer by layer (a diagnostic).

Runs under MPI (``.venv/bin/mpiexec -n 2 .venv/bin/python
benchmarks/mpi_call_overhead.py [BYTES]``).  For a float32 operand of BYTES per
rank (default 4 KiB; from 16 KiB on one node the backend sums through shared
memory, :mod:`spmd.collectives.mpi.shm`, and the first row is no longer its
algorithm) it times, in hot loops (all ranks loop together; each call synchronises them), the
layers between a jitted ``shard_map`` psum and the raw mpi4py call:

1. ``comm.Allreduce`` on preallocated buffers (the floor);
2. ``spmd.collectives.mpi.allreduce`` (the backend function: dtype widening,
   the receive buffer, the per-collective bookkeeping of
   ``spmd.collectives.mpi.control.Collective``, the communicator cache);
3. the ``mpi`` equation as generated code calls it (``rules["bind_impl"]``: for an
   all-reduce, ``mpi.primitive._BoundAllreduce``, which after its first call of a shape makes
   MPI's call directly inside the collective's bookkeeping);
4. the compiled per-process program of the jitted psum, called on the global
   input (slicing this rank's block, reshapes, the ``mpi`` call);
5. the jitted call itself (``spmd.jit``: the call plan's key, the plan's reads of
   the leaves, the results' placement; ``spmd/shard/call/jit.py``, ``spmd/shard/call/plan.py``);
6. the same program through the compiler's own jit, which binds the ``jit``
   equation eagerly (the route of a jit equation met by the eager trace: the bind,
   the trace, the dispatch's lookup of the same plans).

It also times, on rank 0 alone and without communication (the fastest of 15
rounds), the parts of the backend function, and the layers above it with every
compiled program's ``mpi`` call swapped for a function returning its operand.  Each row is the median over rounds of the per-call time
of a loop (the slowest rank's), and the difference to the row above: what that
layer adds; and the same for the fastest round, which a loaded machine disturbs
less.  Rank 0 prints the table; nothing is saved (``bench_mpi.py``'s ``added
latency`` rows are the recorded numbers).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402,F401  (puts the repository root on sys.path)


def _per_call(fn, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def measure(nbytes: int = 4096, rounds: int = 30, number: int = 200) -> list[tuple[str, float]]:
    import numpy as np
    from mpi4py import MPI

    import spmd
    from spmd import P, lax
    from spmd.collectives import mpi

    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    m = nbytes // 4
    x = np.arange(n * m, dtype=np.float32)
    mine = np.ascontiguousarray(x[rank * m:(rank + 1) * m])
    out = np.empty_like(mine)
    ranks = tuple(range(n))
    mesh = spmd.make_mesh((n,), ("i",))
    from spmd.compiler.core.jit import jit as compiler_jit

    def psum_jit():
        return spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh,
                                       in_specs=P("i"), out_specs=P()))

    f = psum_jit()
    f(x)
    (plan,) = f._plans.values()
    exe = plan.plan.fn  # the compiled per-process program the call plan runs
    # The compiler's own jit binds the jit equation, which the shard layer's dispatch
    # evaluates (the route of a jit equation met eagerly): the same plans behind the
    # bind, the eager trace and the dispatch's lookup.
    g = compiler_jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                    out_specs=P()))
    g(x)
    op = mpi.mpi_p.rules.bind_impl(np, kind="allreduce", ranks=ranks, op="sum", what="psum")
    layers = [("raw comm.Allreduce", lambda: comm.Allreduce(mine, out, op=MPI.SUM)),
              ("mpi.allreduce (backend function)", lambda: mpi.allreduce(mine, ranks, "sum")),
              ("mpi equation as generated code calls it", lambda: op(mine)),
              ("compiled per-process program", lambda: exe(x)),
              ("jitted shard_map call (its call plan)", lambda: f(x)),
              ("jit equation bound eagerly (the dispatch)", lambda: g(x))]
    np.testing.assert_array_equal(np.asarray(f(x)), x.reshape(n, m).sum(0))
    samples = {name: [] for name, _ in layers}
    for _ in range(rounds):
        for name, fn in layers:
            comm.Barrier()
            samples[name].append(_per_call(fn, number))
    stats = {}
    for name, _ in layers:  # the slowest rank's median, and its fastest round
        stats[name] = (comm.allreduce(statistics.median(samples[name]), op=MPI.MAX),
                       comm.allreduce(min(samples[name]), op=MPI.MAX))
    # The parts of the backend function that need no communication, alone.
    from spmd.collectives.mpi.control import Collective

    def bookkeeping():  # what mpi_control adds around each MPI call (no MPI call here)
        with Collective(("part",), "psum"):
            pass

    parts = [("  part: Collective bookkeeping (threads, watchdog record)", bookkeeping),
             ("  part: communicator(ranks) (cached)", lambda: mpi.communicator(ranks)),
             ("  part: widen(x)", lambda: mpi.buffers.widen(mine)),
             ("  part: recv_buffer(shape, dtype)",
              lambda: mpi.buffers.recv_buffer(mine.shape, mine.dtype))]
    parts += _without_communication(f, g, exe, x)
    # The fastest of 15 rounds: with no communication, the load only adds time.
    part_rows = [(name, min(_per_call(fn, 2000) for _ in range(15))) for name, fn in parts]
    return [(name, stats[name]) for name, _ in layers], part_rows


def _without_communication(f, g, exe, x) -> list:
    """Rows timing the layers above the backend function on this rank alone: every
    compiled per-process program's ``mpi`` call is swapped for a function returning
    its operand (what a psum over one member gives), so no rank waits for another
    and the load of the machine disturbs the numbers less.  (A diagnostic only: the
    swap is undone by the caller never calling these programs again.)"""
    from spmd.shard.maps import stacked as execute

    for per in list(execute._plans.values()):
        for plan in per.values():
            names = plan.exe.fn.__globals__
            for key in [k for k in names if k.startswith("_mpi_")]:
                names[key] = _identity
    return [("  part: compiled per-process program, mpi call swapped out", lambda: exe(x)),
            ("  part: jitted call, its plan, mpi call swapped out", lambda: f(x)),
            ("  part: jit equation bound eagerly, mpi call swapped out", lambda: g(x))]


def _identity(v):
    return v


def main() -> int:
    from mpi4py import MPI

    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    rows, parts = measure(nbytes)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"psum of {nbytes // 1024} KiB per rank, {MPI.COMM_WORLD.Get_size()} ranks, hot loops "
              f"({common.now_iso()}, load {common.LOAD_AT_START})\n")
        print("| layer | per call (median) | added by this layer | fastest round | added |\n"
              "| --- | --- | --- | --- | --- |")
        prev = None
        for name, (t, fast) in rows:
            added = "-" if prev is None else f"{(t - prev[0]) * 1e6:+.1f} µs"
            added_fast = "-" if prev is None else f"{(fast - prev[1]) * 1e6:+.1f} µs"
            print(f"| {name} | {t * 1e6:.1f} µs | {added} | {fast * 1e6:.1f} µs | {added_fast} |")
            prev = (t, fast)
        for name, t in parts:
            print(f"| {name} | {t * 1e6:.2f} µs | (no communication) | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
