"""Elementwise groups as compiled loops (spmd/compiler/engine/fusion_jit.py): results against
the unfused program within float32 rounding, every way an operand is read, results
written over operands, layouts that change, failures, threads and closures."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.engine import fusion, fusion_jit, loops
from tests.compiler.loops_util import close, counted_runs, unfused

# Arithmetic as numpy rounds it, exp and tanh within 2 ulp: each element within this
# of the unfused program's (relative), or of the array's largest magnitude.
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture
def ran(loops_at_once, monkeypatch):
    """The kernels whose compiled loop ran."""
    return counted_runs(monkeypatch, fusion_jit.Runner)


def _close(got, want):
    close(got, want, RTOL, ATOL)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _gelu_bias(x, b):
    """GELU's tanh form and its derivative, of x + b (as the example's forward makes)."""
    y = x + b
    t = snp.tanh(0.7978846 * (y + 0.044715 * y * y * y))
    return 0.5 * y * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * 0.7978846


def _centered(x, mu, s):
    # mu: a row statistic broadcast over the columns; s: a column vector; then scalars
    return (x - mu) * s * 0.5 + 1.0


def _adam(p, g, m, v, t):
    m = 0.9 * m + 0.1 * g
    v = 0.99 * v + 0.01 * g * g
    return p - 1e-3 * ((m / (1 - 0.9 ** t)) / (snp.sqrt(v / (1 - 0.99 ** t)) + 1e-8)), m, v


CASES = [
    ("gelu with a bias (a column operand)", _gelu_bias,
     lambda: (_rand(64, 96), _rand(96, seed=1))),
    ("a row statistic and a column", lambda x, s: _centered(
        x, snp.mean(x, axis=-1, keepdims=True), s), lambda: (_rand(48, 64), _rand(64, seed=2))),
    ("adam on a small weight, scalar operands", _adam,
     lambda: (_rand(40, 64), _rand(40, 64, seed=3), _rand(40, 64, seed=4),
              np.abs(_rand(40, 64, seed=5)), np.float32(3.0))),
    ("exp and where with infinities", lambda x: snp.where(x > 0, snp.exp(x * 30.0),
                                                          -snp.inf) + snp.tanh(x),
     lambda: (_rand(64, 64),)),
]


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_a_loop_gives_the_unfused_results(ran, name, fn, make):
    args = make()
    f = spmd.jit(fn)
    text = f.lower(*args).as_text(executed=True)
    assert "fused_elementwise" in text
    with np.errstate(over="ignore"):  # (exp overflows to inf on purpose)
        got = [f(*args) for _ in range(3)]
        want = unfused(fn, *args)
    assert ran
    for g in got:
        _close(g, want)


def test_special_values_propagate_as_in_numpy(ran):
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 88.8]] * 300,
                 np.float32)
    fn = lambda x: snp.exp(x) * 0.5 + snp.tanh(x) / (x - 1.0)  # noqa: E731
    with np.errstate(all="ignore"):
        _close(spmd.jit(fn)(x), unfused(fn, x))
    assert ran


def test_how_each_operand_is_read():
    shape = (4, 8, 16)
    full = _rand(*shape)
    col = np.broadcast_to(_rand(16), shape)
    row = np.broadcast_to(_rand(4, 8, 1), shape)
    mid = np.broadcast_to(_rand(1, 8, 1), shape)  # neither: copied, read whole
    one = np.float32(2.0)
    k = fusion.Kernel([("add", None, {}, (("in", 0), ("in", 1)), np.float32)], [0],
                      [np.float32] * 2, shape)
    kinds, cols = fusion_jit.layout(k, (full, col))
    assert kinds == ("full", "col") and cols == 16
    assert fusion_jit.layout(k, (full, row)) == (("full", "row"), 16)
    assert fusion_jit.layout(k, (mid, np.asarray(one)))[0] == ("full", "scalar")
    # a column and a row operand of other periods: the second is read whole
    assert fusion_jit.layout(k, (np.broadcast_to(_rand(8, 16), shape), row))[0] == \
        ("col", "full")


def test_a_result_over_its_operand_and_a_changed_layout(loops_at_once):
    """A result written into its operand's buffer; a later call whose operand is laid
    out otherwise than at the first runs the blocked kernel (the loop reads by column)."""
    shape = (32, 64)
    k = fusion.Kernel([("multiply", None, {}, (("in", 0), ("in", 1)), np.float32),
                       ("add", None, {}, (("node", 0), ("const", np.asarray(np.float32(1)))),
                        np.float32)], [1], [np.float32] * 2, shape)
    blocked = []
    runner = fusion_jit.Runner(k, lambda *a, out=None: blocked.append(1) or
                               [a[0] * a[1] + np.float32(1)])
    x, s = _rand(*shape), np.broadcast_to(_rand(64, seed=1), shape)
    want = x * s + np.float32(1)
    buf = x.copy()
    (got,) = runner(buf, s, out=(buf,))
    assert runner.kinds == ("full", "col") and runner.into == (0,)
    assert got is buf and not blocked
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # (a fused multiply-add)
    (again,) = runner(x.copy(), np.ascontiguousarray(s), out=(None,))  # not a column now
    assert blocked
    np.testing.assert_allclose(again, want, rtol=1e-6, atol=1e-6)


def test_off_without_numba_or_when_asked(monkeypatch):
    x = _rand(64, 64)
    f = lambda x: x * 2.0 + 1.0  # noqa: E731
    spmd.config.update("compile_kernels", False)
    try:
        text = spmd.jit(f).lower(x).as_text(executed=True)
    finally:
        spmd.config.update("compile_kernels", True)
    assert "fused" not in text
    monkeypatch.setattr(loops, "numba_available", lambda: False)
    from spmd.compiler.passes import pipeline as passes
    monkeypatch.setattr(passes, "rows_available", lambda: False)
    assert "fused" not in spmd.jit(f).lower(x).as_text(executed=True)


def test_a_loop_that_cannot_be_compiled_keeps_the_numpy_code(ran, no_compiler):
    x, b = _rand(64, 96), _rand(96, seed=1)
    f = spmd.jit(_gelu_bias)
    with pytest.warns(RuntimeWarning, match="could not be compiled.*no compiler today"):
        got = [np.asarray(f(x, b)) for _ in range(3)]
    assert not ran
    for g in got:
        np.testing.assert_array_equal(g, np.asarray(unfused(_gelu_bias, x, b)))


def test_closures_over_different_constants_and_threads(ran, each_on_a_thread):
    """Two closures of one shape whose constants differ get their own loops; callers on
    several threads get their own inputs' results."""
    x = _rand(64, 64)
    fs = [spmd.jit(lambda x, c=c: snp.tanh(x * c) + c) for c in (np.float32(2), np.float32(3))]
    got = [np.asarray(f(x)) for f in fs]
    for c, g in zip((2, 3), got):
        _close(g, np.tanh(x * np.float32(c)) + np.float32(c))
    xs = [_rand(64, 64, seed=k) for k in range(4)]
    want = [np.asarray(fs[0](xk)) for xk in xs]

    def call(k):
        for _ in range(10):
            np.testing.assert_array_equal(np.asarray(fs[0](xs[k])), want[k])

    each_on_a_thread(call, len(xs))


