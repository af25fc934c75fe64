"""spmd.compiler.transforms.split: a traced function cut in two by its outputs."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.transforms.split import split
from spmd.errors import OutputTypeError


def _layers(w, x):
    for k in range(w.shape[0]):
        x = snp.tanh(x @ w[k])
    return x


def _backward(w, x, ct):
    """A stack of layers' backward: (the input's cotangent, the weights' gradient)."""
    _, back = spmd.vjp(_layers, w, x)
    gw, gx = back(ct)
    return gx, gw


def _args(layers=3, rows=4, d=5, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(layers, d, d)).astype(np.float32) / np.sqrt(d),
            rng.normal(size=(rows, d)).astype(np.float32),
            rng.normal(size=(rows, d)).astype(np.float32))


def _count(closed, name):
    return sum(e.primitive.name == name for e in closed.eqns)


def test_the_two_parts_give_the_functions_results_and_compute_nothing_twice():
    w, x, ct = _args()
    first, rest = split(_backward, w, x, ct)
    gx, carried = first(w, x, ct)
    gw = rest(carried)
    want_gx, want_gw = _backward(w, x, ct)
    np.testing.assert_allclose(np.asarray(gx), np.asarray(want_gx), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(want_gw), rtol=1e-6)
    # The products: the forward recomputed and the input's cotangent in the first part
    # (2 per layer), the weights' gradient in the rest (1 per layer); 3 per layer in
    # all, as in the whole backward.
    whole = spmd.make_jaxpr(_backward)(w, x, ct)
    one = spmd.make_jaxpr(lambda w, x, ct: first(w, x, ct))(w, x, ct)
    two = spmd.make_jaxpr(rest)(carried)
    assert _count(one, "dot_general") == 6 and _count(two, "dot_general") == 3
    assert _count(whole, "dot_general") == 9
    # What the rest reads: each layer's input and its pre-activation's cotangent.
    assert len(carried) == 6
    assert first.out_avals[0].shape == x.shape and len(first.out_avals) == 1 + len(carried)


def test_the_rest_reads_arguments_and_constants_it_needs():
    scale = np.float32(3.0)
    table = np.arange(4, dtype=np.float32)
    first, rest = split(lambda a, b: (a * 2.0, (b * scale + table).sum()), np.ones(4, np.float32),
                        np.ones(4, np.float32))
    y, carried = first(np.ones(4, np.float32), np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(y), np.full(4, 2.0))
    assert float(rest(carried)) == float((np.full(4, 2.0) * 3.0 + table).sum())
    assert len(carried) == 1  # b, handed over as it is


def test_closed_over_values_are_read_as_they_were_when_traced():
    table = np.ones(3, np.float32)
    first, rest = split(lambda a: (a + table, (a * table).sum()), np.zeros(3, np.float32))
    table[:] = 100.0  # mutated after tracing: a cached program must not see it
    y, carried = first(np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(y), np.full(3, 3.0))
    assert float(rest(carried)) == 6.0


@pytest.mark.parametrize("how", ["jit", "grad", "vmap"])
def test_the_parts_under_transformations(how):
    """Split inside a jitted function closing over its tracers; the parts under
    ``grad`` and ``vmap``: the results of the unsplit function."""
    w, x, ct = _args(seed=1)

    def both(w, x, ct):
        first, rest = split(lambda x: _backward(w, x, ct), x)
        gx, carried = first(x)
        return (gx * gx).sum() + (rest(carried) ** 2).sum()

    def plain(w, x, ct):
        gx, gw = _backward(w, x, ct)
        return (gx * gx).sum() + (gw ** 2).sum()

    if how == "jit":
        got, want = spmd.jit(both)(w, x, ct), plain(w, x, ct)
    elif how == "grad":
        got, want = spmd.grad(both, argnums=0)(w, x, ct), spmd.grad(plain, argnums=0)(w, x, ct)
    else:
        xs = np.stack([x, 2 * x, -x])
        got = spmd.vmap(both, in_axes=(None, 0, None))(w, xs, ct)
        want = spmd.vmap(plain, in_axes=(None, 0, None))(w, xs, ct)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)


def test_an_effect_the_rest_needs_runs_in_the_first_part_in_order():
    seen = []

    def f(a):
        spmd.debug.callback(lambda v: seen.append(float(v)), a.sum())
        return a * 2.0, a.sum() * 3.0

    first, rest = split(f, np.ones(2, np.float32))
    seen.clear()  # (tracing may have run nothing, but never counts)
    y, carried = first(np.full(2, 5.0, np.float32))
    assert seen == [10.0]
    assert float(rest(carried)) == 30.0
    assert seen == [10.0]  # the rest runs no effect again


def test_threads_split_and_run_their_own_functions(each_on_a_thread):
    results = {}

    def work(k):
        w, x, ct = _args(seed=k)
        first, rest = split(_backward, w, x, ct)
        for _ in range(5):
            gx, carried = first(w, x, ct)
            gw = rest(carried)
        results[k] = (np.asarray(gx), np.asarray(gw), _backward(w, x, ct))

    each_on_a_thread(work, 4)
    assert len(results) == 4
    for gx, gw, (want_gx, want_gw) in results.values():
        np.testing.assert_allclose(gx, np.asarray(want_gx), rtol=1e-6)
        np.testing.assert_allclose(gw, np.asarray(want_gw), rtol=1e-6)


def test_a_function_not_returning_a_pair_is_an_error_naming_the_fix():
    with pytest.raises(OutputTypeError, match=r"must return a pair \(first, rest\)"):
        split(lambda a: a * 2.0, np.ones(2, np.float32))
    with pytest.raises(OutputTypeError, match="rest"):
        split(lambda a: (a, "text"), np.ones(2, np.float32))
