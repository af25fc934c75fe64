"""Collectives and a data-parallel training step over MPI, against raw mpi4py.

Runs only under an MPI launcher, one device per rank::

    make bench-mpi                                   # -n 2, then -n 4
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/bench_mpi.py [--quick]

``python benchmarks/run.py`` skips it with a line saying so when it is not
launched by MPI.  Measured, on a 1-D mesh ``('i',)`` of all the ranks:

- ``<collective>[<size>]``: ``psum``, ``all_gather``, ``psum_scatter``,
  ``all_to_all`` (``tiled=True``) and ``ppermute`` (a ring shift) of a float32
  operand of ``<size>`` bytes per rank (4 KiB to 32 MiB), each a jitted
  ``shard_map``, against the mpi4py buffer call that does the same communication
  (``Allreduce``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall``,
  ``Sendrecv``) on preallocated buffers: the floor.
  The floors read this rank's block of the same global input as spmd (a view).
  Rows: ``mpi4py``, ``spmd`` and ``added latency`` (spmd minus mpi4py, per
  round).  ``psum`` has a second floor, ``Reduce_scatter_block`` + in-place
  ``Allgather`` by hand, and rows ``faster floor`` (per round, the faster of
  the two) and ``spmd vs faster floor`` (goal: ratio <= 1.05 from 256 KiB;
  added latency at 4 KiB <= 10 µs); the other collectives: ratio <= 1.10 from
  256 KiB, added latency at 4 KiB <= 30 µs.
- ``dp_mlp_step[batch=B]`` (global batch B = 256, 2048 split over the ranks):
  one SGD step of a 784-512-512-10 tanh MLP with softmax cross-entropy, in the
  two forms users write (``value_and_grad`` outside a ``shard_map``'ed loss
  with ``lax.pmean``; ``value_and_grad`` inside a jitted ``shard_map`` with
  ``lax.pmean`` of each gradient), against the step written by hand in numpy
  with the gradients in one flat buffer and one fused in-place ``Allreduce``
  (goal: ratio <= 1.15 at 256, <= 1.05 at 2048); diagnostic: the ``grad inside``
  form with overlap turned off (``spmd.config.overlap_bucket_bytes = 0``).

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
import dp_step  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
SIZES = (4 * KIB, 32 * KIB, 256 * KIB, 4 * MIB, 32 * MIB)
# Rounds per size (each round times one call of every variant); --quick divides by 4.
REPEATS = {4 * KIB: 400, 32 * KIB: 300, 256 * KIB: 150, 4 * MIB: 40, 32 * MIB: 16}
RATIO_GOAL, RATIO_FROM = 1.10, 256 * KIB
LATENCY_GOAL_S, LATENCY_AT = 30e-6, 4 * KIB
# psum's goals (issue 12): against the faster of its two floors.
PSUM_RATIO_GOAL, PSUM_LATENCY_GOAL_S = 1.05, 10e-6
MLP_BATCHES = (256, 2048)  # global: split over the ranks
MLP_GOALS = {256: 1.15, 2048: 1.05}
MLP_SIZES, MLP_LR = dp_step.SIZES, dp_step.LR


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
    """``({kind: (spmd_call, raw_call, check)}, {kind: (name, second_floor, check)})`` for
    an operand of ``nbytes`` per rank: the raw mpi4py call doing the same communication,
    and for psum a second floor (reduce-scatter + all-gather)."""
    import numpy as np
    from mpi4py import MPI

    import spmd
    from spmd import P, lax

    comm = _world()
    m = nbytes // 4
    x = rng.standard_normal(n * m).astype(np.float32)  # global: the same on every rank
    # The floors read this rank's block of the same global array that spmd reads (a
    # contiguous view, no copy): the same bytes in another allocation (with or without
    # transparent huge pages) changed a raw 4 MiB Allgather's time by 0.68-0.91x in
    # paired rounds, which then showed as spmd's cost or gain (docs/performance.md).
    mine = x[rank * m:(rank + 1) * m]
    smap = functools.partial(spmd.shard_map, mesh=mesh, in_specs=P("i"))
    cases, floors = {}, {}

    f = spmd.jit(smap(lambda b: lax.psum(b, "i"), out_specs=P()))
    out = np.empty(m, np.float32)
    cases["psum"] = (lambda: f(x), lambda: comm.Allreduce(mine, out, op=MPI.SUM),
                     lambda: (np.asarray(f(x)), out))
    # The second floor of psum: reduce-scatter into this rank's slice of one buffer,
    # then all-gather the slices in place (what spmd runs for large operands).
    rsag = np.empty(m, np.float32)
    chunk = m // n

    def rs_ag():
        comm.Reduce_scatter_block(mine, rsag[rank * chunk:(rank + 1) * chunk], op=MPI.SUM)
        comm.Allgather(MPI.IN_PLACE, rsag)

    floors["psum"] = ("mpi4py reduce_scatter+allgather", rs_ag, lambda: (rsag, out))
    hand = _shm_sum_by_hand(comm, mine)
    if hand is not None:
        floors["psum"] += hand

    # all_gather's result is typed as varying (as in JAX): P() needs check_vma=False.
    g = spmd.jit(smap(lambda b: lax.all_gather(b, "i", tiled=True), out_specs=P(),
                      check_vma=False))
    gathered = np.empty(n * m, np.float32)
    cases["all_gather"] = (lambda: g(x), lambda: comm.Allgather(mine, gathered),
                           lambda: (np.asarray(g(x)), gathered))

    h = spmd.jit(smap(lambda b: lax.psum_scatter(b, "i", tiled=True), out_specs=P("i")))
    part = np.empty(m // n, np.float32)

    def rs_check():
        return np.asarray(h(x).addressable_data(0)), part  # this rank's block

    cases["psum_scatter"] = (lambda: h(x),
                             lambda: comm.Reduce_scatter_block(mine, part, op=MPI.SUM), rs_check)

    a = spmd.jit(smap(lambda b: lax.all_to_all(b, "i", 0, 0, tiled=True), out_specs=P("i")))
    swapped = np.empty(m, np.float32)

    def a2a_check():
        return np.asarray(a(x).addressable_data(0)), swapped

    cases["all_to_all"] = (lambda: a(x), lambda: comm.Alltoall(mine, swapped), a2a_check)

    # A ring shift: each rank's block to the next (a pipeline's or ring attention's move).
    perm = [(i, (i + 1) % n) for i in range(n)]
    r = spmd.jit(smap(lambda b: lax.ppermute(b, "i", perm), out_specs=P("i")))
    shifted = np.empty(m, np.float32)

    def shift_floor():
        comm.Sendrecv(mine, dest=(rank + 1) % n, sendtag=7, recvbuf=shifted,
                      source=(rank - 1) % n, recvtag=7)

    def shift_check():
        return np.asarray(r(x).addressable_data(0)), shifted

    cases["ppermute"] = (lambda: r(x), shift_floor, shift_check)
    return cases, floors


_HAND: dict = {}


def _shm_sum_by_hand(comm, mine):
    """``(name, call, check)`` of a diagnostic: the shared-memory sum spmd runs for
    this size (spmd.collectives.mpi.shm), written by hand on its own window -- what
    spmd's call costs beyond its algorithm.  None outside that path's size range."""
    import numpy as np
    from mpi4py import MPI

    from spmd.collectives.mpi import shm as mpi_shm

    lo, hi = mpi_shm.size_range()
    if hi == 0 or mine.nbytes < lo:
        return None
    n, rank = comm.Get_size(), comm.Get_rank()
    if "win" not in _HAND:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        if node.Get_size() != n:
            return None
        win = MPI.Win.Allocate_shared(2 * hi, 1, comm=comm)
        win.Lock_all(MPI.MODE_NOCHECK)
        _HAND.update(win=win, calls=[0],
                     bases=[np.frombuffer(win.Shared_query(r)[0], np.uint8) for r in range(n)])
    win, calls = _HAND["win"], _HAND["calls"]
    step = min(mine.size, hi // mine.itemsize)  # larger operands: slot-sized pieces
    pieces = [(lo, min(lo + step, mine.size)) for lo in range(0, mine.size, step)]
    slots = [[b[s * hi:s * hi + step * mine.itemsize].view(mine.dtype)
              for b in _HAND["bases"]] for s in (0, 1)]
    out = np.empty_like(mine)

    def by_hand():
        for a, b in pieces:
            v = [w[:b - a] for w in slots[calls[0] & 1]]
            calls[0] += 1
            np.copyto(v[rank], mine[a:b])
            win.Sync()
            comm.Barrier()
            win.Sync()
            np.add(v[0], v[1], out=out[a:b])
            for w in v[2:]:
                np.add(out[a:b], w, out=out[a:b])

    return ("shared-memory sum by hand", by_hand, lambda: (out, mine))


def bench_collectives(mesh, quick: bool, sizes=SIZES, kinds=None) -> list[dict]:
    import numpy as np

    comm = _world()
    n, rank = comm.Get_size(), comm.Get_rank()
    rows = []
    for nbytes in sizes:
        rng = np.random.default_rng(nbytes)
        cases, floors = _collective_cases(mesh, n, rank, nbytes, rng)
        repeats = max(8, REPEATS.get(nbytes, 50) // (4 if quick else 1))
        unit = "us" if nbytes <= 256 * KIB else "ms"
        for kind, (spmd_call, raw_call, check) in cases.items():
            if kinds and kind not in kinds:
                continue
            raw_call()
            got, want = check()  # same numbers first: timing a wrong result is worthless
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * n)
            variants = {"mpi4py": raw_call, "spmd": spmd_call}
            second = floors.get(kind)
            hand = None
            if second is not None:
                second[1]()
                got2, want2 = second[2]()
                np.testing.assert_allclose(got2, want2, rtol=1e-5, atol=1e-5 * n)
                variants[second[0]] = second[1]
                if len(second) > 3:  # the diagnostic: spmd's own algorithm, by hand
                    hand = second[3:]
                    hand[1]()
                    np.testing.assert_allclose(hand[2]()[0], second[2]()[0], rtol=1e-5,
                                               atol=1e-5 * n)
                    variants[hand[0]] = hand[1]
            times = interleave_mpi(comm, variants, repeats)
            name = f"{kind}[{size_label(nbytes)}]"
            added = [s - r for s, r in zip(times["spmd"], times["mpi4py"])]
            rows += [
                row(name, "mpi4py", times["mpi4py"], unit=unit,
                    note="the raw buffer call (Allreduce for psum)"),
                row(name, "spmd", times["spmd"], baseline="mpi4py", unit=unit,
                    goal_ratio=RATIO_GOAL if nbytes >= RATIO_FROM and second is None
                    else None),
                row(name, "added latency", added, unit="us",
                    goal_max_s=(PSUM_LATENCY_GOAL_S if kind == "psum" else LATENCY_GOAL_S)
                    if nbytes == LATENCY_AT else None,
                    note="spmd minus mpi4py, per round"),
            ]
            if second is not None:
                # The second floor, and spmd against the faster floor of each round:
                # a win that comes from choosing the algorithm is credited as such.
                best = [min(a, b) for a, b in zip(times["mpi4py"], times[second[0]])]
                rows += [row(name, second[0], times[second[0]], baseline="mpi4py", unit=unit,
                             note="hand-written second floor"),
                         row(name, "faster floor", best, unit=unit,
                             note="per round, the faster of the two floors"),
                         row(name, "spmd vs faster floor", times["spmd"],
                             baseline="faster floor", unit=unit,
                             goal_ratio=PSUM_RATIO_GOAL if nbytes >= RATIO_FROM else None)]
            if hand is not None:
                rows += [row(name, hand[0], times[hand[0]], baseline="mpi4py", unit=unit,
                             note="diagnostic: the shared-memory sum spmd runs at this size"),
                         row(name, "spmd vs the same by hand", times["spmd"],
                             baseline=hand[0], unit=unit,
                             note="diagnostic: what spmd's call adds to its algorithm")]
        del cases
    return rows


# -------------------------------------------------------------- MLP step

def make_spmd_steps(mesh) -> dict:
    """The step in the two forms users write (benchmarks/dp_step.py):
    ``{"grad outside": ..., "grad inside": ...}``, and the DDP-style form with its
    gradient reduction not overlapped (``"grad inside, overlap off"``: compiled and
    called with ``spmd.config.overlap_bucket_bytes = 0``, a diagnostic)."""
    from spmd.config import config

    steps = dp_step.make_steps(mesh, "i", lr=MLP_LR)
    plain = dp_step.make_steps(mesh, "i", lr=MLP_LR)["grad inside"]

    def overlap_off(*args):
        # (The per-process program is compiled at the first calls with each kind of
        # argument, so the switch is set around every call: a few microseconds.)
        old = config.overlap_bucket_bytes
        config.update("overlap_bucket_bytes", 0)
        try:
            return plain(*args)
        finally:
            config.update("overlap_bucket_bytes", old)

    return {"grad outside": steps["grad outside"], "grad inside": steps["grad inside"],
            "grad inside, overlap off": overlap_off}


class NumpyStep:
    """The same step by hand: numpy forward and backward, the gradients written
    straight into one flat buffer (with ``out=``) that one in-place ``Allreduce``
    sums together with the loss, ``1/n`` folded into the update's scale."""

    def __init__(self, params, comm, rows: int):
        import numpy as np

        self.params = [(w.copy(), b.copy()) for w, b in params]
        self.comm, self.n = comm, comm.Get_size()
        shapes = [p.shape for wb in reversed(params) for p in wb]  # w3, b3, w2, ...
        self.flat = np.empty(1 + sum(int(np.prod(s)) for s in shapes), np.float32)
        self.grads, at = [], 1
        for shape in shapes:
            size = int(np.prod(shape))
            self.grads.append(self.flat[at:at + size].reshape(shape))
            at += size
        self.rows = rows

    def __call__(self, x, y):
        import numpy as np
        from mpi4py import MPI

        (w1, b1), (w2, b2), (w3, b3) = self.params
        gw3, gb3, gw2, gb2, gw1, gb1 = self.grads
        h1 = np.tanh(x @ w1 + b1)
        h2 = np.tanh(h1 @ w2 + b2)
        z = h2 @ w3 + b3
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        self.flat[0] = -np.sum(y * (z - np.log(s))) / self.rows
        dz = (e / s - y) / self.rows
        np.matmul(h2.T, dz, out=gw3)
        dz.sum(axis=0, out=gb3)
        dh2 = (dz @ w3.T) * (1 - h2 * h2)
        np.matmul(h1.T, dh2, out=gw2)
        dh2.sum(axis=0, out=gb2)
        dh1 = (dh2 @ w2.T) * (1 - h1 * h1)
        np.matmul(x.T, dh1, out=gw1)
        dh1.sum(axis=0, out=gb1)
        self.comm.Allreduce(MPI.IN_PLACE, self.flat, op=MPI.SUM)
        scale = np.float32(MLP_LR / self.n)
        for p, g in zip((w3, b3, w2, b2, w1, b1), self.grads):
            p -= scale * g
        return float(self.flat[0]) / self.n


