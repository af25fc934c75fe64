"""The jit fast path (per-leaf cheap cache keys, per-entry conversions, direct
wrapping of results) and the program shapes the performance work relies on:
``dot_general`` with transposed operands, the weight gradient without a
transpose, and ``broadcast_in_dim``'s strictly increasing dimensions."""

import re

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import errors, lax
from spmd.compiler.core.trace import get_aval
from spmd.config import config
from spmd.test_util import check_grads

F32 = np.float32
rng = np.random.default_rng(0)


def counted_jit(fun, **kw):
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        return fun(*args, **kwargs)

    return spmd.jit(wrapper, **kw), calls


# --------------------------------------------------------------- cache keys

def test_leaves_of_one_aval_share_one_trace():
    f, calls = counted_jit(lambda x: x * 2.0)
    x = np.arange(3, dtype=F32)
    for arg in (x, snp.asarray(x), x.astype(np.float64), x.view(np.ndarray)):
        out = f(arg)
        assert out.dtype == F32 and isinstance(out, spmd.Array)
        np.testing.assert_array_equal(np.asarray(out), x * 2)
    assert len(calls) == 1 and f._cache_size() == 1


def test_float64_input_is_converted_without_x64():
    f = spmd.jit(lambda x, y: x + y)
    x64 = np.linspace(0, 1, 4)
    out = f(x64, np.ones(4, F32))
    assert out.dtype == F32
    np.testing.assert_allclose(np.asarray(out), x64 + 1, rtol=1e-6)
    out = f(x64, np.ones(4, F32))  # the cached plan converts the same leaf again
    np.testing.assert_allclose(np.asarray(out), x64 + 1, rtol=1e-6)


def test_x64_switch_retraces():
    f, calls = counted_jit(lambda x: x * 2.0)
    x = np.ones(3, np.float64)
    assert f(x).dtype == F32
    old = config.enable_x64
    config.update("enable_x64", True)
    try:
        assert f(x).dtype == np.float64
    finally:
        config.update("enable_x64", old)
    assert f(x).dtype == F32
    assert len(calls) == 2


@pytest.mark.parametrize("a, b", [
    (1.0, F32(1.0)),               # weak Python float vs strong numpy scalar
    (1.0, np.float64(1.0)),        # np.float64 is a float subclass, but strong
    (1, 1.0),                      # weak int vs weak float
    (True, 1),                     # bool vs int
    (np.ones((), F32), 1.0),       # 0-d array vs Python scalar
    (np.int32(1), np.int64(1)),    # canonicalised to one aval: shared trace
])
def test_scalar_kinds(a, b):
    f, calls = counted_jit(lambda x: x + 1)
    ra, rb = f(a), f(b)
    same = get_aval(a) == get_aval(b)
    assert len(calls) == (1 if same else 2)
    assert ra.weak_type == get_aval(a).weak_type and rb.weak_type == get_aval(b).weak_type
    f(a), f(b)
    assert len(calls) == (1 if same else 2)


def test_mixed_pytree_leaves():
    f, calls = counted_jit(lambda p, s: {"y": p["w"] * s + p["b"], "n": p["n"] + 1})
    p = {"w": snp.ones((2, 3)), "b": np.arange(3.0), "n": np.int32(4)}
    for _ in range(3):
        out = f(p, 2.0)
        np.testing.assert_allclose(np.asarray(out["y"]), 2 + np.arange(3.0) * np.ones((2, 3)))
        assert out["y"].dtype == F32 and int(out["n"]) == 5
    assert len(calls) == 1


def test_structures_give_distinct_keys():
    import collections

    f, calls = counted_jit(lambda t: spmd.tree_util.tree_reduce(lambda a, b: a + b, t))
    one = np.ones(2, F32)
    Pair = collections.namedtuple("Pair", "a b")
    trees = [(one, one), [one, one], {"a": one, "b": one}, {"a": one, "c": one},
             {1: one, "x": one},            # unsortable keys: the general path
             Pair(one, one), (one, (one,)), ((one,), one), (one, None, one), (one, one, None)]
    for t in trees:
        np.testing.assert_array_equal(np.asarray(f(t)), [2, 2] if len(
            spmd.tree_util.tree_leaves(t)) == 2 else [3, 3])
    n = len(calls)
    assert n == len(trees)
    for t in trees:  # all cached, each under its own structure
        f(t)
    assert len(calls) == n


def test_dict_leaves_follow_sorted_keys():
    f = spmd.jit(lambda d: d["b"] - d["a"])
    d = {"b": np.full(2, 5.0, F32), "a": np.ones(2, F32)}
    np.testing.assert_array_equal(np.asarray(f(d)), [4, 4])
    d2 = {"a": np.ones(2, F32), "b": np.full(2, 5.0, F32)}  # other insertion order
    np.testing.assert_array_equal(np.asarray(f(d2)), [4, 4])
    assert f._cache_size() == 1


