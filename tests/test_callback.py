"""``spmd.pure_callback``: a host function inside transformed code, against numpy;
its vmap methods, inside a shard_map (per device), under jit with shardings (whole
values), and its errors."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P
from spmd.callback import CallbackError
from spmd.errors import ArgumentError

X = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
ROW = spmd.ShapeDtypeStruct((6,), np.float32)


def _sorter(calls):
    def host(x, shift=0.0):
        calls.append(np.shape(x))
        # A shift batched with x (expand_dims, broadcast_all) is one per row.
        s = np.asarray(shift)
        return (np.sort(x, axis=-1) + (s[..., None] if s.ndim else s)).astype(np.float32)
    return host


def test_under_jit_and_eagerly():
    calls = []
    f = lambda r: spmd.pure_callback(_sorter(calls), ROW, r, shift=1.0)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(f(X[0])), np.sort(X[0]) + 1)
    jf = spmd.jit(f)
    np.testing.assert_array_equal(np.asarray(jf(X[1])), np.sort(X[1]) + 1)
    np.testing.assert_array_equal(np.asarray(jf(X[2])), np.sort(X[2]) + 1)
    assert calls == [(6,)] * 3  # once per run, on host values
    # Pytrees of results.
    pair = spmd.jit(lambda r: spmd.pure_callback(lambda v: {"lo": v.min(keepdims=True),
                                                            "hi": v.max(keepdims=True)},
                                                 {"lo": spmd.ShapeDtypeStruct((1,), np.float32),
                                                  "hi": spmd.ShapeDtypeStruct((1,), np.float32)},
                                                 r))(X[0])
    assert float(pair["lo"][0]) == X[0].min() and float(pair["hi"][0]) == X[0].max()


@pytest.mark.parametrize("method,shapes", [(None, [(6,)] * 4), ("sequential", [(6,)] * 4),
                                           ("expand_dims", [(4, 6)]),
                                           ("broadcast_all", [(4, 6)])])
def test_vmap_methods(method, shapes):
    calls = []
    host = _sorter(calls)
    f = spmd.vmap(lambda r, s: spmd.pure_callback(host, ROW, r, s, vmap_method=method),
                  in_axes=(0, None))
    out = spmd.jit(f)(X, np.float32(2.0))
    np.testing.assert_array_equal(np.asarray(out), np.sort(X, axis=-1) + 2)
    assert calls == shapes
    # Nested vmaps: the outer level runs element by element, the inner by its method.
    calls.clear()
    nested = spmd.vmap(spmd.vmap(lambda r: spmd.pure_callback(host, ROW, r,
                                                              vmap_method=method)))
    out = nested(X.reshape(2, 2, 6))
    np.testing.assert_array_equal(np.asarray(out), np.sort(X, axis=-1).reshape(2, 2, 6))


def test_in_a_shard_map_each_device_calls_it_on_its_blocks():
    calls = []
    mesh = spmd.make_mesh((4,), ("i",))
    f = spmd.shard_map(lambda b: spmd.pure_callback(_sorter(calls), spmd.ShapeDtypeStruct(
        (1, 6), np.float32), b), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    for run in (f, spmd.jit(f)):
        calls.clear()
        np.testing.assert_array_equal(np.asarray(run(X)), np.sort(X, axis=-1))
        assert calls == [(1, 6)] * 4


def test_under_jit_with_shardings_it_sees_whole_values():
    calls = []
    mesh = spmd.make_mesh((4,), ("i",))
    xs = spmd.device_put(X, NamedSharding(mesh, P("i")))
    f = spmd.jit(lambda v: spmd.pure_callback(_sorter(calls), spmd.ShapeDtypeStruct(
        X.shape, np.float32), v) * 2, in_shardings=NamedSharding(mesh, P("i")))
    np.testing.assert_array_equal(np.asarray(f(xs)), 2 * np.sort(X, axis=-1))
    assert (4, 6) in calls


def test_errors_are_named():
    # float64 asked for and made is float32 without x64, as the program's other values.
    out = spmd.jit(lambda r: spmd.pure_callback(lambda v: v.astype(np.float64),
                                                spmd.ShapeDtypeStruct((6,), np.float64), r))(X[0])
    assert out.dtype == np.float32
    with pytest.raises(CallbackError, match=r"pure_callback: result 0 of <lambda> is "
                                            r"float32\[2\], but result_shape_dtypes says "
                                            r"float32\[6\]"):
        spmd.jit(lambda r: spmd.pure_callback(lambda v: v[:2], ROW, r))(X[0])
    with pytest.raises(CallbackError, match=r"returned 2 arrays, but result_shape_dtypes "
                                            r"gives 1"):
        spmd.pure_callback(lambda v: (v, v), ROW, X[0])
    with pytest.raises(CallbackError, match="pure_callback is not differentiable"):
        spmd.grad(lambda r: spmd.pure_callback(np.sort, ROW, r).sum())(X[0])
    with pytest.raises(ArgumentError, match=r"vmap_method='batched' is not one of"):
        spmd.pure_callback(np.sort, ROW, X[0], vmap_method="batched")
    with pytest.raises(ArgumentError, match=r"result_shape_dtypes leaf 0 is a int"):
        spmd.pure_callback(np.sort, 3, X[0])
    with pytest.raises(ArgumentError, match="callback must be callable"):
        spmd.pure_callback("sort", ROW, X[0])


def test_io_callback_and_debug_callback_are_effects_in_program_order():
    from spmd.experimental import io_callback

    log = []

    def f(x):
        spmd.debug.callback(lambda v: log.append(("debug", float(v.sum()))), x)
        y = io_callback(lambda v: (log.append(("io", v.shape)), v * 2)[1], ROW, x)
        io_callback(lambda v: log.append(("unused", 0)), None, x)  # no result: still runs
        return y + 1

    out = spmd.jit(f)(X[0])
    np.testing.assert_allclose(np.asarray(out), X[0] * 2 + 1, rtol=1e-6)
    assert log == [("debug", pytest.approx(float(X[0].sum()))), ("io", (6,)), ("unused", 0)]
    # Per element under vmap, in order; per device in a shard_map.
    log.clear()
    spmd.vmap(f)(X[:2])
    assert [k for k, _ in log] == ["debug", "debug", "io", "io", "unused", "unused"]
    log.clear()
    mesh = spmd.make_mesh((4,), ("i",))
    spmd.jit(spmd.shard_map(lambda b: (spmd.debug.callback(lambda v: log.append(v.shape), b),
                                       b)[1], mesh=mesh, in_specs=P("i"), out_specs=P("i")))(X)
    assert log == [(1, 6)] * 4
    # Under grad, debug.callback sees the primal values; an io_callback with results
    # is not differentiable.
    log.clear()
    g = spmd.grad(lambda v: (spmd.debug.callback(lambda w: log.append(float(w.sum())), v),
                             (v ** 2).sum())[1])(X[0])
    np.testing.assert_allclose(np.asarray(g), 2 * X[0], rtol=1e-6)
    assert log == [pytest.approx(float(X[0].sum()))]
    with pytest.raises(CallbackError, match="io_callback is not differentiable"):
        spmd.grad(lambda v: io_callback(lambda w: w, ROW, v).sum())(X[0])
