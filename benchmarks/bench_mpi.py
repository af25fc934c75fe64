"""Collectives and a data-parallel training step over MPI, against raw mpi4py.

Runs only under an MPI launcher, one device per rank::

    make bench-mpi                                   # -n 2, then -n 4
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/bench_mpi.py [--quick]

``python benchmarks/run.py`` skips it with a line saying so when it is not
launched by MPI.  Measured, on a 1-D mesh ``('i',)`` of all the ranks:

- ``<collective>[<size>]``: ``psum``, ``all_gather``, ``psum_scatter`` and
  ``all_to_all`` (``tiled=True``) of a float32 operand of ``<size>`` bytes per
  rank (4 KiB to 32 MiB), each a jitted ``shard_map``, against the mpi4py
  buffer call that does the same communication (``Allreduce``, ``Allgather``,
  ``Reduce_scatter_block``, ``Alltoall``) on preallocated buffers: the floor.
  Rows: ``mpi4py``, ``spmd`` (goal: ratio <= 1.10 from 256 KiB up) and
  ``added latency`` (spmd minus mpi4py, per round; goal at 4 KiB: <= 30 µs).
- ``dp_mlp_step[batch=256/rank]``: one SGD step of a 784-512-512-10 tanh MLP
  with softmax cross-entropy: ``spmd.jit`` of ``value_and_grad`` of a
  ``shard_map``'ed loss (``lax.pmean`` over the ranks) against the same step
  written by hand in numpy with one in-place ``Allreduce`` per gradient and one
  for the loss (goal: ratio <= 1.15).

Timing: the variants are interleaved (the order rotates each round); every
timed call is one call preceded by a ``Barrier``, so all ranks start it
together; a sample is the slowest rank's time for that call (the times are
gathered once at the end, not during the measurement); medians over many
rounds.  Rank 0 prints the table and writes ``benchmarks/results/mpi_n<N>.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time



def _limit_blas_threads() -> None:
    """One BLAS share of the cores per rank, set before numpy loads OpenBLAS: otherwise
    every rank starts a spinning thread per core and both variants crawl."""
    ranks = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") \
        or os.environ.get("PMI_SIZE")
    if ranks and ranks.isdigit() and int(ranks) > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(max(1, cores // int(ranks))))


if __name__ == "__main__":
    _limit_blas_threads()

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import clock, row  # noqa: E402  (puts the repo root on sys.path too)

KIB = 1024
MIB = 1024 * KIB
SIZES = (4 * KIB, 32 * KIB, 256 * KIB, 2 * MIB, 32 * MIB)
# Rounds per size (each round times one call of every variant); --quick divides by 4.
REPEATS = {4 * KIB: 400, 32 * KIB: 300, 256 * KIB: 150, 2 * MIB: 60, 32 * MIB: 16}
RATIO_GOAL, RATIO_FROM = 1.10, 256 * KIB
LATENCY_GOAL_S, LATENCY_AT = 30e-6, 4 * KIB
MLP_SIZES = (784, 512, 512, 10)
MLP_BATCH = 256  # per rank
MLP_GOAL = 1.15
MLP_LR = 0.01


def skip_reason() -> str | None:
    """Why this benchmark cannot run in this process (None when it can)."""
    from spmd.launch.runtime import launched_by_mpi

    if not launched_by_mpi():
        return ("runs only under an MPI launcher with 2 or more ranks: `make bench-mpi` "
                "(= .venv/bin/mpiexec -n 2|4 .venv/bin/python benchmarks/bench_mpi.py)")
    return None


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def size_label(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


# ----------------------------------------------------------------- timing

def interleave_mpi(comm, variants: dict, repeats: int, warmup: int = 3) -> dict:
    """``{name: [seconds, ...]}``: each sample is one call after a Barrier, timed on
    every rank; the slowest rank's time is the sample.  Same order on every rank."""
    import gc

    import numpy as np

    names = list(variants)
    for name in names:
        for _ in range(warmup):
            comm.Barrier()
            variants[name]()
    local = {n: np.empty(repeats) for n in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                fn = variants[name]
                comm.Barrier()
                t0 = clock()
                fn()
                local[name][r] = clock() - t0
    finally:
        gc.enable()
    out = {}
    for name in names:
        every = np.empty((comm.Get_size(), repeats))
        comm.Allgather(local[name], every)
        out[name] = every.max(axis=0).tolist()
    return out


# ------------------------------------------------------------ collectives

def _collective_cases(mesh, n: int, rank: int, nbytes: int, rng):
    """``{kind: (spmd_call, raw_call, check)}`` for an operand of ``nbytes`` per rank."""
    import numpy as np
    from mpi4py import MPI

    import spmd
    from spmd import P, lax

    comm = _world()
    m = nbytes // 4
    x = rng.standard_normal(n * m).astype(np.float32)  # global: the same on every rank
    mine = np.ascontiguousarray(x[rank * m:(rank + 1) * m])
    smap = functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"))
    cases = {}

    f = spmd.jit(smap(lambda b: lax.psum(b, "i"), out_specs=P()))
    out = np.empty(m, np.float32)
    cases["psum"] = (lambda: f(x), lambda: comm.Allreduce(mine, out, op=MPI.SUM),
                     lambda: (np.asarray(f(x)), out))

    # all_gather's result is typed as varying (as in JAX): P() needs check_vma=False.
    g = spmd.jit(smap(lambda b: lax.all_gather(b, "i", tiled=True), out_specs=P(),
                      check_vma=False))
    gathered = np.empty(n * m, np.float32)
    cases["all_gather"] = (lambda: g(x), lambda: comm.Allgather(mine, gathered),
                           lambda: (np.asarray(g(x)), gathered))

    h = spmd.jit(smap(lambda b: lax.psum_scatter(b, "i", tiled=True), out_specs=P("i")))
    part = np.empty(m // n, np.float32)

    def rs_check():
        full = h(x)._value  # this rank's block of the global result
        return full[rank * (m // n):(rank + 1) * (m // n)], part

    cases["psum_scatter"] = (lambda: h(x),
                             lambda: comm.Reduce_scatter_block(mine, part, op=MPI.SUM), rs_check)

    a = spmd.jit(smap(lambda b: lax.all_to_all(b, "i", 0, 0, tiled=True), out_specs=P("i")))
    swapped = np.empty(m, np.float32)

    def a2a_check():
        return a(x)._value[rank * m:(rank + 1) * m], swapped

    cases["all_to_all"] = (lambda: a(x), lambda: comm.Alltoall(mine, swapped), a2a_check)
    return cases


def bench_collectives(mesh, quick: bool, sizes=SIZES, kinds=None) -> list[dict]:
    import numpy as np

    comm = _world()
    n, rank = comm.Get_size(), comm.Get_rank()
    rows = []
    for nbytes in sizes:
        rng = np.random.default_rng(nbytes)
        cases = _collective_cases(mesh, n, rank, nbytes, rng)
        repeats = max(8, REPEATS.get(nbytes, 50) // (4 if quick else 1))
        unit = "us" if nbytes <= 256 * KIB else "ms"
        for kind, (spmd_call, raw_call, check) in cases.items():
            if kinds and kind not in kinds:
                continue
            raw_call()
            got, want = check()  # same numbers first: timing a wrong result is worthless
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * n)
            times = interleave_mpi(comm, {"mpi4py": raw_call, "spmd": spmd_call}, repeats)
            name = f"{kind}[{size_label(nbytes)}]"
            added = [s - r for s, r in zip(times["spmd"], times["mpi4py"])]
            rows += [
                row(name, "mpi4py", times["mpi4py"], unit=unit),
                row(name, "spmd", times["spmd"], baseline="mpi4py", unit=unit,
                    goal_ratio=RATIO_GOAL if nbytes >= RATIO_FROM else None),
                row(name, "added latency", added, unit="us",
                    goal_max_s=LATENCY_GOAL_S if nbytes == LATENCY_AT else None,
                    note="spmd minus mpi4py, per round"),
            ]
        del cases
    return rows


# -------------------------------------------------------------- MLP step

def make_params(seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
             (0.1 * rng.standard_normal(b)).astype(np.float32))
            for a, b in zip(MLP_SIZES[:-1], MLP_SIZES[1:])]


def make_spmd_step(mesh):
    import spmd
    import spmd.numpy as snp
    from spmd import P, lax

    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                       out_specs=P())
    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = snp.tanh(h @ w + b)
        w, b = params[-1]
        log_p = spmd.nn.log_softmax(h @ w + b)
        return lax.pmean(-snp.mean(snp.sum(y * log_p, axis=-1)), "i")

    @spmd.jit
    def step(params, x, y):
        value, grads = spmd.value_and_grad(loss)(params, x, y)
        return [(w - MLP_LR * gw, b - MLP_LR * gb)
                for (w, b), (gw, gb) in zip(params, grads)], value

    return step


class NumpyStep:
    """The same step by hand: numpy forward and backward, one in-place Allreduce
    per gradient (and one for the loss), the update in place."""

    def __init__(self, params, comm):
        import numpy as np

        self.params = [(w.copy(), b.copy()) for w, b in params]
        self.comm, self.n = comm, comm.Get_size()
        self.loss = np.zeros(1, np.float64)

    def __call__(self, x, y):
        import numpy as np
        from mpi4py import MPI

        (w1, b1), (w2, b2), (w3, b3) = self.params
        h1 = np.tanh(x @ w1 + b1)
        h2 = np.tanh(h1 @ w2 + b2)
        z = h2 @ w3 + b3
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        rows = x.shape[0]
        self.loss[0] = -np.sum(y * (z - np.log(s))) / rows
        dz = (e / s - y) / rows
        dh2 = (dz @ w3.T) * (1 - h2 * h2)
        dh1 = (dh2 @ w2.T) * (1 - h1 * h1)
        grads = [h2.T @ dz, dz.sum(axis=0), h1.T @ dh2, dh2.sum(axis=0),
                 x.T @ dh1, dh1.sum(axis=0)]
        for g in grads:
            self.comm.Allreduce(MPI.IN_PLACE, g, op=MPI.SUM)
        self.comm.Allreduce(MPI.IN_PLACE, self.loss, op=MPI.SUM)
        scale = np.float32(MLP_LR / self.n)
        for p, g in zip((w3, b3, w2, b2, w1, b1), grads):
            p -= scale * g
        return self.loss[0] / self.n


def bench_mlp_step(mesh, quick: bool) -> list[dict]:
    import numpy as np

    comm = _world()
    n, rank = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n * MLP_BATCH, MLP_SIZES[0])).astype(np.float32)
    y = np.eye(MLP_SIZES[-1], dtype=np.float32)[rng.integers(0, MLP_SIZES[-1], n * MLP_BATCH)]
    x_mine = np.ascontiguousarray(x[rank * MLP_BATCH:(rank + 1) * MLP_BATCH])
    y_mine = np.ascontiguousarray(y[rank * MLP_BATCH:(rank + 1) * MLP_BATCH])
    params = make_params()
    step = make_spmd_step(mesh)
    hand = NumpyStep(params, comm)
    # Same numbers first: one step of each from the same parameters.
    new, value = step(params, x, y)
    want = hand(x_mine, y_mine)
    np.testing.assert_allclose(float(value), want, rtol=1e-4)
    for (w, b), (hw, hb) in zip(new, hand.params):
        np.testing.assert_allclose(np.asarray(w), hw, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(b), hb, rtol=1e-4, atol=1e-6)
    state = {"params": new}

    def spmd_step():
        state["params"], _ = step(state["params"], x, y)

    times = interleave_mpi(comm, {"numpy+mpi4py": lambda: hand(x_mine, y_mine),
                                  "spmd": spmd_step}, repeats=12 if quick else 40)
    name = f"dp_mlp_step[batch={MLP_BATCH}/rank]"
    return [row(name, "numpy+mpi4py", times["numpy+mpi4py"]),
            row(name, "spmd", times["spmd"], baseline="numpy+mpi4py", goal_ratio=MLP_GOAL)]


