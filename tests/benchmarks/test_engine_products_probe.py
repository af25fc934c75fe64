"""benchmarks/engine_products_probe.py runs (a diagnostic, nothing saved): its line
names the step and the three product times (in the step, repeated, caches flushed).
In a subprocess: the probe wraps the code generator of its process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_prints_its_three_product_times():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_products_probe.py"),
                          "--config", "small", "--mesh", "1x1", "--steps", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # 27 dot_generals: per layer 4 forward and 8 backward, 3 for the logits; attention's
    # own products are inside its kernel (spmd.compiler.ops.attention).
    assert re.search(r"small 1x1: step [\d.]+ ms; its 27 products: in the step [\d.]+ ms, "
                     r"repeated [\d.]+ ms, caches flushed [\d.]+ ms", out.stdout), out.stdout
