"""benchmarks/parallel_pictures.py: the pictures of docs/parallelism.md are drawn from
the traced programs (the collectives and their sizes are read, not typed), and the
script writes one PNG per axis."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks"))

pytest.importorskip("matplotlib")
import parallel_pictures as pp  # noqa: E402


def test_the_collectives_are_read_from_the_programs():
    _, _, _, ring = pp.ring()
    # k and v each pass around the ring: 2 (n - 1) sends of a (B, H, S/n, D) block.
    assert ring == [("ppermute", (1, 4, 256, 64), ring[0][2],
                     tuple((i, (i + 1) % pp.N) for i in range(pp.N)), 2 * (pp.N - 1))]
    _, _, _, experts = pp.experts()
    assert [c[0] for c in experts].count("all_to_all") == 1
    assert next(c for c in experts if c[0] == "all_to_all")[4] == 2  # dispatch, combine
    _, _, holds, pipe = pp.pipe()
    sends = sorted(c[4] for c in pipe if c[0] == "ppermute")
    # 1F1B's M + 2 (S - 1) = 14 ticks move activations in the 11 where some stage
    # receives one (not in the drain's last 3), cotangents in 10 (not in the fill's 4)
    assert sends == [10, 11]
    assert holds[2][1][0] == 5  # 1F1B keeps 2 (S - 1 - s) + 1 inputs: 5 on stage 1


def test_the_script_writes_a_picture_per_axis(tmp_path):
    assert pp.main(["--out", str(tmp_path)]) == 0
    for axis in ("seq", "expert", "pipe"):
        path = tmp_path / f"parallel_{axis}.png"
        assert path.stat().st_size > 10_000
