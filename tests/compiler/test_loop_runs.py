"""Loops that take their initial carries over from the code around them
(spmd/compiler/ops/loop_runs.py, ``rules["donated_impl"]`` of scan and while): a
value made by the program, read by the loop alone and with no view of it, is not
copied before the loop; one that something else still sees (a program argument, a
constant, a value also returned or read again, a view of another value) is.  The
results against numpy on the same steps, and the inputs never written."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.ops import loop_runs


def _copied(fn, *args):
    """What each loop of ``spmd.jit(fn)`` copies before it runs (the carries it does
    not take over), in the order they were compiled, and ``fn``'s results."""
    seen = []
    runners = {"scan_runner": loop_runs.scan_runner, "while_runner": loop_runs.while_runner}

    def spy(orig):
        def run(*a, **k):
            out = orig(*a, **k)
            if "given" in k:  # the generated code's call (codegen's donated_impl)
                seen.append(out[0].copied)
            return out
        return run

    for name, orig in runners.items():
        setattr(loop_runs, name, spy(orig))
    try:
        got = spmd.jit(fn)(*args)
    finally:
        for name, orig in runners.items():
            setattr(loop_runs, name, orig)
    return seen, got


def _fill(n):
    """A scan body writing row ``i`` of its (n, 3) carry (in place: the loop owns it)
    and adding it to a running sum."""
    def body(c, i):
        buf, total = c
        buf = buf.at[i % n].set(snp.full((3,), i, np.float32) + total)
        return (buf, total + buf[i % n]), buf[i % n] * 2.0
    return body


def _numpy_fill(buf, total, steps, n):
    buf, total, ys = buf.copy(), total.copy(), []
    for i in steps:
        buf[i % n] = np.full(3, i, np.float32) + total
        total = total + buf[i % n]
        ys.append(buf[i % n] * 2.0)
    return buf, total, np.stack(ys) if ys else np.zeros((0, 3), np.float32)


def test_a_loop_takes_over_the_carries_of_the_loop_before():
    def f(b0):
        buf, total = b0 * 1.0, snp.zeros(3, np.float32)  # made here: the first loop's
        (buf, total), ys1 = lax.scan(_fill(4), (buf, total), np.arange(5))
        (buf, total), ys2 = lax.scan(_fill(4), (buf, total), np.arange(5, 9))
        return buf, total, ys1, ys2

    b0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    copied, (buf, total, ys1, ys2) = _copied(f, b0)
    assert copied == [(), ()], copied
    wb, wt, wy1 = _numpy_fill(b0, np.zeros(3, np.float32), range(5), 4)
    wb, wt, wy2 = _numpy_fill(wb, wt, range(5, 9), 4)
    np.testing.assert_array_equal(np.asarray(buf), wb)
    np.testing.assert_array_equal(np.asarray(total), wt)
    np.testing.assert_array_equal(np.asarray(ys1), wy1)
    np.testing.assert_array_equal(np.asarray(ys2), wy2)
    np.testing.assert_array_equal(b0, np.arange(12, dtype=np.float32).reshape(4, 3))


@pytest.mark.parametrize("seen_by", ["returned", "read_after", "argument", "constant",
                                     "view"])
def test_a_carry_something_else_sees_is_copied(seen_by):
    """The first loop's result also returned, or read after the second loop; the
    caller's array; a constant; a reshaped view of a value read again: each keeps its
    value, and the loop copies it."""
    const = np.ones((4, 3), np.float32)

    def f(b0):
        start = {"returned": b0 * 1.0, "read_after": b0 * 1.0, "argument": b0,
                 "constant": const, "view": (b0 * 1.0).reshape(2, 6)}[seen_by]
        init = start.reshape(4, 3) if seen_by == "view" else start
        if seen_by in ("returned", "read_after"):
            (init, _), _ = lax.scan(_fill(4), (init, snp.zeros(3, np.float32)),
                                    np.arange(2))
        (buf, total), _ = lax.scan(_fill(4), (init, snp.zeros(3, np.float32)),
                                   np.arange(2, 7))
        other = init if seen_by != "view" else start
        if seen_by == "read_after":
            return buf, total, other * 1.0
        return buf, total, other

    b0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    copied, (buf, total, other) = _copied(f, b0)
    assert copied[-1] == (0,), copied  # the second loop copies its buffer
    start = {"constant": const}.get(seen_by, b0)
    if seen_by in ("returned", "read_after"):
        start, _, _ = _numpy_fill(b0, np.zeros(3, np.float32), range(2), 4)
    wb, wt, _ = _numpy_fill(start, np.zeros(3, np.float32), range(2, 7), 4)
    np.testing.assert_array_equal(np.asarray(buf), wb)
    np.testing.assert_array_equal(np.asarray(total), wt)
    np.testing.assert_array_equal(np.asarray(other).reshape(4, 3), start)
    np.testing.assert_array_equal(b0, np.arange(12, dtype=np.float32).reshape(4, 3))
    np.testing.assert_array_equal(const, np.ones((4, 3), np.float32))


