"""Pictures of what each device holds and sends, for each axis of ``spmd.parallel``.

For ring attention (``seq``), the mixture of experts (``expert``) and the 1F1B
pipeline (``pipe``), each on 4 simulated devices, this script traces the jitted
``shard_map`` a user writes and reads two things from it: every input's block on a
device, from its spec; and every collective of the per-device program, with its
operand's shape and how often it runs (a loop's trip count included).  It then
draws one PNG per axis into ``docs/images/`` with matplotlib: the devices as boxes
listing their blocks, and the collectives as arrows labelled with the bytes a device
sends per call.  Nothing in a picture is typed by hand.

    .venv/bin/python benchmarks/parallel_pictures.py [--out docs/images]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("SPMD_NUM_DEVICES", "8")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

COLLECTIVES = ("ppermute", "all_to_all", "psum", "all_gather", "psum_scatter", "pmax",
               "pmin")
N = 4


def _collectives(program, times=1, out=None):
    """``[(name, operand shape, dtype, calls, params)]`` of a program, loops unrolled into
    call counts (a scan's length; a while loop's body counted once)."""
    out = [] if out is None else out
    program = getattr(program, "program", program)
    for e in program.eqns:
        name = e.primitive.name
        if name in COLLECTIVES:
            a = e.inputs[0].aval
            out.append((name, tuple(a.shape), a.dtype, times, dict(e.params)))
        reps = times * int(e.params.get("length", 1)) if name == "scan" else times
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                if hasattr(sub, "eqns"):
                    _collectives(sub, reps, out)
    return out


def _merge(colls):
    """Identical collectives (name, shape, perm) added up."""
    merged: dict = {}
    for name, shape, dtype, calls, params in colls:
        perm = tuple(params.get("perm", ()))
        key = (name, shape, str(dtype), perm)
        merged[key] = merged.get(key, 0) + calls
    return [(name, shape, np.dtype(dt), perm, calls)
            for (name, shape, dt, perm), calls in merged.items()]


def _trace(fn, args):
    import spmd

    closed = spmd.jit(fn).trace(*args).jaxpr
    body = next(e for e in closed.eqns if e.primitive.name == "shard_map")
    return _merge(_collectives(body.params["program"]))


def ring():
    import spmd
    from spmd import P
    from spmd.parallel import ring_attention

    mesh = spmd.make_mesh((N,), ("seq",))
    B, H, S, D = 1, 4, 1024, 64
    q = np.zeros((B, H, S, D), np.float32)
    fn = spmd.shard_map(lambda q, k, v: ring_attention(q, k, v, "seq"), mesh=mesh,
                        in_specs=P(None, None, "seq"), out_specs=P(None, None, "seq"))
    holds = [(f"{n}: (B, H, S/{N}, D)", (B, H, S // N, D), q.dtype) for n in "qkv"]
    return ("seq", "ring attention, causal, sequence 1024 over 4 devices (forward)", holds,
            _trace(fn, (q, q, q)))


def experts():
    import spmd
    from spmd import P
    from spmd.parallel import moe

    mesh = spmd.make_mesh((N,), ("expert",))
    T, D, H, E = 512, 64, 256, 8
    x = np.zeros((T, D), np.float32)
    router = np.zeros((D, E), np.float32)
    w_in, w_out = np.zeros((E, D, H), np.float32), np.zeros((E, H, D), np.float32)
    fn = spmd.shard_map(lambda x, r, a, b: moe(x, r, a, b, "expert", capacity_factor=2.0)[0],
                        mesh=mesh, in_specs=(P("expert"), P(), P("expert"), P("expert")),
                        out_specs=P("expert"))
    holds = [(f"tokens: (T/{N}, d)", (T // N, D), x.dtype),
             ("router: (d, E), whole", (D, E), x.dtype),
             (f"w_in: (E/{N}, d, h)", (E // N, D, H), x.dtype),
             (f"w_out: (E/{N}, h, d)", (E // N, H, D), x.dtype)]
    return ("expert", "mixture of 8 experts, top 2, over 4 devices (forward)", holds,
            _trace(fn, (x, router, w_in, w_out)))


def pipe():
    import spmd
    import spmd.numpy as snp
    from spmd import P
    from spmd.parallel import PipelineGrads, pipeline_schedule, pipeline_value_and_grad

    mesh = spmd.make_mesh((N,), ("pipe",))
    M, R, D = 8, 64, 256
    w = np.zeros((N, D, D), np.float32)
    xs = np.zeros((M, R, D), np.float32)
    layer = lambda p, x: snp.tanh(x @ p[0])  # noqa: E731
    mse = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    fn = spmd.shard_map(lambda p, xs, ys: pipeline_value_and_grad(layer, mse, p, xs, ys, "pipe"),
                        mesh=mesh, in_specs=(P("pipe"), P(), P()),
                        out_specs=(P(), PipelineGrads(P("pipe"), P(), P())))
    kept = max(pipeline_schedule("1f1b", N, M).inputs_held)
    holds = [("stage weights: (1, d, d)", (1, D, D), w.dtype),
             (f"microbatches: (M={M}, rows, d), whole", (M, R, D), xs.dtype),
             (f"stage inputs kept: at most {kept} microbatches", (kept, R, D), xs.dtype)]
    return ("pipe", "1F1B pipeline, 4 stages, 8 microbatches (forward and backward)", holds,
            _trace(fn, (w, xs, xs)))


def _bytes(shape, dtype) -> str:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n < 1024:
        return f"{n} B"
    return f"{n / 2 ** 20:.2f} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:.0f} KiB"


def _perm_text(perm) -> str:
    steps = {(dst - src) % N for src, dst in perm}
    if steps == {1}:
        return ", device i to i+1"
    if steps == {N - 1}:
        return ", device i to i-1"
    return f", pairs {list(perm)}"


def draw(axis, title, holds, colls, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(11, 4.6))
    ax.set_xlim(0, N * 3)
    ax.set_ylim(-2.4, 3.9)
    ax.axis("off")
    ax.set_title(title, fontsize=11)
    for d in range(N):
        x0 = d * 3 + 0.2
        ax.add_patch(FancyBboxPatch((x0, 0), 2.6, 2.6, boxstyle="round,pad=0.05",
                                    fc="#eef3fb", ec="#3b6db3"))
        ax.text(x0 + 1.3, 2.35, f"device {d} ({axis}={d})", ha="center", fontsize=9,
                weight="bold")
        for k, (label, shape, dtype) in enumerate(holds):
            ax.text(x0 + 0.1, 1.95 - 0.42 * k, f"{label}\n  {_bytes(shape, dtype)}",
                    fontsize=7, va="top")
    lines = []
    for name, shape, dtype, perm, calls in colls:
        each = _bytes(shape, dtype)
        lines.append(f"{name} of {shape} ({each}) x {calls} per call"
                     + (_perm_text(perm) if perm else ""))
        if name == "all_to_all":  # every device sends a share to every other: all pairs
            lines[-1] += f", each device a 1/{N} share to every device"
            for i in range(N):
                for j in range(i + 1, N):
                    ax.add_patch(FancyArrowPatch(
                        (i * 3 + 1.5, -0.1), (j * 3 + 1.5, -0.1),
                        connectionstyle=f"arc3,rad={0.45 / (j - i)}", arrowstyle="<|-|>",
                        mutation_scale=9, color="#7d3c98", lw=0.9, alpha=0.7))
        for src, dst in perm:
            # Sends to the next device below the boxes, to the previous one above them
            # (arc3's bend is to the right of the arrow's direction for a positive rad).
            on = (dst - src) % N == 1
            y = -0.1 if on else 2.7
            start, end = (src * 3 + 1.5, y), (dst * 3 + 1.5, y)
            rad = 0.35 if (dst > src) == on else -0.35
            if abs(dst - src) > 1:  # the ring's wrap-around, in a wide arc
                rad = 0.2 if dst > src else -0.2
            ax.add_patch(FancyArrowPatch(start, end, connectionstyle=f"arc3,rad={rad}",
                                         arrowstyle="-|>", mutation_scale=10,
                                         color="#c0392b" if name == "ppermute" else "#7d3c98",
                                         lw=1.0, alpha=0.8))
    ax.text(0.2, -1.2, "\n".join(["sends to the next device below the boxes, to the previous "
                                   "one above them", *lines]), fontsize=8, va="top",
            family="monospace")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "images"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for make in (ring, experts, pipe):
        axis, title, holds, colls = make()
        path = os.path.join(args.out, f"parallel_{axis}.png")
        draw(axis, title, holds, colls, path)
        print(f"{path}: {len(colls)} kinds of collective")
    return 0


if __name__ == "__main__":
    sys.exit(main())
