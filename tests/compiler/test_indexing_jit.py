"""The scatter-add of rows as a compiled loop (spmd/compiler/ops/indexing_jit.py): an
embedding's gradient equals numpy's sorted sums within rounding; the scatters it does
not serve (other modes, axes, out-of-bounds indices) keep numpy's code and bits."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.ops import indexing, indexing_jit


@pytest.fixture
def ran(loops_at_once, monkeypatch):
    """How many calls ran the compiled loop."""
    calls = []
    real = indexing_jit.Runner.__call__

    def spy(self, *args):
        before = self.tier.done
        out = real(self, *args)
        calls.append(before is not None or self.tier.done is not None)
        return out

    monkeypatch.setattr(indexing_jit.Runner, "__call__", spy)
    return calls


def _numpy(x, updates, *idx, axes, mode="add"):
    return indexing._scatter_impl(np, x, updates, *idx, axes=axes, mode=mode)


@pytest.mark.parametrize("dtype,idtype", [(np.float32, np.int32), (np.float64, np.int64)])
def test_an_embedding_gradient_equals_the_sorted_sums(ran, dtype, idtype):
    spmd.config.update("enable_x64", dtype == np.float64)
    try:
        rng = np.random.default_rng(0)
        table = rng.standard_normal((13, 8)).astype(dtype)
        ids = rng.integers(0, 13, (6, 50)).astype(idtype)  # many repeats
        ct = rng.standard_normal((6, 50, 8)).astype(dtype)
        g = spmd.jit(spmd.grad(lambda t, i, c: snp.sum(t[i] * c)))(table, ids, ct)
        assert any(ran)
        want = _numpy(np.zeros_like(table), ct, ids, axes=(0,))
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5 if dtype == np.float32
                                   else 1e-12, atol=1e-6)
    finally:
        spmd.config.update("enable_x64", False)


def test_leading_axes_together_and_what_stays_numpy(loops_at_once):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 7, 5)).astype(np.float32)
    i0 = rng.integers(0, 2, (40,)).astype(np.int32)
    i1 = rng.integers(0, 7, (40,)).astype(np.int32)
    upd = rng.standard_normal((40, 5)).astype(np.float32)
    run = indexing.scatter_p.rules.bind_impl(np, axes=(0, 1), mode="add")
    got = run(x, upd, i0, i1)
    np.testing.assert_allclose(got, _numpy(x, upd, i0, i1, axes=(0, 1)), rtol=1e-5, atol=1e-6)
    assert run.tier.done is not None
    np.testing.assert_array_equal(x, np.asarray(x))  # (its input untouched: a copy)
    # An index out of bounds: numpy drops that update; the same bits as numpy's.
    bad = i1.copy()
    bad[3] = 7
    np.testing.assert_array_equal(run(x, upd, i0, bad), _numpy(x, upd, i0, bad, axes=(0, 1)))
    # Other modes and axes: numpy.
    for axes, mode in (((1, 0), "add"), ((0, 1), "max"), ((0, 1), "set")):
        other = indexing.scatter_p.rules.bind_impl(np, axes=axes, mode=mode)
        ids = (i1 % 2, i0) if axes == (1, 0) else (i0, i1)
        np.testing.assert_array_equal(other(x, upd, *ids),
                                      _numpy(x, upd, *ids, axes=axes, mode=mode))
        assert other.tier.done is None
