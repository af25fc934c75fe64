"""Row kernels (spmd/compiler/engine/rows.py, rows_jit.py): chains with row sums as one loop
compiled by numba, against the unfused program (``compile_kernels`` off)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.engine import loops
from spmd.compiler.passes import pipeline as passes
from spmd.compiler.engine import rows, rows_jit, threads
from spmd.errors import ArgumentError
from tests.compiler.loops_util import close, counted_runs, unfused

pytest.importorskip("numba", reason="row kernels are compiled by numba (the [compile] extra)")

# The loop adds a row's terms in another order than numpy: float32 rounding, relative
# to each element or (where a gradient cancels) to the array's largest magnitude.
RTOL, ATOL = 2e-5, 1e-5


@pytest.fixture
def compiled(loops_at_once, monkeypatch):
    """Row groups from 64 elements on, compiled at their first call and used at once
    (a private kernel cache); the kernels whose loop ran."""
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 64)
    return counted_runs(monkeypatch, rows_jit.RowRunner)


def _close(got, want):
    close(got, want, RTOL, ATOL)


def _layer_norm(x, g, b):
    mu = snp.mean(x, axis=-1, keepdims=True)
    var = snp.mean(snp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_a_layer_norm_is_one_loop(compiled):
    r = _rng()
    x = r.standard_normal((6, 9, 32)).astype(np.float32)
    g, b = r.standard_normal(32).astype(np.float32), r.standard_normal(32).astype(np.float32)
    f = spmd.jit(_layer_norm)
    text = f.lower(x, g, b).as_text(executed=True)
    assert text.count("fused_rows[kernel=rows 54x32:") == 1, text
    assert "reduce_sum" not in text  # both sums are inside the loop
    got = f(x, g, b)
    assert compiled, "the compiled loop did not run"
    mu = x.mean(-1, keepdims=True)
    want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    _close(got, unfused(_layer_norm, x, g, b))


def _softmax_rows(x):
    # A softmax whose max is taken outside (max is not a loop's op): the subtraction,
    # exp and sum, and the division, in one loop over each row.
    e = snp.exp(x - snp.max(x, axis=-1, keepdims=True))
    return e / snp.sum(e, axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_softmax_with_its_exp_is_one_loop(compiled, dtype):
    """Float32 exp joins a row loop (spmd/compiler/engine/kernel_math.py's expf); float64's
    stays outside it."""
    spmd.config.update("enable_x64", dtype == np.float64)
    try:
        x = (_rng(12).standard_normal((40, 70)) * 5).astype(dtype)
        x[3, :7] = -np.inf  # exp of -inf: 0
        f = spmd.jit(_softmax_rows)
        text = f.lower(x).as_text(executed=True)
        loop = next(ln for ln in text.splitlines() if "fused_rows" in ln)
        assert ("exp(" in loop) == (dtype == np.float32), text
        got = f(x)
        assert compiled
        _close(got, unfused(_softmax_rows, x))
    finally:
        spmd.config.update("enable_x64", False)


def test_a_layer_norm_under_grad(compiled):
    """Forward and backward, with the backward's sums over rows (the scale's gradient:
    not a row sum, so outside the loops) and the recomputation of ``x - mean``."""
    r = _rng(1)
    x = r.standard_normal((64, 48)).astype(np.float32)
    g, b = r.standard_normal(48).astype(np.float32), r.standard_normal(48).astype(np.float32)
    w = r.standard_normal((48, 16)).astype(np.float32)

    def loss(x, g, b):
        h = _layer_norm(x, g, b)
        return snp.sum(snp.tanh(h @ w) ** 2)

    f = spmd.value_and_grad(loss, argnums=(0, 1, 2))
    text = spmd.jit(f).lower(x, g, b).as_text(executed=True)
    assert text.count("fused_rows") >= 2, text
    got = spmd.jit(f)(x, g, b)
    assert len(compiled) >= 2
    _close(got, unfused(f, x, g, b))


OPS = [
    ("where_and_compare", lambda x, y: snp.sum(snp.where(x > y, x * y, -y), axis=-1)),
    ("pow_div_abs", lambda x, y: snp.sum(x ** 3 / (snp.abs(y) + 1.0) - x ** -2, axis=-1,
                                         keepdims=True) * x),
    ("sqrt_rsqrt_neg", lambda x, y: -snp.sqrt(snp.abs(x)) * lax.rsqrt(
        snp.sum(y * y, axis=-1, keepdims=True) + 1.0)),
    ("two_sums_chained", lambda x, y: x - snp.sum(x * snp.sum(y, axis=-1, keepdims=True),
                                                 axis=-1, keepdims=True) / 7.0),
    ("sum_of_two_trailing_axes", lambda x, y: snp.sum(x * y, axis=(-2, -1))),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,fn", OPS, ids=[o[0] for o in OPS])
def test_ops_against_the_unfused_program(compiled, name, fn, dtype):
    if dtype == np.float64:
        spmd.config.update("enable_x64", True)
    try:
        r = _rng(2)
        x = r.standard_normal((5, 7, 11)).astype(dtype)
        y = r.standard_normal((5, 7, 11)).astype(dtype)
        text = spmd.jit(fn).lower(x, y).as_text(executed=True)
        assert "fused_rows" in text, text
        got = spmd.jit(fn)(x, y)
        assert compiled
        _close(got, unfused(fn, x, y))
    finally:
        spmd.config.update("enable_x64", False)


def test_operands_as_rows_columns_tiles_scalars_and_strided(compiled):
    """Each way the loop reads a value computed outside: a column (a scale), a row (a
    mean given as input), a value repeated along leading axes (a simulated mesh's
    replicated one), a scalar traced value, and a transposed (non-contiguous) array."""
    r = _rng(3)
    x = r.standard_normal((4, 6, 16)).astype(np.float32)
    col = r.standard_normal(16).astype(np.float32)
    row = r.standard_normal((4, 6, 1)).astype(np.float32)
    tile = r.standard_normal((6, 16)).astype(np.float32)
    s = np.float32(1.5)
    xt = np.ascontiguousarray(x.transpose(2, 0, 1)).transpose(1, 2, 0)  # strided view

    def f(x, col, row, tile, s):
        y = x * col + row - snp.broadcast_to(tile, x.shape) * s
        return y / snp.sum(y * y, axis=-1, keepdims=True)

    got = spmd.jit(f)(xt, col, row, tile, s)
    assert compiled
    kinds = {n[2]["kind"] for n in compiled[0].nodes if n[0] == "read"}
    assert {"col", "row", "tile", "scalar", "full"} <= kinds, kinds
    _close(got, unfused(f, x, col, row, tile, s))


def test_nan_infinity_and_division_by_zero_propagate_as_in_numpy(compiled):
    x = np.array([[1.0, np.nan, 2.0, 3.0] * 4, [np.inf, 1.0, -np.inf, 0.0] * 4,
                  [0.0, 0.0, 0.0, 0.0] * 4, [1e38, 1e38, -1e38, 2.0] * 4],
                 np.float32).repeat(8, axis=0)

    def f(x):
        m = snp.sum(x, axis=-1, keepdims=True)
        return x / m, x / (x - x), snp.sum(x * 0.0, axis=-1)

    with np.errstate(all="ignore"):
        got = spmd.jit(f)(x)
        want = unfused(f, x)
    assert compiled
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w))
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w))
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin], w[fin], rtol=RTOL, atol=ATOL * 1e-3)


def test_rows_on_threads_give_the_same_bits(compiled, monkeypatch):
    """The rows are shared among threads: each row's numbers do not depend on which
    thread computes it, or how the rows are cut."""
    r = _rng(4)
    x = r.standard_normal((37, 5, 24)).astype(np.float32)
    g, b = r.standard_normal(24).astype(np.float32), r.standard_normal(24).astype(np.float32)
    one = np.asarray(spmd.jit(_layer_norm)(x, g, b))
    monkeypatch.setattr(rows_jit, "THREADED_ELEMENTS", 1)
    monkeypatch.setattr(threads, "threads_help", lambda: True)
    for n in ("2", "3", "7"):
        monkeypatch.setenv("SPMD_NUM_THREADS", n)
        monkeypatch.setattr(threads.POOL, "threads", None)
        np.testing.assert_array_equal(np.asarray(spmd.jit(_layer_norm)(x, g, b)), one)
    threads.POOL.threads = None


def test_concurrent_callers(compiled, each_on_a_thread):
    f = spmd.jit(_layer_norm)
    r = _rng(5)
    g, b = r.standard_normal(40).astype(np.float32), r.standard_normal(40).astype(np.float32)
    xs = [r.standard_normal((33, 40)).astype(np.float32) for _ in range(5)]
    want = [np.asarray(f(x, g, b)) for x in xs]

    def call(k):
        for _ in range(20):
            np.testing.assert_array_equal(np.asarray(f(xs[k], g, b)), want[k])

    each_on_a_thread(call, len(xs))


def test_the_switch_to_the_loop_happens_at_a_fixed_call(compiled, monkeypatch):
    """Unfused bits until call SWITCH_AT, the loop's from then on, whenever the
    background compilation finished: every rank switches at the same step."""
    monkeypatch.setattr(loops, "COMPILE_AFTER", 2)
    monkeypatch.setattr(loops, "SWITCH_AT", 4)
    r = _rng(6)
    x = r.standard_normal((50, 30)).astype(np.float32) * 10 + 3
    g, b = r.standard_normal(30).astype(np.float32), r.standard_normal(30).astype(np.float32)
    plain = np.asarray(unfused(_layer_norm, x, g, b))
    f = spmd.jit(_layer_norm)
    results = [np.asarray(f(x, g, b)) for _ in range(6)]
    for k in range(3):
        np.testing.assert_array_equal(results[k], plain)
    assert len(compiled) == 3  # calls 4, 5, 6
    for k in range(4, 6):
        np.testing.assert_array_equal(results[k], results[3])
    _close(results[3], plain)


def test_a_kernel_that_cannot_be_compiled_keeps_runningunfused(compiled, no_compiler):
    r = _rng(7)
    x = r.standard_normal((20, 17)).astype(np.float32)
    g, b = np.ones(17, np.float32), np.zeros(17, np.float32)
    f = spmd.jit(_layer_norm)
    with pytest.warns(RuntimeWarning, match="could not be compiled.*no compiler today"):
        got = [np.asarray(f(x, g, b)) for _ in range(3)]
    assert not compiled
    for a in got:
        np.testing.assert_array_equal(a, np.asarray(unfused(_layer_norm, x, g, b)))


def test_a_stale_cache_entry_is_dropped_and_compiled_again(compiled, monkeypatch, tmp_path):
    monkeypatch.setenv("SPMD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(loops, "_compiled", {})
    load, failed = loops._load, []

    def once(src, prefix):
        if not failed:
            failed.append(src)
            raise EOFError("truncated cache index")
        return load(src, prefix)

    monkeypatch.setattr(loops, "_load", once)
    x = _rng(8).standard_normal((12, 19)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = spmd.jit(_layer_norm)(x, np.ones(19, np.float32), np.zeros(19, np.float32))
    assert failed and compiled
    _close(got, unfused(_layer_norm, x, np.ones(19, np.float32), np.zeros(19, np.float32)))


def test_an_unwritable_cache_folder_still_compiles(compiled, monkeypatch, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPMD_CACHE_DIR", str(blocker / "below"))
    monkeypatch.setattr(loops, "_compiled", {})
    x = _rng(9).standard_normal((12, 23)).astype(np.float32)
    ones, zeros = np.ones(23, np.float32), np.zeros(23, np.float32)
    got = spmd.jit(_layer_norm)(x, ones, zeros)
    assert compiled
    _close(got, unfused(_layer_norm, x, ones, zeros))


def test_the_cache_serves_a_later_process(compiled, kernel_cache):
    """The generated module is written whole under the cache folder, beside numba's
    cache of its machine code."""
    import os

    spmd.jit(_layer_norm)(_rng(10).standard_normal((9, 29)).astype(np.float32),
                          np.ones(29, np.float32), np.zeros(29, np.float32))
    rows_jit.wait_compiled()
    folder = os.path.join(kernel_cache, "kernels")
    names = os.listdir(folder)
    assert any(n.startswith("spmd_rows_") and n.endswith(".py") for n in names)
    assert not any(n.endswith(".tmp") for n in names)
    assert os.listdir(os.path.join(folder, "__pycache__"))


def test_off_without_numba_or_when_asked(monkeypatch):
    x = np.ones((64, 300), np.float32)
    g = b = np.ones(300, np.float32)
    assert "fused_rows" in spmd.jit(_layer_norm).lower(x, g, b).as_text(executed=True)
    spmd.config.update("compile_kernels", False)
    try:
        assert "fused_rows" not in spmd.jit(_layer_norm).lower(x, g, b).as_text(executed=True)
    finally:
        spmd.config.update("compile_kernels", True)
    monkeypatch.setattr(passes, "rows_available", lambda: False)
    assert "fused_rows" not in spmd.jit(_layer_norm).lower(x, g, b).as_text(executed=True)


def test_the_setting_takes_only_a_bool():
    with pytest.raises(ArgumentError, match="compile_kernels must be True or False, got 'yes'"):
        spmd.config.update("compile_kernels", "yes")
    assert spmd.config.compile_kernels is True


def test_broadcasts_of_its_values_stay_views(compiled):
    """A broadcast of the row statistics read outside the loop is computed after it,
    from its row result: the loop never writes a broadcast copy."""
    x = _rng(11).standard_normal((16, 40)).astype(np.float32)

    def f(x):
        m = snp.sum(x * x, axis=-1, keepdims=True)
        wide = snp.broadcast_to(m, x.shape)
        return x / wide, wide

    text = spmd.jit(f).lower(x).as_text(executed=True)
    fused = [ln for ln in text.splitlines() if "fused_rows" in ln]
    assert len(fused) == 1 and ":f32[16,40]" in fused[0].split("=")[0]
    assert text.index("fused_rows") < text.rindex("broadcast_in_dim")
    got = spmd.jit(f)(x)
    assert compiled and all(n[5] != "full" or n[0] != "alias"
                            for k in compiled for n in (k.nodes[j] for j in k.outputs))
    _close(got, unfused(f, x))


def test_results_go_into_dead_buffers_or_new_arrays(compiled):
    """The generated code hands the loop a dead value's buffer (``out=``); one that is
    not C-contiguous is not written into (a new array is returned)."""
    r = _rng(12)
    x = r.standard_normal((24, 36)).astype(np.float32)

    def f(x):
        y = snp.exp(x) @ np.eye(36, dtype=np.float32)  # dead after its one reader
        return y - snp.sum(y, axis=-1, keepdims=True) / 36.0

    src = spmd.jit(f).lower(x).compile().as_text()
    assert any("_fused_rows" in ln and "out=(" in ln for ln in src.splitlines()), src
    got = spmd.jit(f)(x)
    _close(got, unfused(f, x))
    kernel = compiled[0]
    runner = rows_jit.RowRunner(kernel)
    loop = rows_jit.compile_async(kernel).result()
    y = np.exp(x)
    bad = np.empty((36, 24), np.float32).T
    out = runner.run(loop, [y], [bad])
    assert out[0] is not bad and not np.shares_memory(out[0], bad)
    good = np.empty((24, 36), np.float32)
    out = runner.run(loop, [y], [good])
    assert np.shares_memory(out[0], good)
    np.testing.assert_allclose(out[0], y - y.sum(-1, keepdims=True) / 36, rtol=1e-5, atol=1e-5)


def test_which_operands_a_result_may_overwrite(compiled):
    """A result may take the buffer of a full operand whose elements the loop reads
    for the last time before (or as) it writes them; not one read in a later pass."""
    x = _rng(13).standard_normal((24, 36)).astype(np.float32)

    def centered(x):  # x is read by the sum (pass 0) and by x - mean (pass 1)
        return x - snp.sum(x, axis=-1, keepdims=True) / 36.0

    def early(x):  # x * 2 is written in pass 0, while pass 1 still reads x
        d = x * 2.0
        return d, x - snp.sum(x, axis=-1, keepdims=True) / 36.0 + d

    spmd.jit(centered)(x)
    spmd.jit(early)(x)
    k_centered, k_early = compiled[0], compiled[1]
    assert rows_jit.overwritable(k_centered, 0) == [0]
    doubled = [j for j, n in enumerate(k_early.outputs) if k_early.nodes[n][1] == "multiply"]
    assert rows_jit.overwritable(k_early, doubled[0]) == []
    # In place, on the operand's own buffer: the results are still right.
    runner = rows_jit.RowRunner(k_centered)
    loop = rows_jit.compile_async(k_centered).result()
    buf = x.copy()
    out = runner.run(loop, [buf], [buf])
    assert np.shares_memory(out[0], buf)
    np.testing.assert_allclose(out[0], x - x.sum(-1, keepdims=True) / 36, rtol=1e-5,
                               atol=1e-5)


def test_the_unfused_calls_free_their_intermediates(compiled, monkeypatch):
    """Before the loop is compiled, a group runs its members' implementations and
    drops each intermediate after its last reader (a layer norm's backward holds
    dozens): only the results stay alive."""
    import gc
    import weakref

    r = _rng(14)
    x = r.standard_normal((64, 300)).astype(np.float32)
    g, b = r.standard_normal(300).astype(np.float32), r.standard_normal(300).astype(np.float32)
    spmd.jit(_layer_norm)(x, g, b)
    kernel = compiled[0]
    made = []
    for prim in {m[0] for m in kernel.members}:
        impl = prim.impl

        def tracked(xp, *a, _impl=impl, **kw):
            out = _impl(xp, *a, **kw)
            made.append(weakref.ref(out))
            return out

        monkeypatch.setattr(prim, "impl", tracked)
    outs = rows_jit.evaluate(kernel, [x, g, b])
    gc.collect()
    alive = [ref() for ref in made if ref() is not None]
    assert len(made) >= len(kernel.members) > len(outs)
    assert all(any(a is o or np.shares_memory(a, o) for o in outs) for a in alive)


def test_a_value_replicated_over_a_middle_axis_is_read_as_its_rows(compiled):
    """A simulated mesh's psum result, broadcast over the model axis and reshaped to
    the devices' stack: the loop reads the (data, ...) value's rows in turn, through
    the broadcast and the reshape, which no longer run outside it."""
    r = _rng(15)
    s = r.standard_normal((4, 8, 16)).astype(np.float32)
    y = r.standard_normal((8, 8, 16)).astype(np.float32)

    def f(s, y):
        wide = lax.broadcast_in_dim(s, (4, 2, 8, 16), (0, 2, 3)).reshape(8, 8, 16)
        h = wide + y
        return h / snp.sum(h * h, axis=-1, keepdims=True)

    text = spmd.jit(f).lower(s, y).as_text(executed=True)
    assert "broadcast_in_dim" not in text and "reshape" not in text, text
    got = spmd.jit(f)(s, y)
    kinds = [n[2]["kind"] for n in compiled[0].nodes if n[0] == "read"]
    assert "tile" in kinds and "full" in kinds, kinds
    wide = np.broadcast_to(s[:, None], (4, 2, 8, 16)).reshape(8, 8, 16)
    h = wide + y
    np.testing.assert_allclose(np.asarray(got), h / (h * h).sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
    _close(got, unfused(f, s, y))
    # Before the switch the members' implementations run the broadcast themselves.
    np.testing.assert_array_equal(
        np.asarray(rows_jit.evaluate(compiled[0], [s, y])[0]).reshape(8, 8, 16),
        np.asarray(unfused(f, s, y)))


def test_broadcasts_of_broadcasts_compose(compiled):
    """A scale broadcast to a device's shape, then over the devices' stack: the loop
    reads the scale itself as a column."""
    r = _rng(16)
    g = r.standard_normal(16).astype(np.float32)
    x = r.standard_normal((4, 8, 16)).astype(np.float32)

    def f(g, x):
        once = lax.broadcast_in_dim(g, (8, 16), (1,))
        twice = lax.broadcast_in_dim(once, (4, 8, 16), (1, 2))
        h = x * twice
        return h - snp.sum(h, axis=-1, keepdims=True)

    text = spmd.jit(f).lower(g, x).as_text(executed=True)
    assert "broadcast_in_dim" not in text, text
    got = spmd.jit(f)(g, x)
    kinds = sorted(n[2]["kind"] for n in compiled[0].nodes if n[0] == "read")
    assert kinds == ["col", "full"], kinds
    _close(got, unfused(f, g, x))
    np.testing.assert_array_equal(np.asarray(rows_jit.evaluate(compiled[0], [g, x])[0]),
                                  np.asarray(unfused(f, g, x)))


def test_closures_with_other_constants_get_their_own_numbers(compiled):
    """Two closures over different constants (a scalar baked into the loop's source,
    an array read as an operand) share nothing wrongly: each call, before and after
    the switch, gives its own closure's numbers."""
    r = _rng(17)
    x = r.standard_normal((32, 24)).astype(np.float32)

    def make(eps, scale):
        def f(x):
            mu = snp.mean(x, axis=-1, keepdims=True)
            var = snp.mean(snp.square(x - mu), axis=-1, keepdims=True)
            return (x - mu) * lax.rsqrt(var + eps) * scale
        return spmd.jit(f)

    consts = [(np.float32(1e-5), r.standard_normal(24).astype(np.float32)),
              (np.float32(3.0), r.standard_normal(24).astype(np.float32))]
    fs = [make(*c) for c in consts]
    for _ in range(3):
        for f, (eps, scale) in zip(fs, consts):
            mu = x.mean(-1, keepdims=True)
            want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * scale
            np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-4, atol=1e-5)
    assert len({k for k in compiled}) == 2  # two loops, one per closure
