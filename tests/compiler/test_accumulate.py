"""Products added into the buffer of the value they are summed with
(spmd/compiler/passes/accumulate.py): where the generated code calls ``_gemm_into``, where it
must not (the summand read again, a caller's array, a broadcast, a batch of several
products, small or integer sums), and that the results are numpy's either way, from
several threads too."""

from __future__ import annotations

import re

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.passes.accumulate import MIN_ELEMENTS
from spmd.compiler.core.jit import _executables

RTOL = 2e-5


def _source(f, *args) -> str:
    return f.lower(*args).compile().source


def _bodies_with(marker: str) -> list:
    return [e for per in list(_executables.values()) for key, e in per.items()
            if marker in e.source]


def _mats(seed, *shapes, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sum_of_two_products_is_one_buffer(dtype):
    a, b, c, d = _mats(0, (64, 300), (300, 256), (64, 200), (200, 256), dtype=dtype)
    for f in (lambda a, b, c, d: a @ b + c @ d, lambda a, b, c, d: c @ d + a @ b):
        jf = spmd.jit(f)
        assert "_gemm_into(" in _source(jf, a, b, c, d)
        np.testing.assert_allclose(np.asarray(jf(a, b, c, d)), f(a, b, c, d), rtol=RTOL,
                                   atol=1e-4)


def test_a_loop_accumulates_into_its_carry_and_leaves_the_callers_array():
    xs, gs = _mats(1, (6, 64, 256), (6, 64, 256))
    acc0 = np.full((256, 256), 0.5, np.float32)
    f = spmd.jit(lambda xs, gs, acc: lax.fori_loop(
        0, 6, lambda i, acc: acc + xs[i].T @ gs[i], acc))
    expected = acc0 + np.einsum("bik,bil->kl", xs, gs)
    for _ in range(2):  # the carry is the loop's own copy: acc0 stays as it was
        np.testing.assert_allclose(np.asarray(f(xs, gs, acc0)), expected, rtol=RTOL,
                                   atol=1e-3)
        np.testing.assert_array_equal(acc0, np.full((256, 256), 0.5, np.float32))
    assert any(b.consumed for b in _bodies_with("_gemm_into("))


def test_stacked_gradients_accumulate_slab_by_slab():
    xs, gs, ws = _mats(2, (5, 64, 128), (5, 64, 128), (3, 128, 128))

    def f(xs, gs):
        def body(i, acc):
            x, g = xs[i], gs[i]
            return acc + snp.stack([x.T @ g, (x * 2).T @ g, x.T @ (g + 1)])
        return lax.fori_loop(0, 5, body, snp.zeros((3, 128, 128), np.float32))

    got = np.asarray(spmd.jit(f)(xs, gs))
    x, g = xs, gs
    expected = np.stack([np.einsum("bik,bil->kl", x, g), np.einsum("bik,bil->kl", 2 * x, g),
                         np.einsum("bik,bil->kl", x, g + 1)])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-3)
    # The loop body: each product added into its slab of the carry, no stacked buffer.
    assert any(b.source.count("_gemm_into(") == 3 and "xp.empty(" not in b.source
               for b in _bodies_with("_gemm_into("))


@pytest.mark.parametrize("lead", ["added", "removed"])
def test_a_product_given_leading_axes_of_one(lead):
    xs, gs = _mats(8, (4, 1, 64, 128), (4, 1, 64, 128))

    def run(xs, gs):
        def body(i, acc):
            x, g = xs[i], gs[i]  # (1, 64, 128): a process's block of one device
            if lead == "added":  # (128, 128) product into a (1, 128, 128) sum
                return acc + (x[0].T @ g[0])[None]
            prod = snp.matmul(x.transpose(0, 2, 1), g)  # (1, 128, 128) into (128, 128)
            return acc + prod.reshape(128, 128)

        shape = (1, 128, 128) if lead == "added" else (128, 128)
        return lax.fori_loop(0, 4, body, snp.zeros(shape, np.float32))

    got = np.asarray(spmd.jit(run)(xs, gs)).reshape(128, 128)
    expected = np.einsum("bik,bil->kl", xs[:, 0], gs[:, 0])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-3)
    # The product written into the carry seen in the product's shape (a view).
    view = "(128, 128))" if lead == "added" else "(1, 128, 128))"
    assert any(re.search(r"_gemm_into\(.*out=v\d+\.reshape\(" + re.escape(view), b.source)
               for b in _bodies_with("_gemm_into("))


