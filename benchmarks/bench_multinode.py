"""Collectives across nodes: spmd's hierarchical ``psum`` against raw mpi4py.

Run as root (it makes emulated nodes: :mod:`spmd.testing.emulated_nodes`)::

    .venv/bin/python benchmarks/bench_multinode.py [--rounds-scale F] [--sizes KIB,...]

It launches itself with plain ``mpiexec`` on 2 emulated nodes x 2 ranks (each node
its own host name and ``/dev/shm``, MPI between nodes over the loopback) and, on
those ranks, a 1-D mesh ``('i',)`` of the 4 ranks, measures float32 operands of
64 KiB to 32 MiB per rank:

- ``psum[<size>]``: a jitted ``shard_map`` ``lax.psum`` (as users write it), which
  goes through the nodes' hierarchy from ``SPMD_MPI_HIER_MIN_BYTES``
  (:mod:`spmd.collectives.mpi.hier`), against raw mpi4py ``Allreduce`` on
  preallocated buffers (the floor; goal: ratio <= 0.8 from 256 KiB); diagnostic:
  the same psum with the hierarchy off (``spmd flat``, a second jitted function
  called with the threshold raised);
- ``psum_scatter[<size>]`` and ``all_gather[<size>]`` (tiled), against raw
  ``Reduce_scatter_block`` and ``Allgather``.

Timing is bench_mpi.py's: the variants interleaved (the order rotating each round),
each sample one call after a ``Barrier``, the slowest rank's time, medians.  Rank 0
writes ``benchmarks/results/multinode_n4.json``.  The machine's cores are shared by
all 4 ranks of both nodes (on a 2-core machine they oversubscribe it): the numbers
compare algorithms on one machine, not a real network.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import row  # noqa: E402  (puts the repo root on sys.path too)

KIB, MIB = 1024, 1024 * 1024
SIZES = (64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 32 * MIB)
REPEATS = {16 * KIB: 200, 32 * KIB: 200, 64 * KIB: 150, 128 * KIB: 120, 256 * KIB: 100,
           1 * MIB: 60, 4 * MIB: 30, 32 * MIB: 10}
PSUM_GOAL, GOAL_FROM = 0.8, 256 * KIB
MOVE_SIZES = (256 * KIB, 4 * MIB)  # psum_scatter and all_gather
NODES, PER_NODE = 2, 2


def skip_reason() -> str | None:
    """Why ``benchmarks/run.py`` cannot run this in its process (always: it launches
    its own job on emulated nodes)."""
    return "launches its own job on emulated nodes: python benchmarks/bench_multinode.py (root)"


def _label(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


# ------------------------------------------------------------ on the ranks

class _Flat:
    """Calls with the hierarchy off: the threshold raised around each call."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        from spmd.collectives.mpi import hier as mpi_hier

        old = os.environ.get("SPMD_MPI_HIER_MIN_BYTES")
        os.environ["SPMD_MPI_HIER_MIN_BYTES"] = "0"
        mpi_hier.min_bytes.cache_clear()
        try:
            return self.fn(*args)
        finally:
            if old is None:
                del os.environ["SPMD_MPI_HIER_MIN_BYTES"]
            else:
                os.environ["SPMD_MPI_HIER_MIN_BYTES"] = old
            mpi_hier.min_bytes.cache_clear()


def _psum_rows(mesh, comm, nbytes: int, repeats: int) -> list[dict]:
    import numpy as np
    from mpi4py import MPI

    import spmd
    from bench_mpi import interleave_mpi
    from spmd import P, lax

    n, rank = comm.Get_size(), comm.Get_rank()
    m = nbytes // 4
    x = np.random.default_rng(nbytes).standard_normal(n * m).astype(np.float32)
    mine = x[rank * m:(rank + 1) * m]  # the floor reads spmd's own input block
    out = np.empty(m, np.float32)
    smap = functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"), out_specs=P())
    f = spmd.jit(smap(lambda b: lax.psum(b, "i")))
    flat = _Flat(spmd.jit(smap(lambda b: lax.psum(b, "i"))))
    comm.Allreduce(mine, out, op=MPI.SUM)
    for g in (f, flat):  # the same numbers first: timing a wrong result is worthless
        np.testing.assert_allclose(np.asarray(g(x)), out, rtol=1e-5, atol=1e-5 * n)
    times = interleave_mpi(comm, {"mpi4py Allreduce": lambda: comm.Allreduce(mine, out,
                                                                              op=MPI.SUM),
                                  "spmd": lambda: f(x), "spmd flat": lambda: flat(x)},
                           repeats)
    name, unit = f"psum[{_label(nbytes)}]", "us" if nbytes <= 256 * KIB else "ms"
    return [row(name, "mpi4py Allreduce", times["mpi4py Allreduce"], unit=unit,
                note="the floor: raw Allreduce on the same block"),
            row(name, "spmd", times["spmd"], baseline="mpi4py Allreduce", unit=unit,
                goal_ratio=PSUM_GOAL if nbytes >= GOAL_FROM else None,
                note="jitted shard_map psum (hierarchical from SPMD_MPI_HIER_MIN_BYTES)"),
            row(name, "spmd flat", times["spmd flat"], baseline="mpi4py Allreduce", unit=unit,
                note="diagnostic: the same psum with the hierarchy off")]


