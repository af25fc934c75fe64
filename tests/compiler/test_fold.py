"""Scalar folding (spmd/compiler/passes/fold.py): ``(x op1 k1) op2 k2`` becomes one operation
only where that is bit-identical; the oracle is numpy doing both operations."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spmd
from spmd import P, lax
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.passes.fold import fold_scalar_chains
from spmd.compiler.passes.pipeline import dce, optimize
from spmd.compiler.core.trace import trace_to_program


def data(dtype=np.float32, shape=(64, 33)):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-30, 30, shape))
    return x.astype(dtype)


def scale_ops(fn, x):
    text = spmd.jit(fn).lower(x).as_text()
    return [ln.split("=")[1].split()[0] for ln in text.splitlines()
            if "= mul" in ln or "= div" in ln]


def check(fn, want_fn, x, n_ops):
    got = np.asarray(spmd.jit(fn)(x))
    np.testing.assert_array_equal(got, want_fn(x))  # bit for bit
    assert len(scale_ops(fn, x)) == n_ops, spmd.jit(fn).lower(x).as_text()


F = np.float32


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_pmean_then_learning_rate_is_one_multiply(n):
    x = data()
    check(lambda g: 0.01 * (g / float(n)), lambda g: F(0.01) * (g / F(n)), x, 1)
    assert scale_ops(lambda g: (g / float(n)) * 0.01, x) == ["mul"]


def test_power_of_two_on_either_side_and_longer_chains():
    x = data()
    check(lambda v: v * 0.1 * 4.0, lambda v: v * F(0.1) * F(4), x, 1)
    check(lambda v: v / 3.0 / 2.0, lambda v: v / F(3) / F(2), x, 1)
    check(lambda v: v / 3.0 * 0.5, lambda v: v / F(3) * F(0.5), x, 1)
    check(lambda v: v * 0.5 / 3.0, lambda v: v * F(0.5) / F(3), x, 1)
    check(lambda v: v / 2.0 * 0.1 * 4.0, lambda v: v / F(2) * F(0.1) * F(4), x, 1)
    assert scale_ops(lambda v: v / 3.0 / 2.0, x) == ["div"]


def test_float64_folds_too():
    x = data(np.float64)
    with _x64():
        check(lambda v: (v / 8.0) * 0.01, lambda v: (v / 8.0) * 0.01, x, 1)


class _x64:
    def __enter__(self):
        self.old = spmd.config.enable_x64
        spmd.config.update("enable_x64", True)

    def __exit__(self, *exc):
        spmd.config.update("enable_x64", self.old)


def test_inexact_pairs_are_left_alone():
    x = data()
    # neither constant a power of two: folding would change the last bit
    check(lambda v: (v / 3.0) * 0.01, lambda v: (v / F(3)) * F(0.01), x, 2)
    check(lambda v: v * 0.1 * 0.3, lambda v: v * F(0.1) * F(0.3), x, 2)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_overflowing_or_underflowing_constants_are_left_alone():
    x = np.array([1e-30, 1.0, 3.0], np.float32)
    check(lambda v: v * 1e30 * 2.0 ** 100, lambda v: v * F(1e30) * F(2.0 ** 100), x, 2)
    check(lambda v: v * 1e-30 * 2.0 ** -100, lambda v: v * F(1e-30) * F(2.0 ** -100), x, 2)


def test_shared_or_returned_intermediates_are_not_folded():
    x = data()

    def shared(v):
        h = v / 8.0
        return h * 0.01 + h

    check(shared, lambda v: (v / F(8)) * F(0.01) + v / F(8), x, 2)

    def returned(v):
        h = v / 8.0
        return h, h * 0.01

    got = spmd.jit(returned)(x)
    np.testing.assert_array_equal(np.asarray(got[1]), (x / F(8)) * F(0.01))
    assert len(scale_ops(returned, x)) == 2


def test_integers_are_never_folded():
    x = np.arange(-50, 50, dtype=np.int32)
    closed = trace_to_program(lambda v: [v * 3 * 2], [ShapedArray((100,), np.dtype(np.int32))])
    assert fold_scalar_chains(closed) is closed
    np.testing.assert_array_equal(np.asarray(spmd.jit(lambda v: v * 3 * 2)(x)), x * 6)


def test_the_fold_leaves_the_inner_equation_to_dce():
    closed = trace_to_program(lambda v: [(v / 4.0) * 0.1],
                              [ShapedArray((3,), np.dtype(np.float32))])
    folded = fold_scalar_chains(closed)
    assert len(folded.program.eqns) == len(closed.program.eqns)
    assert len(dce(folded).program.eqns) == 1


@pytest.mark.parametrize("inside", [False, True])
def test_data_parallel_step_on_8_devices_has_no_division_and_same_gradients(inside):
    mesh = spmd.make_mesh((8,), ("d",))
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    x = rng.standard_normal((32, 6)).astype(np.float32)

    def loss(w, x):
        return spmd.numpy.mean(spmd.numpy.tanh(x @ w) ** 2)

    if inside:
        @spmd.jit
        @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("d")),
                           out_specs=P(), check_vma=False)
        def step(w, x):
            return w - 0.1 * lax.pmean(spmd.grad(loss)(w, x), "d")
    else:
        dp_loss = spmd.shard_map(lambda w, x: lax.pmean(loss(w, x), "d"), mesh=mesh,
                                 in_specs=(P(), P("d")), out_specs=P())

        @spmd.jit
        def step(w, x):
            return w - 0.1 * spmd.grad(dp_loss)(w, x)

    want = w - F(0.1) * np.asarray(spmd.jit(spmd.grad(loss))(w, x))
    np.testing.assert_allclose(np.asarray(step(w, x)), want, rtol=1e-5, atol=1e-7)
    executed = step.lower(w, x).as_text(executed=True)
    assert " div " not in executed, executed
