"""The recompute pass (spmd/compiler/passes/recompute.py): late-read elementwise values are
computed again where they are read, with the same bits and less memory held."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.passes import pipeline as passes, recompute
from spmd.compiler.core.ir import ClosedProgram, Var
from spmd.compiler.core.trace import eval_program
from spmd.config import Config
from spmd.errors import ArgumentError


@pytest.fixture
def small(monkeypatch):
    """The pass on test-sized programs: every value counts, a gap of 4 is late."""
    monkeypatch.setattr(recompute, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(recompute, "GAP", 4)


def _mlp_loss(x, w1, w2):
    h = x @ w1
    # GELU's tanh form written out: x**2, x**3 and the sums are read by the backward.
    inner = np.float32(0.79788456) * (h + np.float32(0.044715) * (h * h * h))
    g = np.float32(0.5) * h * (np.float32(1.0) + snp.tanh(inner))
    return snp.sum(snp.tanh(g @ w2))


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((8, 6), (6, 16), (16, 4))]


def _lowered(f, *args) -> ClosedProgram:
    return passes.inline_calls(spmd.make_jaxpr(f)(*args))


def _run(closed, args):
    return [np.asarray(o) for o in eval_program(closed, *args)]


def _peak_bytes(closed) -> int:
    """The largest total size of the values alive at one equation (from its
    definition to its last read; program outputs to the end)."""
    eqns, n = closed.program.eqns, len(closed.program.eqns)
    born, last = {}, {}
    for i, e in enumerate(eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                last[a] = i
        for o in e.outputs:
            born[o] = i
    for a in closed.program.out_atoms:
        if isinstance(a, Var):
            last[a] = n
    return max(sum(v.aval.nbytes for v, b in born.items() if b <= i <= last.get(v, b))
               for i in range(n))


def _reads(closed, var) -> list:
    return [i for i, e in enumerate(closed.program.eqns) if var in e.inputs]


def test_same_bits_less_memory(small):
    args = _args()
    before = _lowered(spmd.grad(_mlp_loss, argnums=(0, 1, 2)), *args)
    after = passes.dce(recompute.recompute_elementwise(before))
    for a, b in zip(_run(before, args), _run(after, args)):
        np.testing.assert_array_equal(a, b)
    assert len(after.program.eqns) > len(before.program.eqns)  # some were recomputed
    assert _peak_bytes(after) < _peak_bytes(before)


def test_late_reads_read_the_recomputation(small):
    args = _args()
    before = _lowered(spmd.grad(_mlp_loss, argnums=(0, 1, 2)), *args)
    after = passes.dce(recompute.recompute_elementwise(before))
    eqns = before.program.eqns
    names = {e.primitive.name for e in eqns}
    assert "tanh" in names and "mul" in names
    # h * h (the square) is read by h * h * h early and by the backward late; after the
    # pass no read of the forward's square is more than GAP equations after the last.
    square = next(e.outputs[0] for e in eqns if e.primitive.name == "mul" and
                  len(set(e.inputs)) == 1)
    late = [i for i in _reads(before, square) if i > _reads(before, square)[0] + recompute.GAP]
    assert late  # the test is about a value the backward reads
    kept = _reads(after, square)
    assert kept and all(j - i <= recompute.GAP for i, j in zip(kept, kept[1:]))


def test_transcendental_results_are_kept(small):
    """A tanh is about ten times an add: its result is kept, not computed twice."""
    def f(x):
        t = snp.tanh(x)
        y = x
        for _ in range(8):
            y = snp.sin(y) @ np.eye(4, dtype=np.float32)
        return t + y

    closed = _lowered(f, np.ones((4, 4), np.float32))
    assert recompute.recompute_elementwise(closed) is closed


def test_values_of_dead_operands_are_kept(small):
    """``h * 2`` read late, where ``h`` (a product) is dead: recomputing it would keep
    ``h`` instead, so nothing changes."""
    def f(x):
        d = 2.0 * (x @ x)
        y = x
        for _ in range(8):
            y = snp.sin(y) @ x
        return d + y

    closed = _lowered(f, np.ones((4, 4), np.float32))
    assert recompute.recompute_elementwise(closed) is closed


def test_long_chains_are_kept(small, monkeypatch):
    def f(x):
        v = x
        for k in range(6):
            v = v * np.float32(1.0 + k)
        y = x
        for _ in range(8):
            y = snp.sin(y) @ np.eye(4, dtype=np.float32)
        return v + y + x

    x = np.ones((4, 4), np.float32)
    closed = _lowered(f, x)
    # x is alive to the end, so the last product of the chain is computed again there...
    monkeypatch.setattr(recompute, "MAX_CHAIN", 6)
    assert recompute.recompute_elementwise(closed) is not closed
    # ...but not at any price: a chain longer than MAX_CHAIN stays as it was.
    monkeypatch.setattr(recompute, "MAX_CHAIN", 5)
    assert recompute.recompute_elementwise(closed) is closed
    np.testing.assert_array_equal(_run(closed, [x])[0], np.asarray(f(x)))


def test_program_outputs_are_not_recomputed(small):
    def f(x):
        v = x * 2.0
        y = x
        for _ in range(8):
            y = snp.sin(y) @ np.eye(4, dtype=np.float32)
        return v, y + v

    closed = _lowered(f, np.ones((4, 4), np.float32))
    assert recompute.recompute_elementwise(closed) is closed


@pytest.mark.parametrize("fuse", [True, False])
def test_jit_same_bits_on_and_off(small, monkeypatch, fuse):
    """Through jit (fused or not): the gradients are the same bits with the pass on and
    off, and the executed program has more equations with it on."""
    from spmd.compiler.engine import fusion, threads

    monkeypatch.setattr(threads, "threads_help", lambda: True)
    monkeypatch.setattr(fusion, "MIN_KERNEL_NS", 0)
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 8)
    args = _args(1)
    results, texts = [], []
    spmd.config.update("fuse_elementwise", fuse)
    try:
        for on in (True, False):
            spmd.config.update("recompute_elementwise", on)
            g = spmd.jit(spmd.grad(_mlp_loss, argnums=(0, 1, 2)))
            texts.append(g.lower(*args).as_text(executed=True))
            results.append([np.asarray(r) for r in g(*args)])
    finally:
        spmd.config.update("recompute_elementwise", True)
        spmd.config.update("fuse_elementwise", True)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    assert texts[0] != texts[1]


def test_config_setting(monkeypatch):
    monkeypatch.setenv("SPMD_RECOMPUTE_ELEMENTWISE", "0")
    assert Config().recompute_elementwise is False
    with pytest.raises(ArgumentError, match="recompute_elementwise must be True or False"):
        spmd.config.update("recompute_elementwise", 1)
    assert spmd.config.recompute_elementwise is True


def test_each_late_read_is_checked(small):
    """``v = 2 x`` with two late reads: at the first ``x`` is still alive, at the second
    it is not (and ``x``, a product, cannot be recomputed).  ``v`` is then kept; an
    earlier version checked only the first read and failed to compile."""
    def f(x0, w):
        x = x0 @ w
        v = x * 2.0
        y = x0
        for _ in range(6):
            y = snp.sin(y) @ w
        b = (v + y) * x  # the first late read of v, and x's last read
        z = b
        for _ in range(6):
            z = snp.sin(z) @ w
        return b + v * z  # v's second late read: x is dead here

    args = [np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4),
            np.eye(4, dtype=np.float32) * 0.5]
    closed = _lowered(f, *args)
    after = passes.dce(recompute.recompute_elementwise(closed))
    np.testing.assert_array_equal(_run(after, args)[0], _run(closed, args)[0])


def _ln_loss(x, g, w):
    mu = snp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    h = xc * spmd.lax.rsqrt(snp.mean(snp.square(xc), axis=-1, keepdims=True) + 1e-5) * g
    return snp.sum(snp.tanh(h @ w))


def test_with_views_a_layer_norms_backward_recomputes_x_minus_mean(small, monkeypatch):
    """When row loops compute the late readers (``views=True``): broadcasts are
    recomputed too, row statistics count as alive, a value read just before is kept
    a little longer. The layer norm's backward then reads ``x`` and the row
    statistics, not the forward's full-size ``x - mean``; the same bits."""
    monkeypatch.setattr(recompute, "SMALL_ELEMENTS", 9)  # the (8, 1) statistics
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((8, 12), (12,), (12, 5))]
    before = _lowered(spmd.grad(_ln_loss, argnums=(0, 1, 2)), *args)
    plain = passes.dce(recompute.recompute_elementwise(before))
    views = passes.dce(recompute.recompute_elementwise(before, views=True))
    for a, b in zip(_run(before, args), _run(views, args)):
        np.testing.assert_array_equal(a, b)

    def full_values_read_late(closed):
        """Full-size values the second half of the program reads from the first."""
        eqns = closed.program.eqns
        half = len(eqns) // 2
        born = {o: i for i, e in enumerate(eqns) for o in e.outputs}
        return {a for i, e in enumerate(eqns) if i >= half for a in e.inputs
                if isinstance(a, Var) and born.get(a, half) < half and a.aval.shape == (8, 12)}

    assert len(full_values_read_late(views)) < len(full_values_read_late(plain))
    assert _peak_bytes(views) <= _peak_bytes(plain)
