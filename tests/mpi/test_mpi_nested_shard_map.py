"""A ``shard_map`` over processes inside a loop, ``cond``, ``checkpoint`` or custom
derivative, and a ``jit`` closing over an Array spread over processes.

Training code does exactly this: ``lax.scan`` over stacked layers whose body is a
Megatron layer written with ``shard_map``, ``checkpoint`` around that layer,
``custom_vjp`` around a ``shard_map``'d kernel, and ``grad`` of all of these.  Each
runs as one program partitioned over the mesh: every process computes only its own
blocks.  Values and gradients against numpy on the global arrays (read back with
``spmd.process_allgather``); each rank's results hold only its blocks; the printed
per-process programs have block shapes.  Runs on 4 ranks with one device each, on
2 ranks, and on 2 ranks with 2 devices each (``test_hybrid_subprocess.py``).
"""

from __future__ import annotations

import os
import sys
import tracemalloc

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import spmd  # noqa: E402
import spmd.numpy as snp  # noqa: E402
from spmd import NamedSharding as NS, P, lax  # noqa: E402
from spmd.compiler.engine import loops  # noqa: E402
from spmd.errors import SpreadOverProcessesError  # noqa: E402
from spmd.shard.partition.registry import PartitionError  # noqa: E402
from spmd.shard.arrays.sharded import ShardedArray, holds_full_value  # noqa: E402
from tests.shard.megatron_stack import (B, D, H, L, data as megatron_data,  # noqa: E402
                                         layer as _layer, np_layer as _np_layer,
                                         np_layer_vjp as _np_layer_vjp,
                                         np_stack as _np_stack, put,
                                         custom_vjp_layer)

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(180)]

X, W1, W2 = megatron_data(3)


# ------------------------------------------------------------------ the model

