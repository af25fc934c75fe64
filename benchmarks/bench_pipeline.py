"""Pipeline schedules on MPI ranks: the measured bubble of GPipe and 1F1B against theory,
and the stage inputs each holds.

Run under MPI, one stage per rank: ``.venv/bin/spmd-run -n 2 benchmarks/bench_pipeline.py``
(``OPENBLAS_NUM_THREADS=1`` is set per rank).  The model: ``S`` stages (one per rank),
each 4 layers of ``tanh(x @ W)`` with ``W`` 1024 x 1024, float32, microbatches of 64
rows, ``M`` = 8 and 16 microbatches, the loss a mean square on the last stage.  The
step is a jitted ``shard_map`` of ``spmd.parallel.pipeline_value_and_grad``.

- ``step``: the slowest rank's time per step (a barrier before each);
- ``stage forward`` / ``stage backward``: one microbatch's forward of one stage, and
  its backward (the forward recomputed, then its vjp), timed alone on rank 0 (both
  ranks running them at once, as in the step): ``f`` and ``b``;
- ``work, unpipelined``: right after each step, every rank runs what its stage
  computes in the pipeline for the same ``M`` microbatches, one after another with no
  pipeline: a forward and a backward each (the last rank: the backward only, with the
  loss and its gradient inside, as its stage runs it: its forward's result would go to
  no stage); the mean over ranks: the work a stage's share of the step holds;
- ``bubble, measured``: ``1 - work / step`` for each step and the work right after
  it: the share of the step the mean stage spends on anything but its microbatches
  (the last stage, which runs no forward of its own, idles more: it counts here).
  Paired so that both see the same machine: this one's cores stall for 3-8 ms every
  few dozen milliseconds, more in some minutes than others (plain numpy products
  show it), and a step is the sum of ``2 M`` calls, whose stalls the median of single
  calls (``f``, ``b``) leaves out;
- ``bubble, slowest stage``: ``1 - work_r / step`` with ``work_r`` the unpipelined
  work of the rank whose own took longest (stage 0's: the last stage runs no forward
  of its own): the goal's measure.  The theory's stages are equal; unequal ones make
  a pipeline go at its slowest stage's pace, and the mean of the ranks' work counts
  the faster stages' waits for it as bubble: the stages' imbalance, not the
  schedule's;
- ``stages' imbalance``: the slowest rank's unpipelined work over the mean, less 1:
  what the two bubbles above differ by, in the same rounds (the last stage's lighter
  work included);
- ``bubble, idle``: the slowest rank's time in the step's collectives
  (``spmd.distributed.collective_time``: waiting for its neighbour at a tick's
  ``ppermute``, and the transfer itself) over the step: its idle share measured
  directly;
- ``work beyond unpipelined``: ``bubble, slowest stage`` less that idle share: what
  the slowest rank's pipelined step computes beyond its unpipelined work (the
  schedule's bookkeeping, the inputs' gradients kept);
- ``bubble, theory``: ``(S - 1) / (M + S - 1)``; the goal is the slowest stage's
  bubble at most 10% above it (relative);
- ``bubble, lockstep model``: ``1 - M (f + b) / lockstep_time(f, b)``, the
  schedule's table (``spmd.parallel.pipeline_schedule``) priced with ``f`` and ``b``
  when every tick lasts as long as its busiest stage's operations (the ranks meet at
  each tick's ``ppermute``);
- ``bubble, dataflow model``: ``1 - M (f + b) / dataflow_time(f, b, w)``, the table
  as the pipeline runs it: each result sent as soon as it exists, what came read at
  the end of the tick, the weights' gradient (``w``, timed alone on rank 0 as the
  pipeline's second part of a backward) after the input's cotangent has gone back,
  the last stage's forwards only inside its backwards: stage 0's idle share;
- ``stage inputs held``: the buffer of microbatch inputs a stage keeps (``M`` for
  GPipe, ``2 (S - 1 - s) + 1`` on stage ``s`` for 1F1B, the most of any stage but the
  first, which reads its own where they are), in MiB.

Rank 0 prints the table and writes ``benchmarks/results/pipeline_n<S>.json``.
"""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__main__":
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_name, "1")

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402  (puts the repository root on sys.path)
import spmd.numpy as snp  # noqa: E402

