"""The automatic partitioner against the same program written by hand with shard_map.

Measured (in one process, variants interleaved):

- ``megatron_mlp[b=512,512-2048-512]``: ``tanh(x @ W1) @ W2`` in float32 on a mesh
  of 4 x 2 simulated devices (``('data', 'model')``), with ``x`` split
  ``P('data', None)``, ``W1`` ``P(None, 'model')``, ``W2`` ``P('model', None)`` and
  the result ``P('data', None)``.  Variants:

  - ``shard_map by hand``: ``spmd.jit`` of a ``shard_map`` whose body is
    ``lax.psum(tanh(x @ w1) @ w2, 'model')`` (the baseline);
  - ``partitioned``: ``spmd.jit(mlp, in_shardings=..., out_shardings=...)`` of the
    global program; the partitioner inserts the same single ``psum``
    (goal: ratio <= 1.05 against the hand-written one).

Run it alone with ``python benchmarks/run.py partitioner`` (``--quick`` for a smoke
run); ``python benchmarks/bench_partitioner.py --program`` prints the per-device
program the partitioner produced.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from common import interleave, row

import spmd
import spmd.numpy as snp
from spmd import NamedSharding, P, lax

FULL = (512, 512, 2048, 512)  # batch, d_in, d_hidden, d_out
QUICK = (128, 256, 1024, 256)


def mlp(x, w1, w2):
    return snp.dot(snp.tanh(snp.dot(x, w1)), w2)


def make(sizes):
    """(hand-written step, partitioned step, inputs placed on the mesh)."""
    b, d, h, o = sizes
    mesh = spmd.make_mesh((4, 2), ("data", "model"))
    specs = (P("data", None), P(None, "model"), P("model", None))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype(np.float32) / np.sqrt(s[0])
          for s in ((b, d), (d, h), (h, o))]
    args = [spmd.device_put(x, NamedSharding(mesh, s)) for x, s in zip(xs, specs)]

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=specs, out_specs=P("data", None))
    def by_hand(x, w1, w2):
        return lax.psum(snp.dot(snp.tanh(snp.dot(x, w1)), w2), "model")

    partitioned = spmd.jit(mlp, in_shardings=tuple(NamedSharding(mesh, s) for s in specs),
                           out_shardings=NamedSharding(mesh, P("data", None)))
    return by_hand, partitioned, args, xs


def _check(by_hand, partitioned, args, xs) -> None:
    want = mlp(*xs)
    for f in (by_hand, partitioned):
        np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-4, atol=1e-4)
    lowered = partitioned.lower(*args)
    kinds = [c for c, _, _ in lowered.collectives()]
    assert kinds == ["psum"], lowered.as_text()


def run(quick: bool = False) -> list[dict]:
    sizes = QUICK if quick else FULL
    by_hand, partitioned, args, xs = make(sizes)
    _check(by_hand, partitioned, args, xs)
    times = interleave({"shard_map by hand": lambda: by_hand(*args),
                        "partitioned": lambda: partitioned(*args)},
                       repeats=8 if quick else 40, target_s=0.02 if quick else 0.1)
    name = f"megatron_mlp[b={sizes[0]},{'-'.join(map(str, sizes[1:]))}]"
    return [row(name, "shard_map by hand", times["shard_map by hand"]),
            row(name, "partitioned", times["partitioned"], baseline="shard_map by hand",
                goal_ratio=1.05, note="same single psum over 'model'")]


if __name__ == "__main__":
    if "--program" in sys.argv:
        _, part, a, _ = make(QUICK)
        print(part.lower(*a).as_text())
    else:
        print(run(quick="--quick" in sys.argv))