def test_a_reshape_beyond_leading_ones_is_a_product_and_an_add():
    xs, gs = _mats(9, (3, 64, 128), (3, 64, 128))
    f = spmd.jit(lambda xs, gs: lax.fori_loop(
        0, 3, lambda i, acc: acc + (xs[i].T @ gs[i]).reshape(-1),
        snp.zeros((128 * 128,), np.float32)))
    got = np.asarray(f(xs, gs))
    np.testing.assert_allclose(got, np.einsum("bik,bil->kl", xs, gs).reshape(-1), rtol=RTOL,
                               atol=1e-3)
    bodies = _bodies_with("reshape((16384,))")
    assert bodies and not any("_gemm_into(" in b.source for b in bodies)


def test_the_gradient_of_a_weight_used_twice():
    x, y, w = _mats(3, (256, 128), (200, 128), (128, 128))

    def loss(w, x, y):  # (a tied weight: its gradient is the sum of two products)
        return ((x @ w) ** 2).sum() + (snp.tanh(y @ w) ** 2).sum()

    g = spmd.jit(spmd.grad(loss))
    assert "_gemm_into(" in _source(g, w, x, y)
    got = np.asarray(g(w, x, y))
    xd, yd, wd = (v.astype(np.float64) for v in (x, y, w))
    t = np.tanh(yd @ wd)
    expected = xd.T @ (2 * (xd @ wd)) + yd.T @ (2 * t * (1 - t * t))
    # (Sums of large terms that cancel: float32 rounding against the largest.)
    np.testing.assert_allclose(got, expected, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("case", ["read again", "caller's array", "broadcast", "batch",
                                  "small", "integer", "vectors"])
def test_where_it_must_not_the_sum_is_as_written(case):
    a, b, acc = _mats(4, (64, 200), (200, 256), (64, 256))
    if case == "read again":
        f = lambda acc, a, b: (lambda s: (s + a @ b, s * 2))(acc * 1.5)  # noqa: E731
        args = (acc, a, b)
    elif case == "caller's array":
        f = lambda acc, a, b: acc + a @ b  # noqa: E731
        args = (acc, a, b)
    elif case == "broadcast":
        f = lambda acc, a, b: (acc[:1] * 1.0) + a @ b  # noqa: E731
        args = (acc, a, b)
    elif case == "batch":  # four products each: the engine's threads share them
        a, b, c = _mats(5, (4, 64, 200), (4, 200, 256), (4, 64, 200))
        f = lambda acc, a, b: snp.matmul(a, b) + snp.matmul(acc, b)  # noqa: E731
        args = (c, a, b)
    elif case == "small":
        a, b, acc = _mats(6, (8, 16), (16, 8), (8, 8))
        assert acc.size < MIN_ELEMENTS
        f = lambda acc, a, b: a @ b + (acc * 2.0) @ b[:8, :8]  # noqa: E731
        args = (acc, a, b)
    elif case == "vectors":  # vector-matrix products of MIN_ELEMENTS results
        a, b, acc = _mats(7, (8,), (8, MIN_ELEMENTS), (8, MIN_ELEMENTS))
        f = lambda acc, a, b: a @ b + (a * 2) @ acc  # noqa: E731
        args = (acc, a, b)
    else:
        a = np.arange(64 * 200).reshape(64, 200) % 7
        b = np.arange(200 * 256).reshape(200, 256) % 5
        f = lambda acc, a, b: a @ b + (a + 1) @ b  # noqa: E731
        args = (acc, a, b)
    before = [np.array(x) for x in args]
    jf = spmd.jit(f)
    assert "_gemm_into(" not in _source(jf, *args)
    got, expected = jf(*args), f(*before)
    for g, e in zip(got if isinstance(got, tuple) else [got],
                    expected if isinstance(expected, tuple) else [expected]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=RTOL, atol=1e-3)
    for x, x0 in zip(args, before):
        np.testing.assert_array_equal(x, x0)


def test_threads_run_an_accumulating_program_at_once(each_on_a_thread):
    xs, gs = _mats(7, (4, 64, 256), (4, 64, 256))
    f = spmd.jit(lambda xs, gs: lax.fori_loop(
        0, 4, lambda i, acc: acc + xs[i].T @ gs[i], snp.zeros((256, 256), np.float32)))
    expected = np.einsum("bik,bil->kl", xs, gs)
    f(xs, gs)
    results = [None] * 6

    def call(k):
        results[k] = np.asarray(f(xs * (k + 1), gs))

    each_on_a_thread(call, len(results))
    for k, r in enumerate(results):
        np.testing.assert_allclose(r, expected * (k + 1), rtol=RTOL, atol=1e-3)
