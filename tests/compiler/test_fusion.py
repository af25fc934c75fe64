"""The fusion pass (spmd/compiler/engine/fusion.py): elementwise chains as blocked kernels on
threads, with the unfused program's bits."""

from __future__ import annotations


import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.engine import fusion, loops, threads
from spmd.config import Config
from spmd.errors import ArgumentError


@pytest.fixture
def forced(monkeypatch):
    """Fusion of every chain of two or more equations, whatever the cost model and the
    BLAS threads say, on 3 threads (more than the cores: the blocks must not care)."""
    monkeypatch.setattr(threads, "threads_help", lambda: True)
    monkeypatch.setattr(fusion, "MIN_KERNEL_NS", 0)
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 64)
    monkeypatch.setattr(fusion, "BLOCK_ELEMENTS", 256)  # many blocks, a ragged last one
    monkeypatch.setenv("SPMD_NUM_THREADS", "3")
    monkeypatch.setattr(threads.POOL, "threads", None)
    yield
    threads.POOL.threads = None


def _gelu(x):
    return spmd.nn.gelu(x) * 2.0 + 1.0


def _softmax_masked(x):
    mask = snp.arange(x.shape[-1]) <= snp.arange(x.shape[-2])[:, None]
    return spmd.nn.softmax(snp.where(mask, x / np.float32(3.0), np.float32(-1e9)), axis=-1)


def _layer_norm(x):
    mu = snp.mean(x, axis=-1, keepdims=True)
    var = snp.mean(snp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * 1.5 + 0.25


def _adam(p, g):
    mu = 0.9 * p + 0.1 * g
    nu = 0.99 * p * p + 0.01 * g * g
    return p - 1e-3 * (mu / (snp.sqrt(nu) + 1e-8) + 0.01 * p)


def _mixed(x):
    y = snp.exp(-snp.abs(x)) + snp.log1p(x * x) - snp.expm1(x / 4) + x ** 3
    return snp.where(x > 0, snp.tanh(y), snp.sin(y) * snp.cos(x)) + snp.abs(x) ** 2.5 * (x >= 0)


CASES = [
    ("gelu", _gelu, [(33, 70)]),
    ("softmax", _softmax_masked, [(1, 4, 19, 19)]),
    ("layer_norm", _layer_norm, [(8, 5, 24)]),
    ("adam", _adam, [(37, 29), (37, 29)]),
    ("mixed", _mixed, [(3, 41, 13)]),
]


def _inputs(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_fused_bits_equal_the_unfused_program(forced, name, fn, shapes, dtype):
    if dtype == np.float64:
        spmd.config.update("enable_x64", True)
    try:
        args = _inputs(shapes, dtype)
        fused = spmd.jit(fn)
        text = fused.lower(*args).as_text(executed=True)
        assert "fused_elementwise" in text
        got = np.asarray(fused(*args))
        spmd.config.update("fuse_elementwise", False)
        plain = spmd.jit(fn)
        assert "fused_elementwise" not in plain.lower(*args).as_text(executed=True)
        want = np.asarray(plain(*args))
    finally:
        spmd.config.update("fuse_elementwise", True)
        spmd.config.update("enable_x64", False)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(got, want)  # the same bits, not only close


def test_results_do_not_depend_on_threads_or_blocks(forced, monkeypatch):
    x = _inputs([(5, 97, 31)], np.float32)[0]
    results = []
    for n, block in (("1", 1 << 16), ("2", 97), ("4", 31), ("3", 1)):
        monkeypatch.setenv("SPMD_NUM_THREADS", n)
        monkeypatch.setattr(fusion, "BLOCK_ELEMENTS", block)
        threads.POOL.threads = None
        results.append(np.asarray(spmd.jit(_mixed)(x)))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_concurrent_calls_from_threads(forced, each_on_a_thread):
    """Callers on several threads share the pool and the per-thread scratch buffers:
    each gets its own input's result."""
    f = spmd.jit(_gelu)
    xs = [_inputs([(64, 65)], np.float32, seed=k)[0] for k in range(6)]
    for _ in range(loops.SWITCH_AT):  # past the switch to a compiled loop, if any
        f(xs[0])
    want = [np.asarray(f(x)) for x in xs]

    def call(k):
        for _ in range(20):
            np.testing.assert_array_equal(np.asarray(f(xs[k])), want[k])

    each_on_a_thread(call, len(xs))


def test_the_printed_kernel_and_its_groups(forced):
    x = np.ones((16, 16), np.float32)
    text = spmd.jit(lambda x: snp.tanh(x * 2.0) + 1.0).lower(x).as_text(executed=True)
    assert "fused_elementwise[kernel=(tanh((a * 2.0)) + 1.0)] a" in text
    # A value read twice inside the group is computed once, bound by name.
    text = spmd.jit(lambda x: (lambda y: y * y + y)(snp.exp(x) - 1.0)).lower(x).as_text(
        executed=True)
    assert text.count("fused_elementwise") == 1
    assert "kernel=let t0 = (exp(a) - 1.0) in ((t0 * t0) + t0)] a" in text
    # Values read outside the group are its outputs: one kernel, two results.
    text = spmd.jit(lambda x, y: (lambda t: (t * y, 1.0 - t * t))(snp.tanh(x))).lower(
        x, x).as_text(executed=True)
    assert "c:f32[16,16] d:f32[16,16] = fused_elementwise[kernel=let t0 = tanh(a) in " \
        "((t0 * b), (1.0 - (t0 * t0)))] a b" in text, text


def test_a_reader_outside_the_group_in_between_splits_it(forced):
    """A value read by an equation that is not fused (a sum) before the group's last
    member: the group cannot be computed at its end, so it stops there."""
    x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(16, 16)

    def f(x):
        d = snp.exp(x) - 1.0
        m = snp.sum(d, axis=1, keepdims=True)   # reads d before d * 2.0 + ...
        return snp.tanh(d * 2.0) + snp.broadcast_to(m, d.shape)

    text = spmd.jit(f).lower(x).as_text(executed=True)
    assert "kernel=(exp(a) - 1.0)" in text, text
    d = np.exp(x) - 1.0
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(x)),
                               np.tanh(d * 2.0) + d.sum(axis=1, keepdims=True), rtol=1e-6)


