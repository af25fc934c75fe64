"""The per-call cost of the one placed-call path, against its floors (issue 24).

Run under MPI: ``.venv/bin/spmd-run -n 2 benchmarks/bench_call_path.py``.  On a mesh
``('d',)`` of all ranks, with ``x`` a float32 array of 4 KiB per rank placed
``P('d')``, it times the four calls users make on placed values, each against the
floor that does the same work by hand on this rank's block:

| call | floor |
| --- | --- |
| ``jit(shard_map(psum))(x)`` | ``comm.Allreduce`` on the block into a preallocated buffer |
| ``jit(lambda v: v * 2 + 1)(x)`` | ``block * 2 + 1`` in numpy |
| ``jit(f, in_shardings=s, out_shardings=s)(x)`` | the same numpy |
| eager ``x * 2 + 1`` (two eager operations) | the same numpy |

Timing: the variants are interleaved (all ranks together; each sample a loop of
calls preceded by a ``Barrier``); a sample is the slowest rank's time per call;
the ``added`` row of a call is, per round, that call minus its floor, and its
goal is the issue's.  The number of Python calls between the user's call and its
return (``sys.setprofile`` ``call`` events, steady state) is recorded beside each
call (``calls`` in the row's note, and ``python_calls`` in the results file).
Rank 0 prints the table and writes ``benchmarks/results/call_path_n<N>.json``.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402  (puts the repository root on sys.path)

# (name, floor name, goal: added seconds, goal: Python calls)
ROWS = [("jit(shard_map(psum))", "comm.Allreduce", 8e-6, 20),
        ("jit(v * 2 + 1)", "numpy on the block", 5e-6, 15),
        ("jit(in_shardings, out_shardings)", "numpy on the block", 5e-6, 15),
        ("eager x * 2 + 1", "numpy on the block", 30e-6, 40)]


def calls(n: int, nbytes: int = 4096) -> dict:
    """name -> (the call, its floor), on a mesh of ``n`` ranks."""
    import numpy as np
    from mpi4py import MPI

    import spmd
    from spmd import P, lax
    from spmd.sharding import NamedSharding

    comm = MPI.COMM_WORLD
    mesh = spmd.make_mesh((n,), ("d",))
    s = NamedSharding(mesh, P("d"))
    m = nbytes // 4
    x = spmd.device_put(np.arange(n * m, dtype=np.float32), s)
    block = np.asarray(x.addressable_shards[0].data)
    out = np.empty_like(block)
    psum = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "d"), mesh=mesh,
                                   in_specs=P("d"), out_specs=P()))
    affine = spmd.jit(lambda v: v * 2 + 1)
    placed = spmd.jit(lambda v: v * 2 + 1, in_shardings=s, out_shardings=s)
    numpy_floor = lambda: block * 2 + 1  # noqa: E731
    return {
        ROWS[0][0]: (lambda: psum(x), lambda: comm.Allreduce(block, out, op=MPI.SUM)),
        ROWS[1][0]: (lambda: affine(x), numpy_floor),
        ROWS[2][0]: (lambda: placed(x), numpy_floor),
        ROWS[3][0]: (lambda: x * 2 + 1, numpy_floor),
    }


def count_python_calls(fn) -> int:
    """Python function calls from ``fn``'s start to its return (``fn`` itself excluded)."""
    n = [0]

    def prof(frame, event, arg):
        if event == "call":
            n[0] += 1

    fn()  # steady state
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n[0] - 1  # the lambda around the call


def measure(rounds: int, number: int = 200) -> list[dict]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    variants = calls(n)
    counts = {name: comm.allreduce(count_python_calls(call), op=MPI.MAX)
              for name, (call, _) in variants.items()}
    times = {(name, which): [] for name in variants for which in ("call", "floor")}
    for name, (call, floor) in variants.items():
        for _ in range(20):
            call(), floor()
    for r in range(rounds):
        for name, (call, floor) in variants.items():
            pair = [("call", call), ("floor", floor)]
            for which, fn in (pair if r % 2 == 0 else pair[::-1]):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                times[(name, which)].append(
                    comm.allreduce((time.perf_counter() - t0) / number, op=MPI.MAX))
    rows = []
    for name, floor_name, goal_s, goal_calls in ROWS:
        call_t, floor_t = times[(name, "call")], times[(name, "floor")]
        rows.append(common.row(name, f"floor: {floor_name}", floor_t, unit="us"))
        rows.append(common.row(name, "spmd", call_t, unit="us",
                               note=f"{counts[name]} Python calls (goal <= {goal_calls})"))
        rows[-1]["python_calls"] = counts[name]
        rows.append(common.row(name, "added", [c - f for c, f in zip(call_t, floor_t)],
                               unit="us", goal_max_s=goal_s,
                               note="spmd minus the floor, per round"))
    return rows


def _counts(rows) -> str:
    calls = {r["benchmark"]: r["python_calls"] for r in rows if "python_calls" in r}
    return "\n".join(f"{name}: {calls[name]} Python calls (goal <= {goal})"
                     for name, _, _, goal in ROWS)


def skip_reason() -> str:
    """``benchmarks/run.py`` runs it not: it has a ``main`` of its own, on MPI ranks."""
    return common.mpi_only("call_path")


def main(argv=None) -> int:
    return common.mpi_main("call_path", __doc__, measure, argv, rounds=40, footer=_counts)


if __name__ == "__main__":
    sys.exit(main())
