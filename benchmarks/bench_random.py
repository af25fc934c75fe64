"""spmd.random against numpy's generator: 16M float32 standard normals, and 16M uint32 bits.

Measured (in one process, variants interleaved):

- ``normal[16M f32]``: ``spmd.jit(lambda k: random.normal(k, (2**24,)))`` (JAX's
  bits: Threefry-2x32 counters, mantissa recipe, ``sqrt(2) * erf_inv``) against
  ``numpy.random.default_rng().standard_normal(2**24, dtype=np.float32)``
  (ziggurat on PCG64); goal: ratio <= 4 (issue 13);
- ``bits[16M u32]`` (diagnostic): ``random.bits`` against numpy's ``integers``
  of uint32: the cost of Threefry's 20 rounds alone;
- ``normal[16M f32] numpy rounds`` (diagnostic, quick runs skip it): the same
  normals when the compiled kernel is unavailable (``SPMD_RANDOM_NATIVE=0``).

Run it alone with ``python benchmarks/run.py random``.
"""

from __future__ import annotations

import numpy as np

from common import interleave, row

import spmd
from spmd import random as sr
from spmd.compiler.ops import threefry_native

N = 2 ** 24


def run(quick: bool = False) -> list[dict]:
    k = sr.key(0)
    normal = spmd.jit(lambda k: sr.normal(k, (N,)))
    bits = spmd.jit(lambda k: sr.bits(k, (N,)))
    rng = np.random.default_rng(0)
    # The check: the draws are standard normals and the bits JAX's (first words).
    x = np.asarray(normal(k))
    assert x.dtype == np.float32 and abs(x.mean()) < 1e-3 and abs(x.std() - 1) < 1e-3
    assert np.asarray(bits(sr.key(42)))[:2].tolist() == [2098992034, 2919706841]
    native = threefry_native.kernel() is not None
    repeats = 3 if quick else 12
    times = interleave({
        "numpy": lambda: rng.standard_normal(N, dtype=np.float32),
        "spmd": lambda: normal(k),
        "numpy bits": lambda: rng.integers(0, 2**32, N, dtype=np.uint32),
        "spmd bits": lambda: bits(k),
    }, repeats=repeats, warmup=1, target_s=0.0)
    rows = [
        row("normal[16M f32]", "numpy", times["numpy"], unit="ms",
            note="default_rng().standard_normal(dtype=float32)"),
        row("normal[16M f32]", "spmd.random", times["spmd"], baseline="numpy", goal_ratio=4.0,
            unit="ms", note=f"jit(normal), Threefry-2x32 ({'C kernel' if native else 'numpy'})"),
        row("bits[16M u32]", "numpy", times["numpy bits"], unit="ms",
            note="default_rng().integers(0, 2**32, dtype=uint32) (diagnostic)"),
        row("bits[16M u32]", "spmd.random", times["spmd bits"], baseline="numpy", unit="ms",
            note="jit(bits) (diagnostic)"),
    ]
    if not quick and native:
        saved = list(threefry_native._lib)
        threefry_native._lib[:] = [None]
        try:
            slow = spmd.jit(lambda k: sr.normal(k, (N,)) + 0.0)
            t = interleave({"slow": lambda: slow(k)}, repeats=3, warmup=1, target_s=0.0)
        finally:
            threefry_native._lib[:] = saved
        rows.append(row("normal[16M f32]", "spmd.random numpy rounds", t["slow"],
                        baseline="numpy", unit="ms",
                        note="without the compiled kernel (diagnostic)"))
    return rows


if __name__ == "__main__":
    import sys

    from common import summarize, table

    print(table(summarize(run(quick="--quick" in sys.argv))))
