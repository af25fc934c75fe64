"""Fixtures that reconfigure the runtime (platform, array module) for one test.

- ``runtime_env(**env)`` sets (value) or unsets (None) environment variables and
  makes spmd decide its platform and array module again; the test's end
  restores both.
- ``fake_gpu`` runs the test on :mod:`tests.gpu.fake_cupy` as if it were CuPy on
  one GPU (``SPMD_PLATFORM=gpu``): the GPU code paths, on the CPU.
- ``gpu`` runs the test on the real CuPy and GPU, and skips it (with the reason)
  where there is none (``SPMD_GPU_TESTS_ON_FAKE=1``: on the stand-in instead).
  With ``SPMD_REQUIRE_GPU_TESTS=1`` (``benchmarks/gpu_check.sh`` sets it on the
  GPU machine) a missing CuPy, GPU or NCCL fails the test instead: a GPU check
  that skipped its tests must not read as a pass.
"""

from __future__ import annotations

import os

import pytest


def _reset():
    from spmd.collectives import nccl
    from spmd.mesh.devices import reset_for_tests

    reset_for_tests()  # devices, platform and array module: decided again on next use
    nccl._communicators.clear()  # (the stand-in's communicators: nothing to release)
    nccl._tables.cache_clear()


@pytest.fixture
def runtime_env(monkeypatch):
    def configure(**env):
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))
        _reset()

    yield configure
    monkeypatch.undo()
    _reset()


@pytest.fixture
def fake_gpu(monkeypatch, runtime_env):
    from tests.gpu import fake_cupy

    runtime_env(SPMD_PLATFORM="gpu", SPMD_GPU_BACKEND=None, FAKE_CUPY_GPUS="1",
                FAKE_CUPY_NCCL=None)  # no NCCL unless a test installs it
    fake_cupy.install()
    try:
        _reset()
        yield fake_cupy
    finally:
        fake_cupy.uninstall()
        _reset()


def missing(reason: str):
    """Skip the test, or fail it where the GPU tests are required (SPMD_REQUIRE_GPU_TESTS=1)."""
    if os.environ.get("SPMD_REQUIRE_GPU_TESTS") == "1":
        pytest.fail(f"{reason} (SPMD_REQUIRE_GPU_TESTS=1: the GPU tests must run)")
    pytest.skip(reason)


def gpu_or_skip():
    """CuPy, when it is installed and sees a GPU; else the test is skipped (or failed)."""
    try:
        import cupy
    except ImportError as e:
        missing(f"CuPy is not installed (no GPU tests here): {e}")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001 - CUDA's own error types
        missing(f"CuPy sees no GPU ({type(e).__name__}: {e})")
    if count < 1:
        missing("CuPy sees no GPU")
    return cupy


@pytest.fixture
def gpu(runtime_env):
    if os.environ.get("SPMD_GPU_TESTS_ON_FAKE") == "1":
        # A developer's check of the GPU tests themselves, without a GPU: run them on
        # the stand-in (FAKE_CUPY_NCCL=1 adds its NCCL).
        from tests.gpu import fake_cupy

        fake_cupy.install()
        try:
            runtime_env(SPMD_PLATFORM="gpu", FAKE_CUPY_GPUS="1")
            yield fake_cupy
        finally:
            fake_cupy.uninstall()
            _reset()
        return
    cupy = gpu_or_skip()
    runtime_env(SPMD_PLATFORM="gpu")
    yield cupy
