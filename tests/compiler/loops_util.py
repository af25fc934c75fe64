"""Helpers of the compiled loops' tests (row kernels, elementwise loops)."""

from __future__ import annotations

import numpy as np

import spmd


def unfused(fn, *args):
    """``fn`` jitted and called with compiled loops off: the numpy program."""
    spmd.config.update("compile_kernels", False)
    try:
        return spmd.jit(fn)(*args)
    finally:
        spmd.config.update("compile_kernels", True)


def close(got, want, rtol: float, atol: float) -> None:
    """Each leaf of ``got`` within ``rtol`` of ``want``'s, or within ``atol`` times its
    array's largest finite magnitude (a gradient that cancels); the same dtypes,
    shapes and NaNs."""
    for g, w in zip(spmd.tree_util.tree_leaves(got), spmd.tree_util.tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        finite = w[np.isfinite(w)]
        scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale, equal_nan=True)


def counted_runs(monkeypatch, runner_class) -> list:
    """The kernels whose compiled loop ``runner_class.run`` ran, in order."""
    calls = []
    run = runner_class.run

    def counted(self, loop, args, out=None):
        calls.append(self.kernel)
        return run(self, loop, args, out)

    monkeypatch.setattr(runner_class, "run", counted)
    return calls
