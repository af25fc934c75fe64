"""``spmd.parallel``: what context parallelism (ring attention) costs and saves.

Causal attention of one layer, batch 1, 4 heads, sequence 1024, head size 64,
float32, forward and backward (``jit(grad)`` of a weighted sum of the output):

- ``full attention``: ``spmd.numpy`` on one device (scores of the whole sequence);
- ``ring, seq=n``: ``ring_attention`` in a ``shard_map`` whose axis splits the
  sequence over ``n`` simulated devices (2, 4, 8), contiguous and zigzag layouts.

Time rows are medians of interleaved calls in this process; the simulated devices run
stacked, so a row is the whole mesh's work and overhead (the ring does the same
products in ``n`` steps), not one device's time.  Memory rows: the peak of numpy's
allocations during one forward and backward call (``tracemalloc``), divided by the
number of devices: what a device holds at its peak.  Full attention's scores alone
are ``4 * 1024 * 1024`` floats (16 MiB); a device of the ring computes ``(1024 / n)^2``
per head at a time, in both passes.

Run it alone with ``python benchmarks/run.py parallel``.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from common import interleave, row

import spmd
import spmd.numpy as snp
from spmd import P
from spmd.parallel import ring_attention, zigzag_order

B, H, S, D = 1, 4, 1024, 64


def _full(q, k, v):
    s = snp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(D)
    s = snp.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    return spmd.nn.softmax(s, axis=-1) @ v


def _ring(n, layout):
    mesh = spmd.make_mesh((n,), ("seq",))
    return spmd.shard_map(lambda q, k, v: ring_attention(q, k, v, "seq", layout=layout),
                          mesh=mesh, in_specs=P(None, None, "seq"),
                          out_specs=P(None, None, "seq"))


def _step(attn, w):
    return spmd.jit(spmd.grad(lambda q, k, v: snp.sum(attn(q, k, v) * w), argnums=(0, 1, 2)))


def _peak_bytes(call) -> int:
    call()  # compiled, caches warm
    gc.collect()
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run(quick: bool = False) -> list[dict]:
    rng = np.random.default_rng(0)
    q, k, v, w = (rng.normal(size=(B, H, S, D)).astype(np.float32) for _ in range(4))
    variants, devices = {"full attention": (_step(_full, w), (q, k, v))}, {"full attention": 1}
    want = np.asarray(variants["full attention"][0](q, k, v)[0])
    for n in ((2, 8) if quick else (2, 4, 8)):
        for layout in ("contiguous", "zigzag"):
            order = zigzag_order(S, n) if layout == "zigzag" else np.arange(S)
            args = tuple(a[:, :, order] for a in (q, k, v))
            step = _step(_ring(n, layout), w[:, :, order])
            got = np.asarray(step(*args)[0])[:, :, np.argsort(order)]
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)  # the check
            name = f"ring, seq={n}, {layout}"
            variants[name], devices[name] = (step, args), n
    calls = {name: (lambda f=f, a=a: f(*a)) for name, (f, a) in variants.items()}
    times = interleave(calls, repeats=3 if quick else 10, warmup=1, target_s=0.0)
    rows = []
    for name in variants:
        base = None if name == "full attention" else "full attention"
        rows.append(row("causal attention fwd+bwd [1x4x1024x64]", name, times[name],
                        baseline=base, unit="ms",
                        note="spmd.numpy, one device" if base is None else
                        f"{devices[name]} simulated devices, stacked in this process"))
    for name in variants:
        peak = _peak_bytes(calls[name]) / devices[name]
        base = None if name == "full attention" else "full attention"
        rows.append(row("peak memory per device, fwd+bwd", name, [peak], baseline=base,
                        unit="MiB", note="tracemalloc peak / devices"))
    return rows
