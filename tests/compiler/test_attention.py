"""The attention kernel (spmd/compiler/ops/attention.py) through its front end
``spmd.nn.dot_product_attention``: values against a float64 numpy oracle with JAX's
semantics, derivatives against the same maths in ordinary operations
(``implementation="xla"``) and finite differences, vmap, jit, tiling and threads."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.engine import loops, threads
from spmd.compiler.ops import attention as at, attention_tiles
from spmd.errors import ArgumentError, ShapeError

attention = spmd.nn.dot_product_attention


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def oracle(q, k, v, bias=None, mask=None, *, scale=None, is_causal=False, window=None,
           qlen=None, kvlen=None):
    """JAX's dot_product_attention in float64 numpy, on global arrays."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, N, H = q.shape
    S, K = k.shape[1:3]
    G = N // K
    kk, vv = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, kk) * (1 / np.sqrt(H) if scale is None else scale)
    if bias is not None:
        s = s + bias
    keep = np.ones(s.shape, bool)
    if mask is not None:
        keep &= mask
    tpos, spos = np.arange(T)[:, None], np.arange(S)[None, :]
    if is_causal:
        keep &= spos <= tpos
    if window is not None:
        keep &= (tpos <= spos + window[0]) & (tpos >= spos - window[1])
    if qlen is not None:
        keep &= (np.arange(T)[None, :, None] < qlen[:, None, None])[:, None]
    if kvlen is not None:
        keep &= (np.arange(S)[None, None, :] < kvlen[:, None, None])[:, None]
    s = np.where(keep, s, -0.7 * np.finfo(np.float32).max)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bnts,bsnh->btnh", p, vv)
    if qlen is not None:
        out *= (np.arange(T)[None, :] < qlen[:, None])[:, :, None, None]
    return out


SHAPES = [  # B, T, S, N, K, H
    (2, 5, 7, 4, 2, 8),     # grouped-query, T != S
    (3, 16, 16, 4, 4, 8),   # multi-head
    (2, 12, 12, 4, 1, 16),  # multi-query
]


def operands(B, T, S, N, K, H, seed=0):
    return rand(B, T, N, H, seed=seed), rand(B, S, K, H, seed=seed + 1), \
        rand(B, S, K, H, seed=seed + 2)