def _move_rows(mesh, comm, nbytes: int, repeats: int) -> list[dict]:
    import numpy as np
    from mpi4py import MPI

    import spmd
    from bench_mpi import interleave_mpi
    from spmd import P, lax

    n, rank = comm.Get_size(), comm.Get_rank()
    m = nbytes // 4
    x = np.random.default_rng(nbytes + 1).standard_normal(n * m).astype(np.float32)
    mine = x[rank * m:(rank + 1) * m]
    smap = functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"))
    h = spmd.jit(smap(lambda b: lax.psum_scatter(b, "i", tiled=True), out_specs=P("i")))
    g = spmd.jit(smap(lambda b: lax.all_gather(b, "i", tiled=True), out_specs=P(),
                      check_vma=False))
    part, gathered = np.empty(m // n, np.float32), np.empty(n * m, np.float32)
    comm.Reduce_scatter_block(mine, part, op=MPI.SUM)
    comm.Allgather(mine, gathered)
    np.testing.assert_allclose(np.asarray(h(x).addressable_data(0)), part, rtol=1e-5,
                               atol=1e-5 * n)
    np.testing.assert_array_equal(np.asarray(g(x)), gathered)
    times = interleave_mpi(comm, {
        "rs mpi4py": lambda: comm.Reduce_scatter_block(mine, part, op=MPI.SUM),
        "rs spmd": lambda: h(x), "ag mpi4py": lambda: comm.Allgather(mine, gathered),
        "ag spmd": lambda: g(x)}, repeats)
    unit = "us" if nbytes <= 256 * KIB else "ms"
    rows = []
    for kind, short, floor in (("psum_scatter", "rs", "Reduce_scatter_block"),
                               ("all_gather", "ag", "Allgather")):
        name = f"{kind}[{_label(nbytes)}]"
        rows += [row(name, f"mpi4py {floor}", times[f"{short} mpi4py"], unit=unit,
                     note=f"the floor: raw {floor}"),
                 row(name, "spmd", times[f"{short} spmd"], baseline=f"mpi4py {floor}",
                     unit=unit, note="jitted shard_map (hierarchical)")]
    return rows


def measure(sizes, scale: float) -> list[dict]:
    """Every rank: the rows (the same on every rank; rank 0's are saved)."""
    from mpi4py import MPI

    import spmd
    from spmd.collectives.mpi import hier as mpi_hier

    comm = MPI.COMM_WORLD
    mesh = spmd.make_mesh((comm.Get_size(),), ("i",))
    rows = []
    for nbytes in sizes:
        rows += _psum_rows(mesh, comm, nbytes, max(6, int(REPEATS.get(nbytes, 50) * scale)))
    for nbytes in MOVE_SIZES:
        rows += _move_rows(mesh, comm, nbytes, max(6, int(REPEATS.get(nbytes, 50) * scale)))
    plan = mpi_hier.plan_of(tuple(range(comm.Get_size())))
    if plan is None:
        raise RuntimeError("bench_multinode: the hierarchical path was not taken "
                           "(the ranks are not on several nodes of equal size)")
    return rows


def on_ranks(args) -> int:
    import common
    import run as runner
    from mpi4py import MPI

    common.provenance()
    t0 = time.perf_counter()
    rows = measure(args.sizes, args.rounds_scale)
    seconds = time.perf_counter() - t0
    if MPI.COMM_WORLD.Get_rank() == 0:
        rows = common.summarize(rows)
        info = common.machine_info()
        name = f"multinode_n{MPI.COMM_WORLD.Get_size()}"
        print(f"## {name}: {NODES} emulated nodes x {PER_NODE} ranks, {common.now_iso()}, "
              f"{info['cpu']}, {info['usable_cores']} usable cores, load before "
              f"{os.environ.get('SPMD_BENCH_LOAD_BEFORE')} ({seconds:.1f} s)\n", flush=True)
        print(common.table(rows), flush=True)
        if args.save:
            path = runner.save(name, rows, False, seconds, os.path.join(HERE, "results"))
            print(f"\nsaved {os.path.relpath(path)}")
            runner.regenerate_tables()
    return 0


# ------------------------------------------------------------ the launch

def launch(argv: list[str]) -> int:
    """Make the emulated nodes and run this script on them under plain mpiexec."""
    from spmd.testing.emulated_nodes import EmulatedNodes, unavailable

    reason = unavailable()
    if reason:
        print(f"bench_multinode: skipped: {reason}")
        return 0
    exe = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory(prefix="spmd-bench-nodes-") as root:
        nodes = EmulatedNodes(root, NODES)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
        env.update(nodes.env(), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1", SPMD_BENCH_LOAD_BEFORE=open("/proc/loadavg").read()
                   .split()[0] if os.path.exists("/proc/loadavg") else "?")
        cmd = [exe, *nodes.mpiexec_args(PER_NODE), "-n", str(NODES * PER_NODE),
               sys.executable, os.path.abspath(__file__), "--on-ranks", *argv]
        try:
            return subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL).returncode
        finally:
            for k in range(NODES):
                nodes.kill_node(k)
            left = {k: sorted(os.listdir(nodes.shm_dir(k))) for k in range(NODES)}
            if any(left.values()):
                print(f"bench_multinode: left in the nodes' /dev/shm: {left}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--on-ranks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds-scale", type=float, default=1.0,
                    help="multiply every size's rounds (0.25: a smoke run)")
    ap.add_argument("--sizes", default=None, metavar="KIB,...",
                    help="psum sizes in KiB (default 64,256,1024,4096,32768); a run "
                         "with other sizes or rounds is not saved")
    args = ap.parse_args(argv)
    args.save = args.sizes is None and args.rounds_scale == 1.0
    args.sizes = SIZES if args.sizes is None else \
        tuple(int(v) * KIB for v in args.sizes.split(","))
    if not args.on_ranks:
        return launch([a for a in argv])
    return on_ranks(args)


if __name__ == "__main__":
    sys.exit(main())