D, ROWS, LAYERS = 1024, 64, 4
MICROBATCHES = (8, 16)


def _layer(p, x):
    for k in range(LAYERS):
        x = snp.tanh(x @ p[0, k])
    return x


def _mse(y, t):
    return ((y - t) ** 2).mean()


def _with_head(p, x, t):
    """The last stage's backward of a microbatch as the pipeline runs it: the forward
    (for the vjp), the loss and its gradient, the vjp (the parameters' and the
    input's)."""
    import spmd

    y, back = spmd.vjp(_layer, p, x)
    value, dy = spmd.value_and_grad(_mse)(y, t)
    return value, back(dy)


def measure(rounds: int) -> list[dict]:
    import numpy as np
    from mpi4py import MPI

    import spmd
    from spmd import P
    from spmd.compiler.transforms.split import split
    from spmd.parallel import pipeline_schedule, pipeline_value_and_grad
    from spmd.parallel.schedule import theory_bubble

    comm = MPI.COMM_WORLD
    S = comm.Get_size()
    mesh = spmd.make_mesh((S,), ("pipe",))
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(S, LAYERS, D, D)) / np.sqrt(D)).astype(np.float32)
    placed = spmd.device_put(w, spmd.NamedSharding(mesh, P("pipe")))

    # One stage's forward and backward of one microbatch, alone (rank 0's numbers).
    w0 = w[:1]
    x0 = rng.normal(size=(ROWS, D)).astype(np.float32)
    fwd = spmd.jit(_layer)
    bwd = spmd.jit(lambda p, x, ct: spmd.vjp(_layer, p, x)[1](ct))
    # The last stage's work per microbatch, as the pipeline runs it: its backward
    # only (the forward inside it, then the loss and the loss's gradient).
    last = comm.Get_rank() == S - 1
    last_bwd = spmd.jit(_with_head)
    # The backward's second part as the pipeline runs it (spmd.compiler.transforms.split): the
    # parameters' gradient, after the input's cotangent has been sent.
    cotangent, gradient = split(lambda p, x, ct: spmd.vjp(_layer, p, x)[1](ct)[::-1],
                                w0, x0, x0)
    carried = spmd.jit(lambda p, x, ct: cotangent(p, x, ct)[1])(w0, x0, x0)
    weights = spmd.jit(gradient)
    f_times, b_times, w_times = [], [], []
    for _ in range(_warm_up_calls()):
        fwd(w0, x0), bwd(w0, x0, x0), weights(carried), last_bwd(w0, x0, x0)
    for _ in range(40):
        t0 = time.perf_counter()
        fwd(w0, x0)
        t1 = time.perf_counter()
        bwd(w0, x0, x0)
        t2 = time.perf_counter()
        weights(carried)
        t3 = time.perf_counter()
        f_times.append(t1 - t0)
        b_times.append(t2 - t1)
        w_times.append(t3 - t2)
    f_times, b_times, w_times = comm.bcast((f_times, b_times, w_times), root=0)
    f, b, wg = (float(np.median(t)) for t in (f_times, b_times, w_times))

    rows = [common.row("stage", "forward (f)", f_times),
            common.row("stage", "backward (b)", b_times,
                       note="the forward recomputed, then its vjp"),
            common.row("stage", "weights' gradient (w)", w_times,
                       note="the part of b after the input's cotangent is sent")]
    for m in MICROBATCHES:
        xs = rng.normal(size=(m, ROWS, D)).astype(np.float32)
        ys = rng.normal(size=(m, ROWS, D)).astype(np.float32)
        for name in ("gpipe", "1f1b"):
            step = spmd.jit(spmd.shard_map(
                lambda p, xs, ys, name=name: pipeline_value_and_grad(
                    _layer, _mse, p, xs, ys, "pipe", schedule=name),
                mesh=mesh, in_specs=(P("pipe"), P(), P()),
                out_specs=(P(), spmd.parallel.PipelineGrads(P("pipe"), P(), P()))))
            for _ in range(_warm_up_calls()):
                step(placed, xs, ys)
            times, idle, work, slowest, beyond = [], [], [], [], []
            for _ in range(rounds):
                comm.Barrier()
                _, c0 = spmd.distributed.collective_time()
                t0 = time.perf_counter()
                step(placed, xs, ys)
                mine = time.perf_counter() - t0
                _, c1 = spmd.distributed.collective_time()
                times.append(comm.allreduce(mine, op=MPI.MAX))
                # A stage's idle share: its time in the step's collectives (waiting
                # for its neighbour at each tick's transfers, and the transfers).
                idles = comm.allgather((c1 - c0) / times[-1])
                # The same microbatches' work without the pipeline, right after, on
                # every rank at once: what each stage computes of them in the pipeline.
                comm.Barrier()
                t0 = time.perf_counter()
                for i in range(m):
                    if last:
                        last_bwd(w0, xs[i], ys[i])
                    else:
                        fwd(w0, xs[i])
                        bwd(w0, xs[i], ys[i])
                own = comm.allgather(time.perf_counter() - t0)
                work.append(sum(own) / len(own))
                slowest.append(max(own))
                r = own.index(max(own))
                idle.append(idles[r])
                beyond.append(1 - own[r] / times[-1] - idles[r])
            sched = pipeline_schedule(name, S, m)
            theory = theory_bubble(S, m)
            ticks = sched.lockstep_time(f, b)
            bench = f"{name}[S={S},M={m}]"
            rows += [
                common.row(bench, "step", times),
                common.row(bench, "work, unpipelined", work,
                           note="each stage's work on the M microbatches, after each step; "
                                "the mean over ranks"),
                common.row(bench, "bubble, measured", [1 - w_ / t for t, w_ in zip(times, work)],
                           unit="%", note="1 - the ranks' mean work / step, per round"),
                common.row(bench, "bubble, slowest stage",
                           [1 - w_ / t for t, w_ in zip(times, slowest)], unit="%",
                           goal_max_s=1.1 * theory,
                           note="1 - the slowest rank's own work / step, per round; "
                                "goal: at most 10% above theory"),
                common.row(bench, "stages' imbalance", [s_ / w_ - 1 for s_, w_ in
                                                        zip(slowest, work)], unit="%",
                           note="the slowest rank's unpipelined work over the mean, less "
                                "1, per round (the last stage's is lighter)"),
                common.row(bench, "bubble, idle", idle, unit="%",
                           note="the slowest rank's time in the step's collectives (waits "
                                "and transfers) over the step, per round"),
                common.row(bench, "work beyond unpipelined", beyond, unit="%",
                           note="bubble, slowest stage, less its idle share: what that "
                                "rank's step computes beyond its unpipelined work (the "
                                "schedule's bookkeeping)"),
                common.row(bench, "bubble, theory", [theory], unit="%",
                           note="(S - 1) / (M + S - 1)"),
                common.row(bench, "bubble, lockstep model", [1 - m * (f + b) / ticks],
                           unit="%", note="each tick as long as its slowest operation, "
                                          "the last stage's forwards too"),
                common.row(bench, "bubble, dataflow model",
                           [1 - m * (f + b) / sched.dataflow_time(f, b, wg)], unit="%",
                           note="results sent at once, read at the tick's end, w after "
                                "the cotangent is sent, the last stage's forwards inside "
                                "its backwards"),
                common.row(bench, "stage inputs held",
                           [max(1, max(sched.inputs_held)) * ROWS * D * 4], unit="MiB",
                           note=f"{max(1, max(sched.inputs_held))} microbatches"),
            ]
    return rows


def _warm_up_calls() -> int:
    """Calls before timing: past the one where compiled loops take over
    (``spmd.compiler.engine.loops.SWITCH_AT``; their compilation runs in the background
    before it, on the cores the timed calls would use)."""
    from spmd.compiler.engine import loops

    return loops.SWITCH_AT + 1


def skip_reason() -> str:
    """``benchmarks/run.py`` runs it not: it has a ``main`` of its own, on MPI ranks."""
    return common.mpi_only("pipeline")


def main(argv=None) -> int:
    return common.mpi_main("pipeline", __doc__, measure, argv, rounds=15)


if __name__ == "__main__":
    sys.exit(main())
