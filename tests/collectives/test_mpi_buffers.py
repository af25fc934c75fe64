"""The MPI backend's receive-buffer pool and its all-reduce algorithm choice.

Single-process: the pool needs no communication, and the collectives run on a
one-rank ``COMM_WORLD`` (mpi4py initialises a singleton MPI; skipped when
mpi4py is not installed).  The multi-process behaviour is covered by the MPI
suite and ``benchmarks/bench_mpi.py``.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from spmd.collectives import mpi

BIG = (mpi.POOL_MIN_BYTES // 4 + 16,)  # float32 elements: just over the pooling threshold


@pytest.fixture(autouse=True)
def empty_pool():
    mpi.clear_buffers()
    yield
    mpi.clear_buffers()


def test_small_buffers_are_not_pooled():
    a = mpi.buffers.recv_buffer((4,), np.float32)
    assert a.shape == (4,) and a.dtype == np.float32
    assert not mpi.buffers._pool


def test_a_buffer_is_reused_only_when_nothing_refers_to_it():
    a = mpi.buffers.recv_buffer(BIG, np.float32)
    b = mpi.buffers.recv_buffer(BIG, np.float32)
    assert a is not b  # a is still held here
    view = a.reshape(-1)[3:10]  # a view keeps its base alive
    a_id = id(a)
    del a
    c = mpi.buffers.recv_buffer(BIG, np.float32)
    assert id(c) != a_id and c is not b
    del view
    d = mpi.buffers.recv_buffer(BIG, np.float32)
    assert id(d) == a_id  # now free: reused


def test_results_of_earlier_calls_are_never_overwritten():
    kept = []
    for i in range(mpi.POOL_PER_SHAPE + 3):
        buf = mpi.buffers.recv_buffer(BIG, np.float32)
        buf[...] = i
        kept.append(buf)
    for i, buf in enumerate(kept):
        assert np.all(buf == i)
    assert len(mpi.buffers._pool[(BIG, np.dtype(np.float32))]) == mpi.POOL_PER_SHAPE


def test_distinct_shapes_and_dtypes_get_distinct_buffers():
    a = mpi.buffers.recv_buffer(BIG, np.float32)
    b = mpi.buffers.recv_buffer(BIG, np.int32)
    c = mpi.buffers.recv_buffer((BIG[0] * 2,), np.float32)
    assert len({id(a), id(b), id(c)}) == 3
    assert (b.dtype, c.shape) == (np.int32, (BIG[0] * 2,))


needs_mpi4py = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                                  reason="mpi4py is not installed")


@needs_mpi4py
@pytest.mark.parametrize("split", [False, True])
def test_allreduce_on_one_rank(monkeypatch, split):
    # With a one-rank world every algorithm must return the input itself.
    monkeypatch.setattr(mpi.communicators, "split_bytes", lambda: 0 if split else 1 << 62)
    x = np.arange(np.prod(BIG), dtype=np.float32).reshape(BIG)
    first = mpi.allreduce(x, (0,), "sum")
    np.testing.assert_array_equal(first, x)
    second = mpi.allreduce(x + 1, (0,), "sum")
    np.testing.assert_array_equal(first, x)  # the first result is untouched
    np.testing.assert_array_equal(second, x + 1)


@needs_mpi4py
def test_collectives_on_one_rank_return_fresh_results():
    x = np.arange(np.prod(BIG), dtype=np.float32).reshape(BIG)
    g1 = mpi.allgather(x, (0,))
    g2 = mpi.allgather(x * 2, (0,))
    np.testing.assert_array_equal(g1[0], x)
    np.testing.assert_array_equal(g2[0], x * 2)
    t1 = mpi.alltoall(x.reshape(1, -1), (0,))
    t2 = mpi.alltoall(x.reshape(1, -1) * 3, (0,))
    np.testing.assert_array_equal(t1[0], x)
    np.testing.assert_array_equal(t2[0], x * 3)
    r1 = mpi.reduce_scatter(x.reshape(1, -1), (0,))
    np.testing.assert_array_equal(r1, x)


HUGE = (mpi.HUGE_BYTES // 4 + 8,)  # float32 elements: an aligned buffer


def test_large_buffers_start_on_a_huge_page_boundary():
    a = mpi.buffers.recv_buffer(HUGE, np.float32)
    assert a.shape == HUGE and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.__array_interface__["data"][0] % mpi.HUGE_BYTES == 0


def test_a_large_buffer_is_reused_only_when_no_view_of_it_is_left():
    # The pool keeps the memory owner; a result is a view of it, and so is any view
    # the caller takes of the result: each keeps the owner alive.
    a = mpi.buffers.recv_buffer(HUGE, np.float32)
    a[...] = 1.0
    view = a.reshape(-1)[5:9]
    addr = a.__array_interface__["data"][0]
    del a
    b = mpi.buffers.recv_buffer(HUGE, np.float32)
    assert b.__array_interface__["data"][0] != addr  # `view` still holds the memory
    b[...] = 2.0
    assert np.all(view == 1.0)
    del view
    c = mpi.buffers.recv_buffer(HUGE, np.float32)
    assert c.__array_interface__["data"][0] == addr  # now free: reused
    assert np.all(b == 2.0)


def test_large_results_of_earlier_calls_are_never_overwritten():
    kept = []
    for i in range(mpi.POOL_PER_SHAPE + 2):
        buf = mpi.buffers.recv_buffer(HUGE, np.float32)
        buf[...] = i
        kept.append(buf)
    for i, buf in enumerate(kept):
        assert np.all(buf == i)
