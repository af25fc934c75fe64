"""Fixtures shared by the compiler's tests."""

from __future__ import annotations

import threading

import pytest


@pytest.fixture
def three_threads(monkeypatch):
    """The engine on 3 threads, sharing BLAS work among them (OpenBLAS's threads
    sleeping between calls), whatever the environment says; skipped where numpy's BLAS
    is not OpenBLAS, on which the engine shares no BLAS work."""
    from spmd.compiler.engine import threads

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


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """A private folder for the compiled loops' cache (SPMD_CACHE_DIR)."""
    return str(tmp_path_factory.mktemp("spmd-cache"))


@pytest.fixture
def loops_at_once(monkeypatch, kernel_cache):
    """Compiled loops (spmd.compiler.engine.loops) used from a call site's first call: compiled
    then, waited for, and switched to at once; a private kernel cache.  Skipped without
    numba."""
    pytest.importorskip("numba", reason="compiled loops need numba")
    from spmd.compiler.engine import loops

    monkeypatch.setenv("SPMD_CACHE_DIR", kernel_cache)
    monkeypatch.setattr(loops, "COMPILE_AFTER", 1)
    monkeypatch.setattr(loops, "SWITCH_AT", 1)


@pytest.fixture
def no_compiler(monkeypatch):
    """Every compiled loop's compilation fails ("no compiler today"), warnings and
    compilations not seen before (the numpy code must keep running)."""
    from spmd.compiler.engine import loops

    def broken(src, prefix):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(loops, "_load", broken)
    monkeypatch.setattr(loops, "_warned", [])
    monkeypatch.setattr(loops, "_compiled", {})