def bench_mlp_step(mesh, quick: bool) -> list[dict]:
    import numpy as np

    comm = _world()
    n, rank = comm.Get_size(), comm.Get_rank()
    rows = []
    steps = make_spmd_steps(mesh)
    for batch in MLP_BATCHES:
        per = batch // n
        rng = np.random.default_rng(7)
        x = rng.standard_normal((batch, MLP_SIZES[0])).astype(np.float32)
        y = np.eye(MLP_SIZES[-1], dtype=np.float32)[rng.integers(0, MLP_SIZES[-1], batch)]
        x_mine = np.ascontiguousarray(x[rank * per:(rank + 1) * per])
        y_mine = np.ascontiguousarray(y[rank * per:(rank + 1) * per])
        params = dp_step.make_params()
        variants, state = {}, {}
        hand = NumpyStep(params, comm, per)
        want = hand(x_mine, y_mine)
        for form, step in steps.items():
            # Same numbers first: one step of each from the same parameters.
            new, value = step(params, x, y)
            np.testing.assert_allclose(float(value), want, rtol=1e-4)
            for (w, b), (hw, hb) in zip(new, hand.params):
                np.testing.assert_allclose(np.asarray(w), hw, rtol=1e-4, atol=1e-6)
                np.testing.assert_allclose(np.asarray(b), hb, rtol=1e-4, atol=1e-6)
            state[form] = new

            def spmd_step(step=step, form=form):
                state[form], _ = step(state[form], x, y)

            variants[form] = spmd_step
        variants["numpy+mpi4py"] = lambda: hand(x_mine, y_mine)
        times = interleave_mpi(comm, variants, repeats=12 if quick else 40)
        name = f"dp_mlp_step[batch={batch}]"
        rows.append(row(name, "numpy+mpi4py", times["numpy+mpi4py"],
                        note="hand-written, one fused Allreduce"))
        for form in steps:
            diagnostic = "overlap off" in form
            rows.append(row(name, f"spmd {form}", times[form], baseline="numpy+mpi4py",
                            goal_ratio=None if diagnostic else MLP_GOALS[batch],
                            note="diagnostic: SPMD_OVERLAP_BUCKET_BYTES=0" if diagnostic
                            else ""))
    return rows


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
                    help="only these collectives (psum,all_gather,psum_scatter,all_to_all,"
                         "ppermute)")
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
    common.provenance()  # the commit and tree state now, before anything runs
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
            if not args.quick and os.path.abspath(args.out) == os.path.join(HERE, "results"):
                runner.regenerate_tables()
        missed = [f"{r['benchmark']} / {r['variant']}" for r in rows if r["passed"] is False]
        if missed:
            print("\ngoals missed:\n  " + "\n  ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
