"""Collective combining and scalar folding under MPI: a data-parallel step in the two
forms users write gives the same loss, gradients and parameters with and without
combining (spmd.config.combine_collectives_bytes), and its per-process program
shows one combined all-reduce.  Oracle: the uncombined program, and numpy on the
global batch."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import P, lax  # noqa: E402
from spmd.config import config  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

SIZES = (12, 8, 8, 3)
LR = 0.1


def make_params():
    rng = np.random.default_rng(0)
    return [((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
             (0.1 * rng.standard_normal(b)).astype(np.float32))
            for a, b in zip(SIZES[:-1], SIZES[1:])]


def make_batch(rows):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, SIZES[0])).astype(np.float32)
    return x, np.eye(SIZES[-1], dtype=np.float32)[rng.integers(0, SIZES[-1], rows)]


def local_loss(params, x, y):
    for w, b in params[:-1]:
        x = snp.tanh(x @ w + b)
    w, b = params[-1]
    return -snp.mean(snp.sum(y * spmd.nn.log_softmax(x @ w + b), axis=-1))


def sgd(params, grads):
    return [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, grads)]


def make_steps(mesh):
    """Fresh jitted steps (compiled with the combining setting current at their first
    call): ``{form: step}`` returning (new params, grads, loss)."""
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                       out_specs=P())
    def loss(params, x, y):
        return lax.pmean(local_loss(params, x, y), "i")

    @spmd.jit
    def outside(params, x, y):
        value, grads = spmd.value_and_grad(loss)(params, x, y)
        return sgd(params, grads), grads, value

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                       out_specs=(P(), P(), P()), check_vma=False)
    def inside(params, x, y):
        value, grads = spmd.value_and_grad(local_loss)(params, x, y)
        grads = [(lax.pmean(gw, "i"), lax.pmean(gb, "i")) for gw, gb in grads]
        return sgd(params, grads), grads, lax.pmean(value, "i")

    return {"grad outside": outside, "grad inside": inside}


@pytest.fixture
def bucket():
    old = config.combine_collectives_bytes
    yield lambda n: config.update("combine_collectives_bytes", n)
    config.update("combine_collectives_bytes", old)


def _leaves(tree):
    return [np.asarray(v) for v in spmd.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("form", ["grad outside", "grad inside"])
def test_combined_step_equals_the_uncombined_one(form, bucket):
    n = spmd.device_count()
    mesh = spmd.make_mesh((n,), ("i",))
    params = make_params()
    x, y = make_batch(4 * n)
    bucket(0)
    plain = make_steps(mesh)[form]
    assert "combined" not in plain.lower(params, x, y).as_text(executed=True)
    want = _leaves(plain(params, x, y))
    # numpy oracle: the gradient of the mean loss over the global batch.
    want_loss = float(spmd.jit(local_loss)(params, x, y))
    np.testing.assert_allclose(want[-1], want_loss, rtol=1e-5)
    for limit, calls in ((1 << 25, 1), (400, None)):
        bucket(limit)
        step = make_steps(mesh)[form]
        text = step.lower(params, x, y).as_text(executed=True)
        combined = [ln for ln in text.splitlines() if "combined (" in ln]
        if calls is not None:  # everything in one all-reduce: 6 gradients and the loss
            # (in both forms: with the gradient outside, the forward and backward
            # shard_maps run partitioned as one per-process program)
            assert len(combined) == calls and "x7 combined" in combined[0], text
        else:  # a small bucket: several calls, no combined one over the limit
            calls = [ln for ln in text.splitlines() if "mpi[kind='allreduce'" in ln]
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