# ------------------------------------------------------------------ entry

def run(quick: bool = False, sizes=SIZES, kinds=None, mlp: bool = True) -> list[dict]:
    import spmd

    reason = skip_reason()
    if reason:
        raise RuntimeError(f"bench_mpi: {reason}")
    if spmd.local_device_count() != 1:
        raise RuntimeError("bench_mpi: needs one device per rank (SPMD_LOCAL_DEVICES=1)")
    mesh = spmd.make_mesh((spmd.device_count(),), ("i",))
    rows = bench_collectives(mesh, quick, sizes, kinds) if sizes else []
    return rows + (bench_mlp_step(mesh, quick) if mlp else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--no-save", action="store_true", help="print only")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--sizes", default=None, metavar="KIB,...",
                    help="operand sizes in KiB (default: 4,32,256,2048,32768; 0: none)")
    ap.add_argument("--kinds", default=None, metavar="NAME,...",
                    help="only these collectives (psum,all_gather,psum_scatter,all_to_all)")
    ap.add_argument("--no-mlp", action="store_true", help="skip the MLP step")
    args = ap.parse_args(argv)
    sizes = SIZES if args.sizes is None else \
        tuple(int(v) * KIB for v in args.sizes.split(",") if int(v) > 0)
    kinds = set(args.kinds.split(",")) if args.kinds else None
    partial = args.sizes is not None or kinds is not None or args.no_mlp
    reason = skip_reason()
    if reason:
        print(f"bench_mpi: skipped: {reason}")
        return 0
    import common
    import run as runner

    comm = _world()
    t0 = time.perf_counter()
    rows = run(quick=args.quick, sizes=sizes, kinds=kinds, mlp=not args.no_mlp)
    seconds = time.perf_counter() - t0
    if comm.Get_rank() == 0:
        rows = common.summarize(rows)
        info = common.machine_info()
        name = f"mpi_n{comm.Get_size()}"
        print(f"## {name}: {comm.Get_size()} ranks, {common.now_iso()}, {info['cpu']}, "
              f"{info['usable_cores']} usable cores, numpy {info['numpy']} "
              f"({seconds:.1f} s){'  (quick)' if args.quick else ''}\n")
        print(common.table(rows), flush=True)
        if not args.no_save and not partial:  # a partial run never replaces the results
            path = runner.save(name, rows, args.quick, seconds, args.out)
            print(f"\nsaved {os.path.relpath(path)}")
        missed = [f"{r['benchmark']} / {r['variant']}" for r in rows if r["passed"] is False]
        if missed:
            print("\ngoals missed:\n  " + "\n  ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
