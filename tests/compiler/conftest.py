"""Fixtures shared by the compiler's tests."""

from __future__ import annotations

import threading

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


@pytest.fixture
def each_on_a_thread():
    """``run(call, n)``: ``call(k)`` for k in ``range(n)``, each on its own thread, all
    at once; the first failure is raised on the caller's thread, and a thread still
    running after 120 s fails the test (a hang fails fast)."""

    def run(call, n):
        errors = []

        def guarded(k):
            try:
                call(k)
            except Exception as e:  # reported below, on the main thread
                errors.append(e)

        ts = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in ts), "a caller's thread still runs"
        if errors:
            raise errors[0]

    return run