def test_tiered_switch_happens_at_a_fixed_call(monkeypatch, kernel_cache):
    """Before the switch the unfused members run (a loop-only group) with the unfused
    program's bits; from call SWITCH_AT on, the loop."""
    pytest.importorskip("numba")
    monkeypatch.setenv("SPMD_CACHE_DIR", kernel_cache)
    monkeypatch.setattr(loops, "COMPILE_AFTER", 2)
    monkeypatch.setattr(loops, "SWITCH_AT", 4)
    ran = counted_runs(monkeypatch, fusion_jit.Runner)
    x = _rand(40, 64)
    f = spmd.jit(lambda x: (x * 3.0 - 1.0) * x)
    plain = np.asarray(unfused(lambda x: (x * 3.0 - 1.0) * x, x))
    for call in range(1, 6):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = np.asarray(f(x))
        if call < 4:
            np.testing.assert_array_equal(got, plain)
        assert bool(ran) == (call >= 4)
        _close(got, plain)


def test_the_generated_source_reads_and_writes_as_planned():
    shape = (8, 16)
    nodes = [("add", None, {}, (("in", 0), ("in", 1)), np.float32),
             ("tanh", None, {}, (("node", 0),), np.float32),
             ("multiply", None, {}, (("node", 1), ("in", 2)), np.float32)]
    k = fusion.Kernel(nodes, [2, 1], [np.float32] * 3, shape)
    assert fusion_jit.compilable(k)
    src = fusion_jit.source(k, ("full", "col", "row"), (0, -1))
    assert "a1 = x1[c]" in src and "a2 = x2[r]" in src and "y0[c] = v2" in src
    assert "tanhf(v0)" in src and "p1[c] = v1" in src
    f64 = fusion.Kernel([("tanh", None, {}, (("in", 0),), np.float64)], [0], [np.float64],
                        shape)
    assert not fusion_jit.compilable(f64)  # kernel_math's functions are float32 ones
    log = fusion.Kernel([("log", None, {}, (("in", 0),), np.float32)], [0], [np.float32],
                        shape)
    assert not fusion_jit.compilable(log)