def test_keyword_arguments_without_static_arguments():
    f, calls = counted_jit(lambda x, *, scale, shift=0.0: x * scale + shift)
    x = np.ones(2, F32)
    np.testing.assert_array_equal(np.asarray(f(x, scale=3.0)), [3, 3])
    np.testing.assert_array_equal(np.asarray(f(x, shift=1.0, scale=3.0)), [4, 4])
    np.testing.assert_array_equal(np.asarray(f(x, scale=3.0, shift=2.0)), [5, 5])
    assert len(calls) == 2  # keyword order does not matter


def test_unsupported_leaf_caches_nothing():
    f = spmd.jit(lambda x: x)
    for bad in (np.array([object()], dtype=object), np.array(["a"]), "text"):
        with pytest.raises(errors.DTypeError):
            f(bad)
        assert f._cache_size() == 0 and not f._plans
    assert float(f(np.ones((), F32))) == 1.0


def test_deleted_array_argument_is_an_error_on_the_fast_path():
    f = spmd.jit(lambda x: x + 1.0)
    x = snp.ones(3)
    f(x)
    x.delete()
    with pytest.raises(errors.DeletedArrayError):
        f(x)


def test_outputs_are_wrapped_with_their_avals():
    f = spmd.jit(lambda x: (x, snp.sum(x), x.astype(np.int32), 2.0))
    outs = f(np.arange(3, dtype=F32))
    assert all(isinstance(o, spmd.Array) for o in outs)
    assert [o.shape for o in outs] == [(3,), (), (3,), ()]
    assert [o.dtype for o in outs] == [F32, F32, np.int32, F32]
    assert outs[3].weak_type and not outs[1].weak_type
    single = spmd.jit(lambda x: snp.sum(x))(np.arange(3, dtype=F32))
    assert isinstance(single, spmd.Array) and single.shape == () and float(single) == 3.0


def test_jitted_function_under_transformations():
    f = spmd.jit(lambda x, s: snp.sum(snp.tanh(x) * s))
    x = rng.standard_normal(4).astype(F32)
    g = spmd.grad(f)(x, 2.0)
    np.testing.assert_allclose(np.asarray(g), 2 * (1 - np.tanh(x) ** 2), rtol=1e-5)
    v = spmd.vmap(f, in_axes=(0, None))(np.stack([x, -x]), 1.0)
    np.testing.assert_allclose(np.asarray(v), [np.tanh(x).sum(), -np.tanh(x).sum()], rtol=1e-5)


# ------------------------------------------------------------- dot_general

@pytest.mark.parametrize("lc, rc", [((1,), (0,)), ((0,), (0,)), ((1,), (1,)), ((0,), (1,))])
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_dot_general_2d_transposed_operands(lc, rc, mode):
    x = rng.standard_normal((3, 4) if lc == (1,) else (4, 3)).astype(F32)
    y = rng.standard_normal((4, 5) if rc == (0,) else (5, 4)).astype(F32)
    f = lambda a, b: lax.dot_general(a, b, ((lc, rc), ((), ())))
    out = (spmd.jit(f) if mode == "jit" else f)(x, y)
    want = (x if lc == (1,) else x.T) @ (y if rc == (0,) else y.T)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5)
    check_grads(f, (x, y), order=1, modes=("rev",))


def test_weight_gradient_needs_no_transpose():
    def loss(w, b, x):
        return snp.sum(snp.tanh(x @ w + b))

    w, b = rng.standard_normal((4, 3)).astype(F32), rng.standard_normal(3).astype(F32)
    x = rng.standard_normal((5, 4)).astype(F32)
    program = spmd.jit(spmd.grad(loss, argnums=(0, 1, 2))).lower(w, b, x).program
    names = [e.primitive.name for e in program.eqns]
    assert "transpose" not in names
    gw, gb, gx = spmd.grad(loss, argnums=(0, 1, 2))(w, b, x)
    d = 1 - np.tanh(x @ w + b) ** 2
    np.testing.assert_allclose(np.asarray(gw), x.T @ d, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gx), d @ w.T, rtol=1e-5, atol=1e-6)