@pytest.mark.parametrize("source", ["argument", "constant", "made"])
@pytest.mark.parametrize("kind", ["scan", "while"])
def test_a_carry_the_loop_passes_through_stays_whose_it_was(source, kind):
    """A carry the body returns untouched is the initial value itself after the loop
    (the caller's array, a constant): never the program's to update in place after
    the loop (a scatter on it must copy)."""
    const = np.arange(6, dtype=np.float32)

    def f(b0):
        init = {"argument": b0, "constant": const, "made": b0 * 1.0}[source]
        if kind == "scan":
            (a, t), _ = lax.scan(lambda c, i: ((c[0], c[1] + i), None), (init, 0), np.arange(3))
        else:
            a, t = lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0], c[1] + 1), (init, 0))
        return a.at[0].set(99.0), t  # (the scatter a's only reader: in place if a
        # were the program's own)

    b0 = np.arange(6, dtype=np.float32) + 10.0
    start = (const if source == "constant" else b0).copy()
    for _ in range(2):  # (a constant written the first time would show the second)
        _, (updated, t) = _copied(f, b0)
        np.testing.assert_array_equal(np.asarray(updated),
                                      np.concatenate([[99.0], start[1:]]))
        assert int(t) == 3
    np.testing.assert_array_equal(b0, np.arange(6, dtype=np.float32) + 10.0)
    np.testing.assert_array_equal(const, np.arange(6, dtype=np.float32))


def test_an_empty_loop_hands_its_taken_carry_on():
    """A loop of no steps returns the buffer it took over; the next loop writes it."""
    def f(b0):
        (buf, total), _ = lax.scan(_fill(4), (b0 * 2.0, snp.zeros(3, np.float32)),
                                   np.arange(0))
        (buf, total), ys = lax.scan(_fill(4), (buf, total), np.arange(3), reverse=True)
        return buf, total, ys

    b0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    copied, (buf, total, ys) = _copied(f, b0)
    assert copied == [(), ()], copied
    wb, wt, wy = _numpy_fill(b0 * 2.0, np.zeros(3, np.float32), [2, 1, 0], 4)
    np.testing.assert_array_equal(np.asarray(buf), wb)
    np.testing.assert_array_equal(np.asarray(total), wt)
    np.testing.assert_array_equal(np.asarray(ys), wy[::-1])


def test_while_loops_hand_their_carries_on():
    def body(c):
        i, buf = c
        return i + 1, buf.at[i % 4].add(snp.full((3,), i, np.float32))

    def f(b0):
        i, buf = lax.while_loop(lambda c: c[0] < 5, body, (0, b0 + 1.0))
        i, buf = lax.while_loop(lambda c: c[0] < 9, body, (i, buf))
        return i, buf, b0 * 1.0

    b0 = np.arange(12, dtype=np.float32).reshape(4, 3)
    copied, (i, buf, again) = _copied(f, b0)
    assert copied == [(), ()], copied
    want = b0 + 1.0
    for k in range(9):
        want[k % 4] += k
    assert int(i) == 9
    np.testing.assert_array_equal(np.asarray(buf), want)
    np.testing.assert_array_equal(np.asarray(again), b0)


def test_loops_handing_carries_on_from_threads(each_on_a_thread):
    """The same compiled program on four threads at once: each call's buffers are its
    own (a taken carry is a value that call made)."""
    def f(b0):
        (buf, total), ys1 = lax.scan(_fill(4), (b0 * 1.0, snp.zeros(3, np.float32)),
                                     np.arange(6))
        (buf, total), ys2 = lax.scan(_fill(4), (buf, total), np.arange(6, 40))
        return buf, total

    step = spmd.jit(f)
    inputs = [np.full((4, 3), k, np.float32) for k in range(4)]
    wants = []
    for b in inputs:
        wb, wt, _ = _numpy_fill(b, np.zeros(3, np.float32), range(40), 4)
        wants.append((wb, wt))

    def call(k):
        for _ in range(20):
            buf, total = step(inputs[k])
            np.testing.assert_array_equal(np.asarray(buf), wants[k][0])
            np.testing.assert_array_equal(np.asarray(total), wants[k][1])

    each_on_a_thread(call, 4)


def test_gradients_through_loops_handing_carries_on(x64):
    """The transposed loops take their carries over too: gradients of two chained
    loops (jitted, so the generated code hands carries on) by ``check_grads``, and
    equal to the same function run eagerly (every carry copied)."""
    from spmd.test_util import check_grads

    def loss(w, x):
        def step(h, xi):
            h = snp.tanh(h @ w + xi)
            return h, h.sum()
        h, s1 = lax.scan(step, x[0] * 1.0, x[1:4])
        h, s2 = lax.scan(step, h, x[4:])
        return (h ** 2).sum() + s1.sum() + s2.sum()

    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 5)) / 3
    x = rng.normal(size=(8, 5))
    jitted = spmd.jit(loss)
    check_grads(jitted, (w, x), order=1, modes=("fwd", "rev"))
    np.testing.assert_allclose(np.asarray(spmd.jit(spmd.grad(loss))(w, x)),
                               np.asarray(spmd.grad(loss)(w, x)), rtol=1e-12)