def test_the_gelu_forward_and_its_derivative_are_one_kernel(forced):
    """Under grad, GELU's value and its derivative (its custom jvp) share x and the
    tanh: one kernel with both results, the same bits as the unfused program."""
    x = np.linspace(-3, 3, 64 * 96, dtype=np.float32).reshape(64, 96)

    def loss(x):
        return snp.sum(spmd.nn.gelu(x * 1.5) ** 2)

    g = spmd.jit(spmd.value_and_grad(loss))
    text = g.lower(x).as_text(executed=True)
    gelu_kernels = [ln for ln in text.splitlines() if "fused_elementwise" in ln and "tanh" in ln]
    assert len(gelu_kernels) == 1 and gelu_kernels[0].count(":f32[64,96]") >= 2, text
    got = [np.asarray(v) for v in g(x)]
    spmd.config.update("fuse_elementwise", False)
    try:
        want = [np.asarray(v) for v in spmd.jit(spmd.value_and_grad(loss))(x)]
    finally:
        spmd.config.update("fuse_elementwise", True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_producer_far_before_its_consumer_stays_apart(forced, monkeypatch):
    """A value computed long before its one reader (the forward's derivative that only
    the backward reads) is computed where it is, not moved into the reader's kernel
    (which would keep every operand of its chain alive until then)."""
    monkeypatch.setattr(fusion, "MAX_ABSORB_DISTANCE", 4)
    x = np.linspace(-2, 2, 256, dtype=np.float32).reshape(16, 16)

    def f(x):
        d = snp.exp(x * 0.5) * 3.0        # read only at the end
        y = x
        for _ in range(6):                # equations in between
            y = snp.sin(y)
        return d * y

    text = spmd.jit(f).lower(x).as_text(executed=True)
    assert "kernel=(exp((a * 0.5)) * 3.0)" in text, text
    assert "kernel=((exp" not in text, text
    want = np.exp(x * 0.5) * 3.0 * np.sin(np.sin(np.sin(np.sin(np.sin(np.sin(x))))))
    np.testing.assert_allclose(np.asarray(spmd.jit(f)(x)), want, rtol=1e-6)

    # Operands read at the end anyway (an optimizer's moments): the chain still joins.
    def g(x, m):
        d = snp.exp(m * 0.5) * 3.0
        y = x
        for _ in range(6):
            y = snp.sin(y)
        return d * y, m + y

    text = spmd.jit(g).lower(x, x).as_text(executed=True)
    assert "kernel=let t0 = sin(sin(sin(sin(sin(sin(b)))))) in " \
        "(((exp((a * 0.5)) * 3.0) * t0), (a + t0))" in text, text


def test_what_is_not_fused(forced):
    x = np.ones((16, 16), np.float32)
    i = np.ones((16, 16), np.int32)
    # integers; a reduction between two chains; a program too small
    assert "fused" not in spmd.jit(lambda i: i * 3 + 1).lower(i).as_text(executed=True)
    text = spmd.jit(lambda x: snp.exp(x).sum(axis=1) * 2.0 + 1.0).lower(x).as_text(
        executed=True)
    assert "reduce_sum" in text and "kernel=((a * 2.0) + 1.0)" not in text  # (16,) < 64
    tiny = np.ones((2, 3), np.float32)
    assert "fused" not in spmd.jit(_gelu).lower(tiny).as_text(executed=True)


def test_the_cost_model_leaves_cheap_chains_alone(monkeypatch):
    """Blocked kernels (compiled loops off): only where the work pays for the blocks.
    (With loops, every group of two or more is a loop: tests/compiler/test_fusion_jit.py.)"""
    monkeypatch.setattr(threads, "threads_help", lambda: True)
    monkeypatch.setattr(spmd.config, "compile_kernels", False)
    x = np.ones((256, 256), np.float32)
    cheap = spmd.jit(lambda x: x * 2.0 + 1.0).lower(x).as_text(executed=True)
    assert "fused" not in cheap  # 65536 elements x 2 cheap ops: under MIN_KERNEL_NS
    heavy = spmd.jit(lambda x: snp.tanh(x * 2.0) + 1.0)
    x = np.ones((512, 512), np.float32)
    assert "fused_elementwise" in heavy.lower(x).as_text(executed=True)


def test_no_kernels_where_threads_cannot_help(monkeypatch):
    monkeypatch.setattr(threads, "BLAS_THREADS_YIELD", True)
    monkeypatch.setenv("SPMD_NUM_THREADS", "1")
    assert not threads.threads_help()
    monkeypatch.setenv("SPMD_NUM_THREADS", "2")
    assert threads.threads_help()
    monkeypatch.setattr(threads, "BLAS_THREADS_YIELD", False)  # BLAS threads spin
    assert not threads.threads_help()
    monkeypatch.setattr(spmd.config, "compile_kernels", False)  # (loops need no threads)
    x = np.ones((512, 512), np.float32)
    text = spmd.jit(lambda x: snp.tanh(x * 2.0) + 1.0).lower(x).as_text(executed=True)
    assert "fused" not in text


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_thread_counts_are_refused(monkeypatch, value):
    monkeypatch.setenv("SPMD_NUM_THREADS", value)
    with pytest.raises(ArgumentError, match=f"SPMD_NUM_THREADS={value!r}"):
        threads.num_threads()


def test_the_switch(monkeypatch):
    monkeypatch.setenv("SPMD_FUSE_ELEMENTWISE", "0")
    assert Config().fuse_elementwise is False
    monkeypatch.setenv("SPMD_FUSE_ELEMENTWISE", "maybe")
    with pytest.raises(ArgumentError, match="SPMD_FUSE_ELEMENTWISE='maybe'"):
        Config()
    with pytest.raises(ArgumentError, match="fuse_elementwise must be True or False"):
        spmd.config.update("fuse_elementwise", 1)
    assert spmd.config.fuse_elementwise is True


def test_kernels_are_keys_by_expression_and_types(forced):
    x = np.ones((16, 16), np.float32)
    eqns = [e for f in (lambda x: snp.tanh(x) * 2.0, lambda y: snp.tanh(y) * 2.0)
            for e in _executed_eqns(spmd.jit(f), x) if e.primitive is fusion.fused_p]
    a, b = (e.params["kernel"] for e in eqns)
    assert a == b and hash(a) == hash(b)
    c = next(e.params["kernel"] for e in _executed_eqns(spmd.jit(lambda x: snp.tanh(x) * 3.0), x)
             if e.primitive is fusion.fused_p)
    assert c != a


def _executed_eqns(f, *args):
    from spmd.compiler.passes.pipeline import lower_for_execution, optimize

    return lower_for_execution(optimize(spmd.make_jaxpr(f)(*args))).program.eqns


def test_the_primitive_is_never_transformed():
    with pytest.raises(NotImplementedError, match="lowered for execution"):
        fusion.fused_p.jvp((), ())
    with pytest.raises(NotImplementedError, match="lowered for execution"):
        fusion.fused_p.batch((), ())


def test_spmd_imported_first_makes_blas_threads_yield():
    """Imported before numpy, spmd sets OPENBLAS_THREAD_TIMEOUT (never over the user's
    value); imported after, it cannot (the library has read it) and says so."""
    import os
    import subprocess
    import sys

    code = ("import os, sys; first = sys.argv[1]\n"
            "if first == 'numpy': import numpy\n"
            "from spmd.config import BLAS_THREADS_YIELD\n"
            "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), BLAS_THREADS_YIELD)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}

    def run(first, **extra):
        return subprocess.run([sys.executable, "-c", code, first], env={**env, **extra},
                              capture_output=True, text=True, check=True).stdout.split()

    assert run("spmd") == ["12", "True"]
    assert run("numpy") == ["None", "False"]
    assert run("numpy", OPENBLAS_THREAD_TIMEOUT="20") == ["20", "True"]
    assert run("spmd", OPENBLAS_THREAD_TIMEOUT="20") == ["20", "True"]


def test_results_are_written_into_dying_operands_and_dead_buffers(forced):
    """A kernel's results go into buffers the code owns and no longer needs, as a
    ufunc's do (``out=``): the bits stay the unfused program's."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((48, 40), dtype=np.float32), rng.standard_normal(
        (40, 40), dtype=np.float32)

    def f(x, w):
        h = x @ w                          # owned by the code, read only by the kernel
        t = snp.tanh(h * 0.5)
        y, d = t * 2.0 + 1.0, 1.0 - t * t  # two results
        return (y @ w) * d, y * 3.0

    jf = spmd.jit(f)
    src = jf.lower(x, w).compile().as_text()
    assert "fused_elementwise" in src and "out=(" in src, src
    got = [np.asarray(v) for v in jf(x, w)]
    spmd.config.update("fuse_elementwise", False)
    try:
        want = [np.asarray(v) for v in spmd.jit(f)(x, w)]
    finally:
        spmd.config.update("fuse_elementwise", True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_which_operands_a_result_may_overwrite(forced):
    """Only operands no later node reads, of the result's dtype; a ``where`` none (it
    writes its first case before reading the others)."""
    x = np.ones((16, 16), np.float32)

    def kernel_of(f, *args):
        return next(e.params["kernel"] for e in _executed_eqns(spmd.jit(f), *args)
                    if e.primitive is fusion.fused_p)

    # t = tanh(b) * 2.0 is a result (input 0 is b, read first); a (input 1) is read
    # after it, by exp: t may take b's buffer only, the second result either.
    k = kernel_of(lambda a, b: (lambda t: (t, snp.exp(a) * t))(snp.tanh(b) * 2.0), x, x)
    assert repr(k) == "let t0 = (tanh(a) * 2.0) in (t0, (exp(b) * t0))", repr(k)
    assert [k.overwritable(j) for j in range(2)] == [[0], [0, 1]]
    k = kernel_of(lambda a, b: snp.where(a > 0, snp.exp(b), b * 2.0), x, x)
    assert k.overwritable(0) == []
    k = kernel_of(lambda a, b: snp.exp(a) * 2.0 + b, x, x)
    assert k.overwritable(0) == [0, 1]
