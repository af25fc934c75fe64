"""Fixtures shared by the compiler's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def three_threads(monkeypatch):
    """The engine on 3 threads, sharing BLAS work among them (OpenBLAS's threads
    sleeping between calls), whatever the environment says; skipped where numpy's BLAS
    is not OpenBLAS, on which the engine shares no BLAS work."""
    from spmd.compiler import threads

    if not threads.blas_is_openblas():
        pytest.skip("numpy's BLAS is not OpenBLAS: the engine shares no BLAS work among "
                    "threads")
    monkeypatch.setattr(threads, "BLAS_THREADS_YIELD", True)
    monkeypatch.setenv("SPMD_NUM_THREADS", "3")
    monkeypatch.setattr(threads.POOL, "threads", None)
    yield
    threads.POOL.threads = None
