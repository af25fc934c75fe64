"""The engine's threads (spmd/compiler/engine/threads.py) and the products they share
(spmd.compiler.ops.linalg._matmul): the products of one BLAS call to rounding (BLAS may
pick another kernel for a part than for the whole: tests/tolerance.py), each part on
one BLAS thread, BLAS's thread count put back, callers on several threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.engine import threads
from spmd.compiler.ops import linalg
from tests.tolerance import assert_product_close


def test_a_batch_of_small_products_is_shared(three_threads):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 64, 16)).astype(np.float32)
    b = rng.standard_normal((37, 16, 64)).astype(np.float32)
    assert threads.can_split()
    parts = []
    run = threads.POOL.run
    got = linalg._matmul(np, a, b)
    assert_product_close(got, a, b)
    out = np.empty_like(got)
    threads.POOL.run = lambda ps: parts.append(len(ps)) or run(ps)
    try:
        assert linalg._matmul(np, a, b, out=out) is out
    finally:
        del threads.POOL.run
    assert parts == [3]
    assert_product_close(out, a, b)


def test_jitted_attention_products_equal_numpy(three_threads):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((8, 4, 64, 16)).astype(np.float32)
    k = rng.standard_normal((8, 4, 64, 16)).astype(np.float32)
    f = spmd.jit(lambda q, k: snp.einsum("bhtd,bhsd->bhts", q, k))
    np.testing.assert_allclose(np.asarray(f(q, k)), np.einsum("bhtd,bhsd->bhts", q, k),
                               rtol=1e-5, atol=1e-5)
    assert "_pmatmul" in f.lower(q, k).compile().source or \
        "_dot_general" in f.lower(q, k).compile().source


def test_large_products_are_split_with_blas_held_to_one_thread(three_threads, monkeypatch):
    if not threads.BLAS.available():
        pytest.skip("OpenBLAS's thread count cannot be held here")
    before = threads.BLAS.count()
    seen = []
    run = threads.POOL.run

    def watch(parts):
        seen.append((len(parts), threads.BLAS.count()))
        run(parts)

    monkeypatch.setattr(threads.POOL, "run", watch)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 128, 32)).astype(np.float32)  # m n k = 524288
    b = rng.standard_normal((64, 32, 128)).astype(np.float32)
    # np.matmul would run each product on BLAS's threads: another kernel than the
    # parts' may add the terms in another order (OPENBLAS_CORETYPE=Haswell does here).
    assert_product_close(linalg._matmul(np, a, b), a, b)
    assert seen == [(3, 1)]  # shared, each part on one BLAS thread
    assert threads.BLAS.count() == before  # and BLAS's count put back


def test_single_products_and_tiny_batches_stay_one_call(three_threads, monkeypatch):
    calls = []
    monkeypatch.setattr(threads.POOL, "run", lambda parts: calls.append(len(parts)))
    big = np.ones((512, 512), np.float32)  # one product: BLAS's own threads
    linalg._matmul(np, big, big)
    small = np.ones((64, 8, 8), np.float32)  # 64 x 1 kflop: too little to share
    linalg._matmul(np, small, small)
    assert calls == []


def test_large_products_stay_one_call_where_blas_cannot_be_held(three_threads, monkeypatch):
    calls = []
    monkeypatch.setattr(threads.POOL, "run", lambda parts: calls.append(len(parts)))
    monkeypatch.setattr(threads.BLAS, "available", lambda: False)
    a = np.ones((64, 128, 32), np.float32)
    linalg._matmul(np, a, np.ones((64, 32, 128), np.float32))
    assert calls == []


def test_overlapping_holds_put_blas_count_back_once():
    if not threads.BLAS.available():
        pytest.skip("OpenBLAS's thread count cannot be held here")
    before = threads.BLAS.count()
    inside, release = threading.Event(), threading.Event()
    counts = []

    def holder():
        with threads.BLAS.one():
            inside.set()
            release.wait(60)

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(60)
    with threads.BLAS.one():  # a second caller's hold, released first
        counts.append(threads.BLAS.count())
    counts.append(threads.BLAS.count())  # the first hold still stands
    release.set()
    t.join(60)
    assert counts == [1, 1]
    assert threads.BLAS.count() == before


def test_nothing_is_shared_where_blas_threads_spin(monkeypatch):
    monkeypatch.setattr(threads, "BLAS_THREADS_YIELD", False)
    monkeypatch.setenv("SPMD_NUM_THREADS", "2")
    monkeypatch.setattr(threads.POOL, "threads", None)
    assert not threads.can_split() and not threads.threads_help()
    threads.POOL.threads = None


def test_concurrent_callers_share_the_pool(three_threads, each_on_a_thread):
    rng = np.random.default_rng(2)
    pairs = [(rng.standard_normal((40, 32, 16)).astype(np.float32),
              rng.standard_normal((40, 16, 32)).astype(np.float32)) for _ in range(5)]

    def call(k):
        a, b = pairs[k]
        for _ in range(20):
            assert_product_close(linalg._matmul(np, a, b), a, b)

    each_on_a_thread(call, len(pairs))


def test_a_failing_part_is_raised_after_every_part_finished():
    pool = threads.Pool()
    pool.threads = 3
    done = []

    def ok():
        done.append(1)

    def bad():
        raise ValueError("part failed")

    with pytest.raises(ValueError, match="part failed"):
        pool.run([ok, bad, ok])
    assert len(done) == 2


def test_the_callers_numpy_error_state_holds_in_the_workers(monkeypatch):
    """np.errstate is a context variable: each part runs in a copy of the caller's
    context, so a fused kernel raises where the unfused code would."""
    from spmd.compiler.engine import fusion

    monkeypatch.setattr(threads, "threads_help", lambda: True)
    monkeypatch.setattr(fusion, "MIN_KERNEL_NS", 0)
    monkeypatch.setattr(fusion, "BLOCK_ELEMENTS", 64)
    monkeypatch.setenv("SPMD_NUM_THREADS", "3")
    monkeypatch.setattr(threads.POOL, "threads", None)
    x = np.full((64, 512), -1.0, np.float32)
    x[:32] = 1.0  # the caller's own part (the first rows) is valid: only workers see NaN
    f = spmd.jit(lambda x: snp.log(x * 2.0) + 1.0)
    assert "fused_elementwise" in f.lower(x).as_text(executed=True)
    with np.errstate(invalid="raise"):
        with pytest.raises(FloatingPointError):
            f(x)
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.asarray(f(x))[32:]).all()
    threads.POOL.threads = None