def masks(B, T, S, N, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.random((B, 1, T, S)) > 0.3
    m[0, 0, 2] = False  # a row masked whole: the uniform softmax
    return m


CASES = [
    dict(),
    dict(is_causal=True),
    dict(window=(2, 1)),
    dict(bias="full"),
    dict(bias="row"),
    dict(mask=True),
    dict(bias="full", mask=True, is_causal=True),
    dict(scale=0.3, qlen=True, kvlen=True),
]


def build(shape, case):
    B, T, S, N, K, H = shape
    q, k, v = operands(*shape)
    kw, ref = {}, {}
    if case.get("bias") == "full":
        kw["bias"] = ref["bias"] = rand(B, N, T, S, seed=7)
    elif case.get("bias") == "row":
        kw["bias"] = ref["bias"] = rand(1, 1, 1, S, seed=7)
    if case.get("mask"):
        kw["mask"] = ref["mask"] = masks(B, T, S, N)
    for name in ("is_causal", "scale"):
        if name in case:
            kw[name] = ref[name] = case[name]
    if "window" in case:
        kw["local_window_size"] = ref["window"] = case["window"]
    if case.get("qlen"):
        kw["query_seq_lengths"] = ref["qlen"] = np.arange(B, dtype=np.int32) % T + 1
    if case.get("kvlen"):
        kw["key_value_seq_lengths"] = ref["kvlen"] = (np.arange(B, dtype=np.int32) + 3) % S + 1
    return (q, k, v), kw, ref


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("implementation", [None, "xla"])
def test_values_equal_the_numpy_oracle(shape, case, implementation):
    args, kw, ref = build(shape, case)
    got = attention(*args, implementation=implementation, **kw)
    np.testing.assert_allclose(np.asarray(got), oracle(*args, **ref), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients_equal_those_of_ordinary_operations(shape, case):
    (q, k, v), kw, _ = build(shape, case)
    bias = kw.pop("bias", None)
    w = rand(*q.shape, seed=11)

    def loss(impl):
        def f(q, k, v, b):
            return (attention(q, k, v, b, implementation=impl, **kw) * w).sum()
        return f

    n = 4 if bias is not None else 3
    got = spmd.grad(loss(None), argnums=tuple(range(n)))(q, k, v, bias)
    want = spmd.grad(loss("xla"), argnums=tuple(range(n)))(q, k, v, bias)
    for g, x in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(x), rtol=1e-4, atol=2e-5)


def test_gradients_equal_finite_differences_in_float64():
    B, T, S, N, K, H = 2, 4, 5, 4, 2, 3
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in ((B, T, N, H), (B, S, K, H), (B, S, K, H)))
    bias = rng.standard_normal((1, N, T, S))
    w = rng.standard_normal((B, T, N, H))

    def f(q, k, v, b):
        return (attention(q, k, v, b, is_causal=True) * w).sum()

    grads = spmd.grad(f, argnums=(0, 1, 2, 3))(q, k, v, bias)
    # float64 inputs: the softmax is float32 (as JAX's), so steps are coarse.
    eps = 1e-2
    for i, (x, g) in enumerate(zip((q, k, v, bias), grads)):
        flat = x.reshape(-1)
        for j in range(0, flat.size, max(1, flat.size // 7)):
            args = [q, k, v, bias]
            up, dn = x.copy().reshape(-1), x.copy().reshape(-1)
            up[j] += eps
            dn[j] -= eps
            args[i] = up.reshape(x.shape)
            hi = float(f(*args))
            args[i] = dn.reshape(x.shape)
            lo = float(f(*args))
            assert abs((hi - lo) / (2 * eps) - np.asarray(g).reshape(-1)[j]) < 2e-3, (i, j)


def test_jvp_equals_that_of_ordinary_operations():
    (q, k, v), kw, _ = build((2, 6, 6, 4, 2, 8), dict(bias="full", mask=True, is_causal=True))
    ts = tuple(rand(*x.shape, seed=20 + i) for i, x in enumerate((q, k, v, kw["bias"])))
    mask = kw["mask"]

    def f(impl):
        return lambda q, k, v, b: attention(q, k, v, b, mask=mask, is_causal=True,
                                            implementation=impl)

    p1, t1 = spmd.jvp(f(None), (q, k, v, kw["bias"]), ts)
    p2, t2 = spmd.jvp(f("xla"), (q, k, v, kw["bias"]), ts)
    np.testing.assert_allclose(np.asarray(p1), np.asarray(p2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(t1), np.asarray(t2), rtol=1e-4, atol=1e-5)


def test_vmap_of_values_and_gradients_with_an_unbatched_broadcast_bias():
    B, T, S, N, K, H = 2, 6, 6, 4, 2, 8
    qs = rand(3, B, T, N, H)
    _, k, v = operands(B, T, S, N, K, H)
    bias = rand(1, 1, T, S, seed=5)

    def f(impl):
        return lambda q, b: (attention(q, k, v, b, is_causal=True,
                                       implementation=impl) ** 2).sum()

    for impl in (None, "xla"):
        got = spmd.vmap(lambda q: attention(q, k, v, bias, implementation=impl))(qs)
        want = np.stack([oracle(q, k, v, bias) for q in qs])
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    g = spmd.vmap(spmd.grad(f(None), argnums=(0, 1)), in_axes=(0, None))(qs, bias)
    h = spmd.vmap(spmd.grad(f("xla"), argnums=(0, 1)), in_axes=(0, None))(qs, bias)
    assert np.shape(g[1]) == (3, 1, 1, T, S)  # one bias cotangent per mapped element
    for a, b in zip(g, h):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)


def test_jit_and_return_residual_and_unbatched_operands():
    (q, k, v), _, _ = build((2, 8, 8, 4, 2, 8), {})
    f = spmd.jit(lambda q, k, v: attention(q, k, v, is_causal=True, return_residual=True))
    out, lse = f(q, k, v)
    np.testing.assert_allclose(np.asarray(out), oracle(q, k, v, is_causal=True), rtol=2e-5,
                               atol=2e-5)
    s = np.einsum("btnh,bsnh->bnts", q, np.repeat(k, 2, axis=2)) / np.sqrt(8)
    s = np.where(np.tril(np.ones((8, 8), bool)), s, -np.inf)
    want = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    assert lse.shape == (2, 8, 4)
    np.testing.assert_allclose(np.asarray(lse), want.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
    one = attention(q[0], k[0], v[0])  # (T, N, H): no batch dimension
    np.testing.assert_allclose(np.asarray(one), oracle(q[:1], k[:1], v[:1])[0], rtol=2e-5,
                               atol=2e-5)


@pytest.mark.parametrize("masked", [True, False], ids=["mask", "causal-only"])
def test_tiles_over_rows_and_heads_give_the_same_results(monkeypatch, masked):
    """Tiles of one head group, and of a few query rows; causal attention without a
    mask then reads only the keys up to each tile's last row."""
    (q, k, v), kw, _ = build((2, 32, 32, 4, 2, 8), dict(bias="full", mask=True,
                                                         is_causal=True))
    mask = kw["mask"] if masked else None
    w = rand(*q.shape, seed=4)

    def run():
        f = lambda q, k, v, b: (attention(q, k, v, b, mask=mask, is_causal=True) * w).sum()
        return [np.asarray(x) for x in
                [attention(q, k, v, kw["bias"], mask=mask, is_causal=True)] +
                list(spmd.grad(f, argnums=(0, 1, 2, 3))(q, k, v, kw["bias"]))]

    whole = run()
    # One head group (2 query heads) a tile; then 5 rows of them a tile.
    for budget, keys in ((2 * 32 * 32 * 4, {32}),
                         (2 * 32 * 4 * 5, {5, 10, 15, 20, 25, 30, 32})):
        monkeypatch.setattr(attention_tiles, "TILE_BYTES", budget)
        pb = attention_tiles.Problem(np, q, k, v, None, None, scale=1.0, is_causal=True, window=None)
        assert len(pb.jobs) > 2
        assert {t[6] for job in pb.jobs for t in job} == keys
        for a, b in zip(run(), whole):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_threads_give_the_bits_of_one_thread(three_threads, monkeypatch):
    (q, k, v), kw, _ = build((4, 64, 64, 4, 2, 16), dict(bias="full", is_causal=True))
    w = rand(*q.shape, seed=4)
    monkeypatch.setattr(attention_tiles, "TILE_BYTES", 64 * 64 * 4 * 2)  # many jobs
    f = lambda q, k, v, b: (attention(q, k, v, b, is_causal=True) * w).sum()
    calls = []
    run = threads.POOL.run
    monkeypatch.setattr(threads.POOL, "run", lambda parts: (calls.append(len(parts)),
                                                            run(parts))[1])
    many = [np.asarray(x) for x in spmd.grad(f, argnums=(0, 1, 2, 3))(q, k, v, kw["bias"])]
    assert calls and max(calls) == 3
    monkeypatch.setenv("SPMD_NUM_THREADS", "1")
    threads.POOL.threads = None
    one = [np.asarray(x) for x in spmd.grad(f, argnums=(0, 1, 2, 3))(q, k, v, kw["bias"])]
    for a, b in zip(many, one):
        np.testing.assert_array_equal(a, b)


def test_a_second_derivative_through_the_kernel_names_the_fix():
    (q, k, v), _, _ = build((1, 4, 4, 2, 2, 4), {})
    inner = lambda q: (attention(q, k, v) ** 2).sum()
    with pytest.raises(at.SecondOrderAttentionError, match="implementation='xla'"):
        spmd.grad(lambda q: spmd.grad(inner)(q).sum())(q)
    # The ordinary operations differentiate twice.
    h = spmd.grad(lambda q: spmd.grad(lambda q: (attention(q, k, v, implementation="xla")
                                                 ** 2).sum())(q).sum())(q)
    assert np.all(np.isfinite(np.asarray(h)))


@pytest.mark.parametrize("bad, error, match", [
    (dict(implementation="cudnn"), ArgumentError, "implementation='cudnn'"),
    (dict(implementation="flash"), ArgumentError, "implementation='flash'"),
    (dict(mask=np.ones((1, 1, 4, 4), np.float32)), ArgumentError, "mask has dtype float32"),
    (dict(bias=np.ones((1, 3, 4, 4), np.float32)), ShapeError, "bias has shape"),
    (dict(bias=np.ones((1, 1, 1, 4, 4), np.float32)), ShapeError, "bias must have 4 dim"),
    (dict(query_seq_lengths=np.ones(2, np.float32)), ArgumentError,
     "query_seq_lengths has dtype float32"),
    (dict(key_value_seq_lengths=np.ones(3, np.int32)), ShapeError, "key_value_seq_lengths"),
    (dict(local_window_size=(1, 2, 3)), ArgumentError, "local_window_size"),
])
def test_bad_arguments_raise_naming_them(bad, error, match):
    q, k, v = operands(2, 4, 4, 2, 2, 4)
    with pytest.raises(error, match=match):
        attention(q, k, v, **bad)


def test_mismatched_operands_raise_naming_them():
    q, k, v = operands(2, 4, 4, 4, 2, 4)
    with pytest.raises(ShapeError, match="value has shape"):
        attention(q, k, v[:, :3])
    with pytest.raises(ArgumentError, match="query has dtype float16"):
        attention(q.astype(np.float16), k, v)
    with pytest.raises(ShapeError, match="not a multiple"):
        attention(rand(2, 4, 3, 4), k, v)
    with pytest.raises(ShapeError, match="query has shape"):
        attention(rand(2, 4, 4, 5), k, v)


def test_float16_follows_jax_float32_softmax():
    (q, k, v), _, _ = build((2, 6, 6, 2, 2, 8), {})
    got = attention(*(x.astype(np.float16) for x in (q, k, v)), is_causal=True)
    assert got.dtype == np.float16
    np.testing.assert_allclose(np.asarray(got, np.float32), oracle(q, k, v, is_causal=True),
                               rtol=1e-2, atol=1e-2)


def test_jaxpr_shows_one_kernel_and_its_gradient():
    (q, k, v), _, _ = build((1, 4, 4, 2, 2, 4), {})
    text = str(spmd.make_jaxpr(spmd.grad(lambda q: attention(q, k, v).sum()))(q))
    assert text.count("attention[") + text.count("attention ") >= 1
    assert "attention_grad" in text and "exp" not in text


def test_callers_on_several_threads_get_their_own_results(three_threads, monkeypatch):
    """Two threads running the kernel at once (each sharing its tiles with the pool)
    get what each gets alone."""
    import threading

    monkeypatch.setattr(attention_tiles, "TILE_BYTES", 64 * 64 * 4 * 2)
    f = spmd.jit(spmd.grad(lambda q, k, v: (attention(q, k, v, is_causal=True) ** 2).sum(),
                           argnums=(0, 1, 2)))
    inputs = [operands(4, 64, 64, 4, 2, 16, seed=s) for s in (0, 10)]
    for _ in range(loops.SWITCH_AT):  # past the switch to the compiled passes, if any
        f(*inputs[0])
    alone = [[np.asarray(x) for x in f(*args)] for args in inputs]
    got = [None, None]

    def run(i):
        for _ in range(5):
            got[i] = [np.asarray(x) for x in f(*inputs[i])]

    ts = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for g, a in zip(got, alone):
        for x, y in zip(g, a):
            np.testing.assert_array_equal(x, y)


def test_closed_over_traced_keys_and_values():
    """Keys and values computed inside the jitted function and closed over by the
    differentiated one (traced values of an outer trace)."""
    (q, k, v), _, _ = build((2, 6, 6, 4, 2, 8), {})

    def outer(impl):
        @spmd.jit
        def f(q, k, v):
            k2, v2 = k * 2.0, snp.tanh(v)
            return spmd.grad(lambda q: (attention(q, k2, v2, is_causal=True,
                                                  implementation=impl) ** 2).sum())(q)
        return f

    np.testing.assert_allclose(np.asarray(outer(None)(q, k, v)),
                               np.asarray(outer("xla")(q, k, v)), rtol=1e-4, atol=1e-5)


def _value_and_grads(q, k, v, kw, compiled: bool):
    f = spmd.jit(spmd.value_and_grad(
        lambda q, k, v: (attention(q, k, v, **kw) ** 2).sum(), argnums=(0, 1, 2)))
    spmd.config.update("compile_kernels", compiled)
    try:
        return [np.asarray(x) for x in spmd.tree_util.tree_leaves(f(q, k, v))]
    finally:
        spmd.config.update("compile_kernels", True)


@pytest.mark.parametrize("shape,causal,tile", [
    ((2, 5, 7, 4, 2, 8), False, None),       # grouped-query, T != S
    ((3, 16, 16, 4, 4, 8), True, None),
    ((2, 70, 70, 4, 1, 16), True, None),     # rows of 1 to 70 keys: past one vector
    ((2, 40, 40, 4, 2, 8), True, 8 * 40 * 4 * 2),  # several row tiles per head
    ((1, 131, 131, 2, 1, 8), True, None),   # causal rows in two halves (odd)
], ids=str)
def test_the_compiled_softmax_passes_equal_the_numpy_ones(loops_at_once, monkeypatch, shape,
                                                          causal, tile):
    """spmd/compiler/ops/attention_jit.py: the forward's and backward's passes as loops
    give the numpy passes' values and gradients within float32 rounding."""
    if tile is not None:
        monkeypatch.setattr(attention_tiles, "TILE_BYTES", tile)
    from spmd.compiler.ops import attention_jit

    used = []
    real = attention_jit.Runner.__call__

    def spy(self, *args):
        out = real(self, *args)
        used.append(self.tier.done is not None)
        return out

    monkeypatch.setattr(attention_jit.Runner, "__call__", spy)
    q, k, v = operands(*shape)
    got = _value_and_grads(q, k, v, dict(is_causal=causal), True)
    assert used and all(used)
    want = _value_and_grads(q, k, v, dict(is_causal=causal), False)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6 * max(1.0, np.abs(w).max()))


@pytest.mark.parametrize("case", [dict(bias="full"), dict(mask=True), dict(window=(2, 1))],
                         ids=str)
def test_masks_biases_and_windows_keep_the_numpy_passes(loops_at_once, case):
    """The loops serve causal and unmasked attention; with a bias, a user mask or a
    window the numpy passes run (the same bits as without compiled loops)."""
    (q, k, v), kw, _ = build((2, 6, 6, 4, 2, 8), case)
    np.testing.assert_array_equal(np.asarray(spmd.jit(lambda q: attention(q, k, v, **kw))(q)),
                                  np.asarray(attention(q, k, v, **kw)))
    got = _value_and_grads(q, k, v, kw, True)
    for g, w in zip(got, _value_and_grads(q, k, v, kw, False)):
        np.testing.assert_array_equal(g, w)
