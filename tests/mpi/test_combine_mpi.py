"""Collective combining, overlap and scalar folding under MPI: a data-parallel step in
the two forms users write (benchmarks/dp_step.py) gives the same loss, gradients and
parameters, bit for bit, with and without combining (spmd.config.
combine_collectives_bytes) and overlap (spmd.config.overlap_bucket_bytes), and its
per-process program shows the combined all-reduces and their nonblocking starts and
waits.  Oracle: the program with neither, and numpy on the global batch."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import dp_step  # noqa: E402
import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import P, lax  # noqa: E402
from spmd.config import config  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

SIZES = (12, 8, 8, 3)
LR = 0.1


def make_steps(mesh):
    """Fresh jitted steps (compiled with the settings current at their first call):
    ``{form: step}`` returning (new params, grads, loss)."""
    return dp_step.make_steps(mesh, "i", lr=LR, with_grads=True)


@pytest.fixture
def bucket():
    old = config.combine_collectives_bytes
    yield lambda n: config.update("combine_collectives_bytes", n)
    config.update("combine_collectives_bytes", old)


@pytest.fixture
def overlap():
    old = config.overlap_bucket_bytes
    yield lambda n: config.update("overlap_bucket_bytes", n)
    config.update("overlap_bucket_bytes", old)


def _leaves(tree):
    return [np.asarray(v) for v in spmd.tree_util.tree_leaves(tree)]


def _combined_lines(text):
    return [ln for ln in text.splitlines() if "combined (" in ln and "collective_wait" not in ln]


@pytest.mark.parametrize("form", ["grad outside", "grad inside"])
def test_combined_step_equals_the_uncombined_one(form, bucket, overlap):
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    params = dp_step.make_params(SIZES)
    x, y = dp_step.make_batch(4 * n, SIZES)
    bucket(0)
    plain = make_steps(mesh)[form]
    text = plain.lower(params, x, y).as_text(executed=True)
    assert "combined" not in text and "collective_start" not in text
    want = _leaves(plain(params, x, y))
    # numpy oracle: the gradient of the mean loss over the global batch.
    want_loss = float(spmd.jit(dp_step.local_loss)(params, x, y))
    np.testing.assert_allclose(want[-1], want_loss, rtol=1e-5)
    for limit, over in ((1 << 25, 0), (400, 0), (1 << 25, 1 << 21), (1 << 25, 400)):
        bucket(limit)
        overlap(over)
        step = make_steps(mesh)[form]
        text = step.lower(params, x, y).as_text(executed=True)
        combined = _combined_lines(text)
        starts = [ln for ln in text.splitlines() if "collective_start[" in ln]
        waits = [ln for ln in text.splitlines() if "collective_wait[" in ln]
        if over == 0:
            assert not starts and not waits, text
        else:  # every start has its wait, after it
            assert starts and len(starts) == len(waits), text
            for ln in starts:
                tag = ln.split("tag=")[1].split("]")[0]
                assert text.index(ln) < text.index(f"collective_wait[tag={tag},"), text
        if (limit, over) == (1 << 25, 0):
            # everything in one all-reduce: 6 gradients and the loss (in both forms:
            # with the gradient outside, the forward and backward shard_maps run
            # partitioned as one per-process program)
            assert len(combined) == 1 and "x7 combined" in combined[0], text
        elif over == 1 << 21:  # the step is tiny: one bucket, started without waiting
            assert len(starts) == 1 and "x7 combined" in starts[0], text
        else:  # a small bucket: several calls, no combined one over the limit
            calls = [ln for ln in text.splitlines()
                     if "kind='allreduce'" in ln and "collective_wait" not in ln]
            assert len(calls) >= 2 and combined, text
            assert all(int(ln.split("combined (")[1].split(" bytes")[0]) <= 400
                       for ln in combined)
        got = _leaves(step(params, x, y))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_a_ppermute_some_ranks_skip_keeps_every_rank_combining_alike(bucket):
    """Ranks outside a ppermute's pairs still issue its (empty) exchange: every rank's
    program has the same collectives in the same order, so combining groups them the
    same way everywhere (else ranks would all-reduce buffers of different sizes)."""
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal((n, 3)).astype(np.float32) for _ in range(3))

    def body(a, b, c):
        s1 = lax.psum(a, "i")
        t = lax.ppermute(s1 * 2.0, "i", perm=[(0, 1)])  # ranks >= 2 take no part
        return s1, lax.psum(b + t, "i"), lax.psum(c, "i")

    def make():
        return spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=(P("i"),) * 3,
                                       out_specs=(P(), P(), P()), check_vma=False))

    bucket(1 << 25)
    got = [np.asarray(v) for v in make()(a, b, c)]
    s1 = a.sum(0, keepdims=True)
    shifted = np.zeros_like(b)
    shifted[1] = 2 * s1[0]
    np.testing.assert_allclose(got[0], s1, rtol=1e-6)
    np.testing.assert_allclose(got[1], (b + shifted).sum(0, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(got[2], c.sum(0, keepdims=True), rtol=1e-6)
    bucket(0)
    for g, w in zip(got, make()(a, b, c)):
        np.testing.assert_array_equal(g, np.asarray(w))


@pytest.mark.parametrize("size, dtype", [(1000, np.float32), (1 << 20, np.float32),
                                         (4096, np.float16)])
def test_iallreduce_sums_over_the_ranks(size, dtype):
    """Started, tested, waited: small (one Iallreduce), from 2 MiB (reduce-scatter
    started, all-gather in the wait), and a type MPI reduces in a wider one."""
    from spmd.collectives import mpi

    n, me = spmd.process_count(), spmd.process_index()
    x = (np.arange(size) % 7 * (me + 1)).astype(dtype)
    req = mpi.iallreduce(x, tuple(range(n)), "sum", what="psum")
    req.test()
    got = req.wait()
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, (np.arange(size) % 7 * (n * (n + 1) // 2)).astype(dtype))


def test_a_large_gradient_overlaps_as_its_own_bucket(overlap):
    """A member larger than the bucket (here 2.4 MiB) is a bucket of its own, started as
    a reduce-scatter whose all-gather runs in the wait.  Results equal the blocking
    ones, bit for bit on 2 ranks; on more, MPI's nonblocking reduce-scatter may add the
    ranks' values in another order than its blocking one (last-bit differences), but
    every rank holds the same bits."""
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4 * n, 600)).astype(np.float32)
    w = rng.standard_normal((600, 1024)).astype(np.float32) / 30

    def body(a, w):
        g_big = a.T @ snp.tanh(a @ w)          # 600 x 1024 float32: 2.4 MiB
        g_small = snp.tanh(a @ w) @ w.T        # runs while the big one travels
        return lax.psum(g_big, "i") * 0.5, lax.psum(g_small, "i")

    def make():
        return spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=(P("i"), P()),
                                       out_specs=(P(), P()), check_vma=False))

    overlap(0)
    want = [np.asarray(v) for v in make()(a, w)]
    overlap(1 << 21)
    step = make()
    text = step.lower(a, w).as_text(executed=True)
    assert text.count("collective_start[") == 2, text
    got = [np.asarray(v) for v in step(a, w)]
    for g, v in zip(got, want):
        if n == 2:
            np.testing.assert_array_equal(g, v)
        else:
            np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-6)
    import hashlib

    from mpi4py import MPI

    digests = MPI.COMM_WORLD.allgather([hashlib.sha1(g.tobytes()).hexdigest() for g in got])
    assert all(d == digests[0] for d in digests)


def test_a_request_dropped_before_its_wait_keeps_its_buffers():
    """A program that raises between a start and its wait drops the request: its buffers
    are kept (MPI may still write them), not freed under MPI's feet."""
    from spmd.collectives import mpi

    n = spmd.process_count()
    req = mpi.iallreduce(np.ones(1000, np.float32), tuple(range(n)), "sum", what="psum")
    kept = len(mpi.nonblocking._abandoned)
    del req
    assert len(mpi.nonblocking._abandoned) == kept + 1
    raw, out, _ = mpi.nonblocking._abandoned.pop()
    raw.Wait()  # (every rank completes it, so the next test's collectives pair up)
    np.testing.assert_array_equal(out, np.full(1000, n, np.float32))
