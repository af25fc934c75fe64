"""What the checking mode (``SPMD_CHECK_COLLECTIVES=1``) costs per call, on MPI ranks.

Run under MPI: ``.venv/bin/spmd-run -n 2 benchmarks/bench_check_collectives.py``
(or 4 ranks).  The checking mode compares every collective across its ranks
before its data moves: one small ``Allgather`` of a 32-byte record on the control
communicator (:func:`spmd.collectives.mpi.control._check_call`).  This times, on
the same ranks and interleaved round by round (the mode is switched on and off
together on every rank between samples), the programs users write:

- a jitted ``shard_map`` psum of 4 KiB and of 1 MiB per rank (one collective a call);
- the data-parallel MLP step of ``dp_step.py`` (``grad inside``: one gradient
  all-reduce per parameter, combined into buckets by the compiler).

Each row is the slowest rank's time per call; the ratio is against the same call
unchecked.  Rank 0 prints the table and writes
``benchmarks/results/check_collectives_n<N>.json``.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402  (puts the repository root on sys.path)


def _variants(n: int) -> dict:
    """name -> (the call, how many calls a sample takes)."""
    import numpy as np

    import spmd
    from spmd import P, lax

    import dp_step

    mesh = spmd.make_mesh((n,), ("i",))

    def total(b):
        return lax.psum(b, "i")

    psum = spmd.jit(spmd.shard_map(total, mesh=mesh, in_specs=P("i"), out_specs=P()))
    small = np.ones(n * 1024, np.float32)
    large = np.ones(n * 256 * 1024, np.float32)
    steps = dp_step.make_steps(mesh, "i")
    step = steps["grad inside"]
    params = dp_step.make_params()
    x, y = dp_step.make_batch(64 * n)
    return {"jitted psum, 4 KiB per rank": (lambda: psum(small), 400),
            "jitted psum, 1 MiB per rank": (lambda: psum(large), 40),
            "data-parallel MLP step (grad inside)": (lambda: step(params, x, y), 4)}


def measure(rounds: int) -> list[dict]:
    from mpi4py import MPI

    from spmd.collectives.mpi import control as mpi_control

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    variants = _variants(n)
    mpi_control.checking()  # read the setting once: it is switched below
    times: dict = {(name, mode): [] for name in variants for mode in ("unchecked", "checked")}
    for name, (fn, _) in variants.items():
        for mode in (False, True):
            mpi_control._check[0] = mode
            fn(), fn()  # warm (compiled, communicators made)
    for r in range(rounds):
        for name, (fn, number) in variants.items():
            order = (False, True) if r % 2 == 0 else (True, False)
            for mode in order:
                mpi_control._check[0] = mode
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                per_call = comm.allreduce((time.perf_counter() - t0) / number, op=MPI.MAX)
                times[(name, "checked" if mode else "unchecked")].append(per_call)
    mpi_control._check[0] = None
    rows = []
    for name in variants:
        unit = "us" if "psum" in name else "ms"
        rows.append(common.row(name, "unchecked", times[(name, "unchecked")], unit=unit))
        rows.append(common.row(name, "checked", times[(name, "checked")], unit=unit,
                               baseline="unchecked",
                               note="SPMD_CHECK_COLLECTIVES=1: one control Allgather per "
                                    "collective"))
    return rows


def skip_reason() -> str:
    """``benchmarks/run.py`` runs it not: it has a ``main`` of its own, on MPI ranks."""
    return common.mpi_only("check_collectives")


def main(argv=None) -> int:
    return common.mpi_main("check_collectives", __doc__, measure, argv, rounds=30)


if __name__ == "__main__":
    sys.exit(main())
