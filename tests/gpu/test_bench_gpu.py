"""``benchmarks/bench_gpu.py`` on the CuPy and NCCL stand-ins: its plumbing (the
psum through a process group lowered to ``nccl``, the hand-written CuPy step,
the data-parallel step on 8 simulated devices, and the checks each makes
against numpy before timing) runs here on small sizes, so that the GPU
session's one run does not fail on a mistake the CPU could have shown.
The timings themselves mean nothing on the stand-in and are not looked at.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks")


@pytest.fixture
def bench_gpu(fake_gpu, runtime_env):
    runtime_env(FAKE_CUPY_NCCL="1")
    fake_gpu.install()
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    module = importlib.import_module("bench_gpu")
    assert module.skip_reason() is None
    return module


def test_psum_rows(bench_gpu):
    rows = bench_gpu._bench_psum(1, 1.10, repeats=2)
    assert [r["variant"] for r in rows] == ["raw NCCL", "spmd psum"]
    assert all(len(r["times_s"]) == 2 and min(r["times_s"]) > 0 for r in rows)


def test_train_step_rows(bench_gpu):
    rows = bench_gpu._bench_step(64, 1.15, repeats=2)
    variants = [r["variant"] for r in rows]
    assert variants[:2] == ["cupy", "spmd.jit"]
    assert variants[2:] in ([], ["jax.jit"])  # jax.jit where JAX has a GPU


def test_data_parallel_rows(bench_gpu):
    rows = bench_gpu._bench_dp(repeats=2, batch=64)
    assert [r["variant"] for r in rows] == ["1 device", "8 devices, grad outside",
                                            "8 devices, grad inside"]


def test_nccl_missing_is_an_error_when_required(bench_gpu, runtime_env, fake_gpu):
    runtime_env(FAKE_CUPY_NCCL=None, SPMD_REQUIRE_NCCL="1")
    fake_gpu.install()  # without NCCL now
    with pytest.raises(RuntimeError, match="cannot load NCCL.*SPMD_REQUIRE_NCCL=1"):
        bench_gpu.run(quick=True)