def test_training_step_code_reads_like_numpy():
    def loss(params, x, y):
        (w1, b1), (w2, b2) = params
        logits = snp.tanh(x @ w1 + b1) @ w2 + b2
        return -snp.mean(snp.sum(y * spmd.nn.log_softmax(logits), axis=-1))

    def step(params, x, y):
        value, grads = spmd.value_and_grad(loss)(params, x, y)
        return value, spmd.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    params = [(rng.standard_normal((6, 5)).astype(F32), np.zeros(5, F32)),
              (rng.standard_normal((5, 3)).astype(F32), np.zeros(3, F32))]
    x = rng.standard_normal((4, 6)).astype(F32)
    y = np.eye(3, dtype=F32)[[0, 2, 1, 1]]
    src = spmd.jit(step).lower(params, x, y).compile().source
    assert "transpose" not in src and "_dot_general" not in src
    # Five matmuls, three of them on transposed views (h.T @ g, x.T @ g, g @ w.T):
    # no copies.  Some write into the buffers of dead temporaries (out=).
    assert len(re.findall(r" @ |xp\.matmul\(", src)) == 5 and src.count(".T") == 3
    assert "xp.matmul(" in src
    # The weight updates write into the gradients' buffers (fresh matmul results).
    assert re.search(r"xp\.multiply\(\w+, (v\d+), out=\1\)", src)
    value, new = spmd.jit(step)(params, x, y)
    want_value, want_new = step(params, x, y)
    np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
    for a, b in zip(spmd.tree_util.tree_leaves(new), spmd.tree_util.tree_leaves(want_new)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dims, sx, sy", [
    ((((2,), (1,)), ((0,), (0,))), (2, 3, 4), (2, 4, 5)),   # batched matmul
    ((((1,), (2,)), ((0,), (0,))), (2, 4, 3), (2, 5, 4)),   # batched, both transposed
    ((((2, 0), (1, 0)), ((), ())), (3, 2, 4), (3, 4, 5)),   # two contracting dims
    ((((1,), (0,)), ((), ())), (2, 3, 4), (3, 5)),          # 3-d lhs
])
def test_dot_general_gradients_other_layouts(dims, sx, sy):
    x, y = rng.standard_normal(sx).astype(F32), rng.standard_normal(sy).astype(F32)
    check_grads(lambda a, b: lax.dot_general(a, b, dims), (x, y), order=1, modes=("rev",))


# -------------------------------------------------------- broadcast_in_dim

@pytest.mark.parametrize("dims", [(1, 0), (0, 0), (2, 1)])
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_broadcast_in_dim_needs_increasing_dimensions(dims, mode):
    x = np.ones((3, 3), F32)
    f = lambda a: lax.broadcast_in_dim(a, (3, 3, 3), dims)
    with pytest.raises(errors.ShapeError, match="strictly increasing"):
        (spmd.jit(f) if mode == "jit" else f)(x)


def test_broadcast_in_dim_increasing_dimensions_still_work():
    x = rng.standard_normal((3, 1)).astype(F32)
    out = lax.broadcast_in_dim(x, (2, 3, 4), (1, 2))
    np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(x[None], (2, 3, 4)))


# ----------------------------------------------------- dead-buffer reuse

def test_dead_buffers_are_reused_but_never_views_or_outputs():
    def f(x, w):
        y = x * 2.0
        view = snp.reshape(y, (-1,))  # y's last use makes a view: its buffer stays
        z = snp.exp(x)                # a fresh result of y's shape
        h = snp.tanh(x @ w)
        g = h @ w                     # h is dead after this: a later result may reuse it
        k = snp.sin(g) * 3.0
        return view, z, k, snp.cos(k)

    x = rng.standard_normal((4, 4)).astype(F32)
    w = rng.standard_normal((4, 4)).astype(F32)
    src = spmd.jit(f).lower(x, w).compile().source
    assert "out=" in src
    got = spmd.jit(f)(x, w)
    want = f(x, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # Outputs never share a buffer with each other.
    arrays = [np.asarray(a) for a in got]
    for i in range(len(arrays)):
        for j in range(i + 1, len(arrays)):
            assert not np.shares_memory(arrays[i], arrays[j])


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_with_buffer_reuse_match_eager(seed):
    """Random DAGs of same-shape ufuncs, matmuls, views and reductions: the
    generated code (in-place and dead-buffer writes) equals eager evaluation."""
    r = np.random.default_rng(seed)
    ops = [
        lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b,
        lambda a, b: snp.tanh(a), lambda a, b: snp.sin(b),
        lambda a, b: a @ b, lambda a, b: a.T @ b, lambda a, b: a @ b.T,
        lambda a, b: a.T,                                        # a view
        lambda a, b: snp.reshape(snp.reshape(a, (-1,)), (3, 3)),  # views
        lambda a, b: a - snp.sum(b, axis=0),                      # reduce + broadcast
        lambda a, b: snp.maximum(a, 0.5) * 0.5,
    ]
    picks = [(int(r.integers(len(ops))), int(r.integers(100)), int(r.integers(100)))
             for _ in range(14)]
    n_out = int(r.integers(1, 4))

    def f(x, y):
        vals = [x, y]
        for k, i, j in picks:
            vals.append(ops[k](vals[i % len(vals)], vals[j % len(vals)]))
        return vals[-n_out:]

    x = r.standard_normal((3, 3)).astype(F32)
    y = r.standard_normal((3, 3)).astype(F32)
    x0, y0 = x.copy(), y.copy()
    jf = spmd.jit(f)
    for _ in range(2):  # a second call reuses nothing from the first
        got = jf(x, y)
        for a, b in zip(got, f(x, y)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