def _mesh(kind):
    """``(mesh, data axis, model axis)``: ``"1d"`` is ``(n,)`` with the weights split
    over ``'i'`` and the activations replicated; ``"2d"`` is ``(2, n // 2)`` with the
    batch split over ``'a'`` and the weights over ``'b'``."""
    n = spmd.device_count()
    if kind == "1d":
        return spmd.make_mesh((n,), ("i",)), None, "i"
    return spmd.make_mesh((2, n // 2), ("a", "b")), "a", "b"


def _global(a):
    assert isinstance(a, ShardedArray), type(a)
    return np.asarray(spmd.process_allgather(a))


def _put(mesh, data, model):
    """X, W1, W2 placed on ``mesh`` (stacked weights: layer dimension whole)."""
    return put(mesh, data, model, X, W1, W2)


def _close(got, want, tol=2e-5):
    np.testing.assert_allclose(_global(got), want, rtol=tol, atol=tol)


def _only_blocks(*arrays):
    """Each Array spread over processes holds only this process's blocks (no buffer of
    the global shape); at least one of them is split across processes."""
    split = 0
    for a in arrays:
        assert isinstance(a, ShardedArray)
        if not holds_full_value(a.sharding):
            shards = a.addressable_shards
            assert a._value is None and a.held_nbytes == sum(s.data.nbytes for s in shards)
            # (two devices of this process may hold the same block: count it once)
            distinct = {tuple((i.start, i.stop) for i in s.index) for s in shards}
            assert len(distinct) * shards[0].data.nbytes < a.nbytes, (a.sharding, distinct)
            split += 1
    assert split, [a.sharding for a in arrays]


KINDS = ["1d", "2d"]


# ------------------------------------------------------------------ scan over layers

def _scan_model(mesh, data, model):
    layer = _layer(mesh, data, model)

    def forward(x, w1s, w2s):
        return lax.scan(lambda c, w: (layer(c, *w), None), x, (w1s, w2s))[0]

    def loss(x, w1s, w2s):
        return 0.5 * snp.sum(forward(x, w1s, w2s) ** 2)

    return forward, loss


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_scan_over_layers_with_a_shard_map_body(kind, jit):
    mesh, data, model = _mesh(kind)
    forward, loss = _scan_model(mesh, data, model)
    wrap = spmd.jit if jit else (lambda f: f)
    x, w1s, w2s = _put(mesh, data, model)
    out, gx, g1, g2 = _np_stack(X, W1, W2)
    y = wrap(forward)(x, w1s, w2s)
    assert y.sharding == NS(mesh, P(data))
    assert y.block_until_ready() is y  # waits on this process's blocks only
    _close(y, out)
    grads = wrap(spmd.grad(loss, argnums=(0, 1, 2)))(x, w1s, w2s)
    for got, want in zip(grads, (gx, g1, g2)):
        _close(got, want)
    _only_blocks(*grads)


@pytest.mark.parametrize("kind", KINDS)
def test_scan_on_whole_inputs_and_the_printed_program(kind):
    mesh, data, model = _mesh(kind)
    forward, loss = _scan_model(mesh, data, model)
    out, gx, g1, g2 = _np_stack(X, W1, W2)
    # numpy inputs: every process holds them whole and slices its blocks
    _close(spmd.jit(forward)(X, W1, W2), out)
    _close(spmd.grad(loss, argnums=1)(X, W1, W2), g1)
    text = spmd.jit(forward).lower(X, W1, W2).as_text(executed=True)
    m, d = mesh.shape[model], mesh.shape[data] if data else 1
    assert "scan[" in text and "shard_map" not in text, text
    # the body's dot runs on this process's devices' blocks, stacked:
    # (B/d, D) @ (D, H/m) per device
    n_local = len(mesh.local_devices)
    assert f"f32[{n_local},{B // d},{H // m}] = tanh" in text, text
    assert f"f32[{n_local},{B},{H}]" not in text, text


# ------------------------------------------------------------------ checkpoint

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_checkpointed_layer_and_its_gradient(kind, jit):
    mesh, data, model = _mesh(kind)
    layer = spmd.checkpoint(_layer(mesh, data, model))

    def loss(x, w1s, w2s):
        for k in range(L):
            x = layer(x, w1s[k], w2s[k])
        return 0.5 * snp.sum(x ** 2)

    wrap = spmd.jit if jit else (lambda f: f)
    x, w1s, w2s = _put(mesh, data, model)
    out, gx, g1, g2 = _np_stack(X, W1, W2)
    _close(wrap(layer)(x, w1s[0], w2s[0]), _np_layer(X, W1[0], W2[0]))
    _close(wrap(layer)(X, W1[0], W2[0]), _np_layer(X, W1[0], W2[0]))
    value, grads = wrap(spmd.value_and_grad(loss, argnums=(0, 1, 2)))(x, w1s, w2s)
    np.testing.assert_allclose(_global(value), 0.5 * np.sum(out ** 2), rtol=1e-5)
    for got, want in zip(grads, (gx, g1, g2)):
        _close(got, want)


# ------------------------------------------------------------------ cond, fori_loop

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_cond_and_fori_loop_holding_a_shard_map(kind, jit):
    mesh, data, model = _mesh(kind)
    layer = _layer(mesh, data, model)
    wrap = spmd.jit if jit else (lambda f: f)

    def branchy(p, x, w1, w2):
        return lax.cond(p > 0, lambda v: layer(v, w1, w2), lambda v: v * 2.0, x)

    def looped(x, w1, w2):
        return lax.fori_loop(0, L, lambda i, c: layer(c, w1, w2), x)

    x, w1s, w2s = _put(mesh, data, model)
    w1, w2 = w1s[1], w2s[1]
    _close(wrap(branchy)(1.0, x, w1, w2), _np_layer(X, W1[1], W2[1]))
    _close(wrap(branchy)(-1.0, x, w1, w2), X * 2)
    want = X
    for _ in range(L):
        want = _np_layer(want, W1[1], W2[1])
    y = wrap(looped)(x, w1, w2)
    _close(y, want)
    if data is not None:  # the batch is split over 'a' (two processes' rows)
        _only_blocks(y)
    _, _, g1, g2 = _np_stack(X, np.stack([W1[1]] * L), np.stack([W2[1]] * L))
    grads = wrap(spmd.grad(lambda w1, w2: 0.5 * snp.sum(looped(x, w1, w2) ** 2),
                           argnums=(0, 1)))(w1, w2)
    _close(grads[0], g1.sum(0))
    _close(grads[1], g2.sum(0))
    gc = wrap(spmd.grad(lambda w1: snp.sum(branchy(1.0, x, w1, w2))))(w1)
    _close(gc, _np_layer_vjp(X, W1[1], W2[1], np.ones((B, D), np.float32))[1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_while_loop_holding_a_shard_map(kind, jit):
    """The predicate is replicated: every process runs the same number of iterations
    (the collectives in the body stay matched)."""
    mesh, data, model = _mesh(kind)
    layer = _layer(mesh, data, model)
    wrap = spmd.jit if jit else (lambda f: f)

    def until_small(x, w1, w2):
        def cond(c):
            return (c[0] < 10) & (snp.max(snp.abs(c[1])) > 0.05)

        return lax.while_loop(cond, lambda c: (c[0] + 1, layer(c[1], w1, w2) * 0.5),
                              (0, x))

    x, w1s, w2s = _put(mesh, data, model)
    want, k = X, 0
    while k < 10 and np.max(np.abs(want)) > 0.05:
        want, k = _np_layer(want, W1[0], W2[0]) * 0.5, k + 1
    steps, y = wrap(until_small)(x, w1s[0], w2s[0])
    assert int(_global(steps)) == k > 1
    _close(y, want)


# ------------------------------------------------------------------ custom_vjp

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_custom_vjp_around_a_shard_map(kind, jit):
    """A kernel with a hand-written backward pass, both passes written with
    shard_map (the backward one sums the input gradient over the model axis and the
    weight gradients over the data axis)."""
    mesh, data, model = _mesh(kind)
    kernel = custom_vjp_layer(mesh, data, model)
    wrap = spmd.jit if jit else (lambda f: f)
    x, w1s, w2s = _put(mesh, data, model)
    _close(wrap(kernel)(x, w1s[0], w2s[0]), _np_layer(X, W1[0], W2[0]))
    g = np.ones((B, D), np.float32)
    want = _np_layer_vjp(X, W1[0], W2[0], g)
    grads = wrap(spmd.grad(lambda *a: snp.sum(kernel(*a)), argnums=(0, 1, 2)))(
        x, w1s[0], w2s[0])
    for got, w in zip(grads, want):
        _close(got, w)
    _only_blocks(*grads)


# ------------------------------------------------------------------ closures

ROWS = 16 * 1024  # 16K x 4 float32 = 256 KiB global: large next to the temporaries


def _big(mesh, data, model):
    """A (ROWS, D) data set split by rows over every mesh axis, and its numpy value."""
    axes = tuple(a for a in (data, model) if a)
    x = (np.arange(ROWS * D, dtype=np.float32).reshape(ROWS, D) % 7 - 3) / 4
    return spmd.device_put(x, NS(mesh, P(axes))), x


@pytest.mark.parametrize("kind", KINDS)
def test_jit_closing_over_a_spread_array_and_its_gradient(kind):
    mesh, data, model = _mesh(kind)
    xs, x = _big(mesh, data, model)
    traces = []

    def loss(w):
        traces.append(1)
        return 0.5 * snp.mean(snp.tanh(xs @ w) ** 2)

    w = W1[0]
    a = np.tanh(x @ w)
    want_loss = 0.5 * np.mean(a ** 2)
    want_grad = x.T @ (a * (1 - a * a)) / a.size
    f = spmd.jit(loss)
    np.testing.assert_allclose(_global(f(w)), want_loss, rtol=1e-5)
    np.testing.assert_allclose(_global(f(w)), want_loss, rtol=1e-5)
    assert len(traces) == 1  # traced once: the closed-over Array is cached as a constant
    # later calls run its call plan (spmd.shard.call.plan), the Array as a leading leaf
    assert [type(p.plan).__name__ for p in f._plans.values()] == ["Plan"]
    g = spmd.jit(spmd.grad(loss))(w)
    np.testing.assert_allclose(_global(g), want_grad, rtol=1e-4, atol=1e-6)
    g = spmd.grad(spmd.jit(loss))(w)
    np.testing.assert_allclose(_global(g), want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_a_closed_over_spread_array_is_never_gathered(kind):
    """Each process computes on its rows of the closed-over Array: the peak of traced
    allocations stays below one buffer of the global shape, and the result holds
    only this process's blocks."""
    mesh, data, model = _mesh(kind)
    xs, x = _big(mesh, data, model)
    f = spmd.jit(lambda w: snp.tanh(xs @ w) * 2.0)
    g = spmd.jit(lambda w: snp.tanh(xs @ w) * 2.0,
                 in_shardings=NS(mesh, P()), out_shardings=NS(mesh, P(xs.sharding.spec[0])))
    w = np.eye(D, dtype=np.float32)
    for fn in (f, g):
        # Traced and compiled outside the measured call, past the switch to compiled
        # loops (whose compilation, in a background thread, would be counted).
        for _ in range(loops.SWITCH_AT):
            fn(w)
        loops.wait_compiled()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        y = fn(w)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        assert y.sharding == xs.sharding
        _only_blocks(y)
        assert peak < x.nbytes, (peak, x.nbytes)
        _close(y, np.tanh(x) * 2.0)


@pytest.mark.parametrize("kind", KINDS)
def test_closing_over_a_spread_array_inside_a_loop_body(kind):
    """A scan body closing over a spread Array (and calling a shard_map) under jit."""
    mesh, data, model = _mesh(kind)
    layer = _layer(mesh, data, model)
    x, w1s, w2s = _put(mesh, data, model)

    def forward(w2s):
        return lax.scan(lambda c, k: (layer(c, w1s[k], w2s[k]), None), x,
                        np.arange(L))[0]

    out, _, _, g2 = _np_stack(X, W1, W2)
    _close(spmd.jit(forward)(W2), out)
    _close(spmd.jit(spmd.grad(lambda w: 0.5 * snp.sum(forward(w) ** 2)))(W2), g2)


def _closing(kind):
    """A function of ``w`` closing over a spread Array, wrapped in ``kind``, and its
    value (or gradient) in numpy."""
    mesh, data, model = _mesh("2d")
    xs, x = _big(mesh, data, model)
    w = W1[0][:, :D]

    def f(w):
        return snp.sum(snp.tanh(xs @ w))

    value = np.sum(np.tanh(x @ w))
    grad = x.T @ (1 - np.tanh(x @ w) ** 2)
    # The scale of each sum's terms (what float32 rounding of a reordered sum is
    # relative to: an entry whose terms cancel is small against its error).
    _closing.scale = max(float(np.abs(x).T.sum(axis=0).max()), float(np.abs(value)))

    @spmd.custom_vjp
    def cf(w):
        return f(w)

    cf.defvjp(lambda w: (f(w), w), lambda w, g: (g * grad,))
    cases = {
        "checkpoint": (lambda: spmd.checkpoint(f)(w), value),
        "jit(checkpoint)": (lambda: spmd.jit(spmd.checkpoint(f))(w), value),
        "grad(jit(checkpoint))": (lambda: spmd.grad(spmd.jit(spmd.checkpoint(f)))(w), grad),
        "custom_vjp": (lambda: cf(w), value),
        "jit(custom_vjp)": (lambda: spmd.jit(cf)(w), value),
        "jit(grad(custom_vjp))": (lambda: spmd.jit(spmd.grad(cf))(w), grad),
        "jit(jit)": (lambda: spmd.jit(lambda v: spmd.jit(f)(v) * 2.0)(w), 2 * value),
        "vmap(jit)": (lambda: spmd.vmap(spmd.jit(f))(np.stack([w, 2 * w])),
                      np.array([value, np.sum(np.tanh(x @ (2 * w)))])),
        "cond": (lambda: lax.cond(True, f, lambda v: snp.float32(0.0), w), value),
        "grad(jit(in_shardings))": (
            lambda: spmd.grad(spmd.jit(f, in_shardings=NS(mesh, P())))(w), grad),
    }
    return cases[kind]


@pytest.mark.parametrize("kind", ["checkpoint", "jit(checkpoint)", "grad(jit(checkpoint))",
                                  "custom_vjp", "jit(custom_vjp)", "jit(grad(custom_vjp))",
                                  "jit(jit)", "vmap(jit)", "cond", "grad(jit(in_shardings))"])
def test_transformed_functions_closing_over_a_spread_array(kind):
    run, want = _closing(kind)
    # (float32 sums of 16K terms in another order: seen 2.6e-5 of the terms' scale on
    # this machine's BLAS, where a relative 1e-4 failed on an entry whose terms cancel;
    # a lost or doubled block would be off by a quarter of the scale)
    np.testing.assert_allclose(_global(run()), want, rtol=1e-4, atol=1e-4 * _closing.scale)


def test_a_partitioned_jit_closing_over_an_array_of_another_mesh_raises():
    n = spmd.device_count()
    other = spmd.make_mesh((n,), ("j",))
    mesh, _, _ = _mesh("2d")
    xs = spmd.device_put(X, NS(other, P("j")))
    f = spmd.jit(lambda w: xs @ w, in_shardings=NS(mesh, P()))
    with pytest.raises(PartitionError, match="closes over an Array .* another mesh"):
        f(W1[0])


def test_a_loop_over_shard_maps_of_two_meshes_raises_naming_the_fix():
    """A scan whose body holds shard_maps over two meshes of the same devices cannot
    run as one program partitioned over one of them."""
    n = spmd.device_count()
    m1 = spmd.make_mesh((n,), ("i",))
    m2 = spmd.make_mesh((2, n // 2), ("a", "b"))
    f1 = spmd.shard_map(lambda b: b * 2.0, mesh=m1, in_specs=P("i"), out_specs=P("i"))
    f2 = spmd.shard_map(lambda b: b + 1.0, mesh=m2, in_specs=P("a"), out_specs=P("a"))

    def body(c, _):
        return f2(f1(c)), None

    with pytest.raises(SpreadOverProcessesError, match="scan: its body holds a shard_map .* "
                       "use one mesh for every shard_map"):
        lax.scan(body, X, None, length=2)


def test_the_printed_program_of_a_jit_closing_over_a_spread_array():
    mesh, data, model = _mesh("1d")
    layer = _layer(mesh, data, model)
    w1 = spmd.device_put(W1[0], NS(mesh, P(None, model)))
    f = spmd.jit(lambda x, w2: layer(x, w1, w2))
    text = f.lower(X, W2[0]).as_text(executed=True)
    n_local, m = len(mesh.local_devices), mesh.shape[model]
    # the closed-over weights come as this process's blocks, never whole
    assert text.startswith(f"{{ lambda ; a:f32[{n_local},{D},{H // m}] "), text
    assert f"f32[{D},{H}]" not in text, text
    _close(f(X, W2[0]), _np_layer(X, W1[0], W2[0]))


def test_compiling_a_shard_map_over_processes_for_one_process_raises():
    mesh, data, model = _mesh("1d")
    f = spmd.jit(lambda x, w1, w2: lax.fori_loop(
        0, 2, lambda i, c: _layer(mesh, data, model)(c, w1, w2), x))
    _close(f(X, W1[0], W2[0]), _np_layer(_np_layer(X, W1[0], W2[0]), W1[0], W2[0]))
    with pytest.raises(SpreadOverProcessesError, match="compiled for this process alone.*"
                       "Call the jitted function itself"):
        f.lower(X, W1[0], W2[0]).compile()(X, W1[0], W2[0])


def test_an_eager_shard_map_of_a_replicated_array_runs_its_collectives():
    """A replicated Array (whole on every process) enters an eager body as its plain
    value, so the body's psum runs as the body's collective (the bwd of the eager
    custom_vjp above passes one)."""
    mesh, data, model = _mesh("1d")
    xr = spmd.device_put(X, NS(mesh, P()))
    f = spmd.shard_map(lambda x, w: lax.psum(x @ w, model), mesh=mesh,
                       in_specs=(P(), P(None, model)), out_specs=P())
    y = f(xr, W1[0])
    m = mesh.shape[model]
    want = sum(X @ W1[0][:, k * H // m:(k + 1) * H // m] for k in range(m))
    _close(y, want)
