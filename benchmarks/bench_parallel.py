"""``spmd.parallel``: what context parallelism (ring attention) costs and saves.

Causal attention of one layer, batch 1, 4 heads, sequence 1024, head size 64,
float32, forward and backward (``jit(grad)`` of a weighted sum of the output):

- ``full attention``: ``spmd.numpy`` on one device (scores of the whole sequence);
- ``ring, seq=n``: ``ring_attention`` in a ``shard_map`` whose axis splits the
  sequence over ``n`` simulated devices (2, 4, 8), contiguous and zigzag layouts;
- ``moe``: a mixture of 8 experts (2048 tokens of width 128, hidden width 512, top 2,
  capacity factor 4 so that no token is dropped) with its experts and tokens split
  over 1, 2, 4 and 8 simulated devices; the same gradients on every mesh.

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
    return rows + _experts(quick)


# A mixture of experts: 2048 tokens of width 128, 8 experts of hidden width 512, top 2,
# capacity factor 4 (no token is dropped, so every mesh computes the same outputs).
TOKENS, WIDTH, HIDDEN, EXPERTS = 2048, 128, 512, 8


def _moe_step(n):
    from spmd.parallel import moe

    mesh = spmd.make_mesh((n,), ("expert",))
    layer = spmd.shard_map(
        lambda x, r, a, b: moe(x, r, a, b, "expert", capacity_factor=4.0)[0], mesh=mesh,
        in_specs=(P("expert"), P(), P("expert"), P("expert")), out_specs=P("expert"))
    return spmd.jit(spmd.grad(lambda x, r, a, b: snp.sum(layer(x, r, a, b) ** 2),
                              argnums=(0, 1, 2, 3)))


def _experts(quick: bool) -> list[dict]:
    """The MoE layer's forward and backward with its experts split over 1, 2, 4 and 8
    simulated devices (the tokens too): time, and each device's peak memory (its share
    of the experts' weights and of the tokens)."""
    rng = np.random.default_rng(1)
    args = (rng.normal(size=(TOKENS, WIDTH)).astype(np.float32),
            (rng.normal(size=(WIDTH, EXPERTS)) * 0.1).astype(np.float32),
            (rng.normal(size=(EXPERTS, WIDTH, HIDDEN)) * 0.05).astype(np.float32),
            (rng.normal(size=(EXPERTS, HIDDEN, WIDTH)) * 0.05).astype(np.float32))
    want = None
    calls, devices = {}, {}
    for n in ((1, 8) if quick else (1, 2, 4, 8)):
        step = _moe_step(n)
        got = [np.asarray(g) for g in step(*args)]
        if want is None:
            want = got
        for a, b in zip(got, want):  # the check: the same gradients on every mesh
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-4)
        name = f"expert={n}"
        calls[name], devices[name] = (lambda f=step: f(*args)), n
    times = interleave(calls, repeats=3 if quick else 10, warmup=1, target_s=0.0)
    rows = []
    bench = f"moe fwd+bwd [{TOKENS} tokens, {EXPERTS} experts {WIDTH}x{HIDDEN}, top 2]"
    for name in calls:
        base = None if name == "expert=1" else "expert=1"
        rows.append(row(bench, name, times[name], baseline=base, unit="ms",
                        note=f"{devices[name]} simulated devices, stacked in this process"))
    for name in calls:
        base = None if name == "expert=1" else "expert=1"
        rows.append(row("moe peak memory per device, fwd+bwd", name,
                        [_peak_bytes(calls[name]) / devices[name]], baseline=base,
                        unit="MiB", note="tracemalloc peak / devices"))
    return rows
