"""Updates in place (spmd/compiler/engine/codegen.py, ``rules["in_place"]``) and loop carries
donated to the loop body (spmd/compiler/ops/loop_runs.py): no argument, constant,
input array or other value that shares a buffer is ever written, and the results are
numpy's.  The aliasing cases are the point: a carry returned twice, a carry that is an
``xs`` slice, a constant, a view of another carry, a carry that is also a ``y``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import lax
from spmd.compiler.core.jit import _executables


def _bodies_with(fn_marker: str) -> list:
    """The compiled loop bodies (donated carries) whose code calls ``fn_marker``."""
    return [e for per in list(_executables.values()) for key, e in per.items()
            if key[1] and fn_marker in e.source]


def _rows(n, d):
    """fori_loop writing row i of an (n, d) array: ``a.at[i].set(i)``."""
    return lambda a: lax.fori_loop(0, n, lambda i, a: a.at[i].set(
        snp.full((d,), i, np.float32)), a)


def _expected_rows(n, d):
    return np.repeat(np.arange(n, dtype=np.float32)[:, None], d, axis=1)


@pytest.mark.parametrize("jitted", [True, False])
def test_a_loop_writes_rows_in_place_and_leaves_its_input(jitted):
    f = _rows(6, 3)
    f = spmd.jit(f) if jitted else f
    a = np.full((6, 3), -1.0, np.float32)
    for _ in range(2):  # the second call must start from the caller's array again
        np.testing.assert_array_equal(np.asarray(f(a)), _expected_rows(6, 3))
        np.testing.assert_array_equal(a, np.full((6, 3), -1.0, np.float32))
    if jitted:  # (eagerly the body's program, traced per call, is gone by now)
        body = _bodies_with("_scatter_in_place_")
        assert body and any(b.consumed for b in body)


def test_while_loop_carries_too():
    def f(a):
        def body(c):
            i, a = c
            return i + 1, lax.dynamic_update_slice(a, snp.full((1, 2), i, np.float32), (i, 0))
        return lax.while_loop(lambda c: c[0] < 5, body, (np.int32(0), a))[1]

    a = np.zeros((5, 2), np.float32)
    np.testing.assert_array_equal(np.asarray(spmd.jit(f)(a)), _expected_rows(5, 2))
    assert not a.any()
    assert _bodies_with("_dynamic_update_slice_in_place_")


def test_straight_line_updates_chain_in_place_but_never_on_an_argument():
    def f(a):
        b = lax.dynamic_update_slice(a, np.ones((1, 3), np.float32), (0, 0))
        return lax.dynamic_update_slice(b, 2 * np.ones((1, 3), np.float32), (1, 0))

    a = np.zeros((3, 3), np.float32)
    g = spmd.jit(f)
    out = np.asarray(g(a))
    np.testing.assert_array_equal(out[:2], [[1, 1, 1], [2, 2, 2]])
    assert not a.any()
    src = g.lower(a).compile().source
    assert src.count("_dynamic_update_slice_in_place_") == 1  # the second; the first copies


def test_a_carry_returned_twice_is_copied_apart():
    def body(c, i):
        a, b = c
        a = a.at[i].set(10.0)  # in place into a's buffer: b must not see it
        seen = b[i]
        return (a, a), seen  # both carries in one buffer for the next step

    a = np.zeros(4, np.float32)
    (x, y), seen = spmd.jit(lambda a: lax.scan(body, (a, a), np.arange(4)))(a)
    np.testing.assert_array_equal(np.asarray(seen), np.zeros(4, np.float32))
    np.testing.assert_array_equal(np.asarray(x), np.full(4, 10.0, np.float32))
    np.testing.assert_array_equal(np.asarray(y), np.full(4, 10.0, np.float32))
    assert not a.any()


def test_a_carry_viewing_another_is_copied_apart():
    def body(c, i):
        a, t = c
        a = a.at[i, 0].set(i + 1.0)  # in place into a's buffer: t must not see it
        seen = t[0, i]
        return (a, a.T), seen  # the second carry is a view of the first's buffer

    a0 = np.zeros((3, 3), np.float32)
    (a, t), seen = spmd.jit(lambda a: lax.scan(body, (a, a.T), np.arange(3)))(a0)
    np.testing.assert_array_equal(np.asarray(seen), np.zeros(3, np.float32))
    want = np.zeros((3, 3), np.float32)
    want[:, 0] = [1, 2, 3]
    np.testing.assert_array_equal(np.asarray(a), want)
    np.testing.assert_array_equal(np.asarray(t), want.T)


def test_a_carry_that_is_an_xs_slice_leaves_xs_alone():
    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    kept = xs.copy()

    def body(carry, x):
        new = carry.at[0].set(100.0)  # the carry's only reader: updated in place
        return x, new  # the next carry is this step's xs slice, a view of xs

    for f in (spmd.jit(lambda c, xs: lax.scan(body, c, xs)),
              lambda c, xs: lax.scan(body, c, xs)):
        carry, ys = f(np.zeros(3, np.float32), xs)
        np.testing.assert_array_equal(xs, kept)
        np.testing.assert_array_equal(np.asarray(carry), xs[3])
        want = np.concatenate([np.zeros((1, 3), np.float32), xs[:3]])
        want[:, 0] = 100.0
        np.testing.assert_array_equal(np.asarray(ys), want)


def test_a_carry_that_is_also_a_y_keeps_each_steps_value():
    def body(a, i):
        a = a.at[i].set(1.0)
        return a, a

    carry, ys = spmd.jit(lambda a: lax.scan(body, a, np.arange(3)))(np.zeros(3, np.float32))
    np.testing.assert_array_equal(np.asarray(ys), np.tril(np.ones((3, 3), np.float32)))
    np.testing.assert_array_equal(np.asarray(carry), np.ones(3, np.float32))


def test_a_constant_carry_is_never_written():
    table = np.arange(6, dtype=np.float32)

    def body(i, a):
        # Odd steps restart from the closed-over table (a constant of the body); even
        # steps update the carry, which must then be a copy, not the table.
        a = lax.cond(i % 2 == 1, lambda a: snp.asarray(table), lambda a: a, a)
        return a.at[i].set(-1.0)

    f = spmd.jit(lambda a: lax.fori_loop(0, 5, body, a))
    for _ in range(2):
        out = np.asarray(f(np.zeros(6, np.float32)))
        want = np.zeros(6, np.float32)
        for i in range(5):
            want = table.copy() if i % 2 == 1 else want
            want[i] = -1.0
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(table, np.arange(6, dtype=np.float32))


def test_nested_loops_vmap_and_grad():
    def inner(a):
        return lax.fori_loop(0, 2, lambda j, a: a.at[j].set(a[j] * 2.0 + 1.0), a)

    def outer(a):
        return lax.fori_loop(0, 3, lambda i, a: inner(a) * 1.5, a)

    def ref(a):
        a = a.copy()
        for _ in range(3):
            for j in range(2):
                a[j] = a[j] * 2.0 + 1.0
            a = a * 1.5
        return a

    a = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_allclose(np.asarray(spmd.jit(outer)(a)), ref(a), rtol=1e-6)
    batch = np.stack([a, a + 1, a - 2])
    np.testing.assert_allclose(np.asarray(spmd.jit(spmd.vmap(outer))(batch)),
                               np.stack([ref(b) for b in batch]), rtol=1e-6)
    g = np.asarray(spmd.jit(spmd.grad(lambda a: snp.sum(outer(a) ** 2)))(a))
    eps = 1e-3
    fd = np.zeros_like(a, dtype=np.float64)
    for k in np.ndindex(a.shape):
        d = np.zeros(a.shape, np.float64)
        d[k] = eps
        fd[k] = (np.sum(ref(a + d) ** 2) - np.sum(ref(a - d) ** 2)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=2e-2, atol=1e-2)


def test_threads_running_one_loop_at_once():
    f = spmd.jit(_rows(50, 16))
    f(np.zeros((50, 16), np.float32))
    errors = []

    def run(k):
        try:
            for _ in range(20):
                a = np.full((50, 16), k, np.float32)
                out = np.asarray(f(a))
                if not (np.array_equal(out, _expected_rows(50, 16)) and (a == k).all()):
                    errors.append(k)
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_cond_in_a_loop_accumulates_into_the_carry_in_place():
    """Gradient accumulation as a pipeline schedule writes it: on some steps a branch
    adds into the carry; the branches get the carry donated and add in place."""
    gs = np.arange(24, dtype=np.float32).reshape(6, 4)

    def body(acc, xs):
        g, take = xs
        acc = lax.cond(take, lambda a: a + g, lambda a: a, acc)
        return acc, snp.sum(acc)  # (a sum, not a view: the carry stays the body's alone)

    f = spmd.jit(lambda acc, gs, takes: lax.scan(body, acc, (gs, takes)))
    takes = np.array([1, 0, 1, 1, 0, 1], bool)
    acc0 = np.ones(4, np.float32)
    acc, firsts = f(acc0, gs, takes)
    want = acc0.copy()
    wants = []
    for g, t in zip(gs, takes):
        want = want + g if t else want
        wants.append(want.sum())
    np.testing.assert_array_equal(np.asarray(acc), want)
    np.testing.assert_array_equal(np.asarray(firsts), wants)
    np.testing.assert_array_equal(acc0, np.ones(4, np.float32))
    compiled = [e for per in list(_executables.values()) for e in per.values()]
    # The adding branch writes into its donated operand (the carry, after g)...
    assert any(e.consumed == {1} and "out=v1" in e.source for e in compiled)
    # ...and the loop body returns the carry in a buffer of its own: no copy per step.
    assert any("_cond_" in e.source and e.consumed and e.exclusive[0] for e in compiled)


def test_a_cond_operand_read_again_is_not_donated():
    def body(a, i):
        b = lax.cond(i % 2 == 0, lambda a: a.at[0].set(-1.0), lambda a: a * 2.0, a)
        return b + a, b[0]  # a is read after the cond: its buffer must be intact

    a0 = np.arange(1, 4, dtype=np.float32)
    carry, ys = spmd.jit(lambda a: lax.scan(body, a, np.arange(3)))(a0)
    want, wants = a0.copy(), []
    for i in range(3):
        b = want.copy()
        if i % 2 == 0:
            b[0] = -1.0
        else:
            b = b * 2.0
        wants.append(b[0])
        want = b + want
    np.testing.assert_array_equal(np.asarray(carry), want)
    np.testing.assert_array_equal(np.asarray(ys), wants)


def test_a_cond_returning_its_operand_twice():
    def body(c, i):
        a, b = c
        a = a.at[i].set(5.0)  # a's own buffer now (a copy or the loop's)
        x, y = lax.cond(i >= 0, lambda a: (a, a), lambda a: (a, a * 1.0), a)
        x = x.at[i].set(7.0)  # must not reach y
        return (x, y), y[i]

    a0 = np.zeros(3, np.float32)
    (x, y), seen = spmd.jit(lambda a: lax.scan(body, (a, a), np.arange(3)))(a0)
    np.testing.assert_array_equal(np.asarray(seen), [5.0, 5.0, 5.0])
    np.testing.assert_array_equal(np.asarray(x), [7.0, 7.0, 7.0])
    assert not a0.any()


def _loop_copies(fn, *args):
    """The carries the scan of ``fn`` copies every step (its ``recopy``), and its
    results."""
    from spmd.compiler.ops import loop_runs

    seen = []
    orig = loop_runs.donated_body

    def spy(program, xp, first, n):
        out = orig(program, xp, first, n)
        seen.append(out[2])
        return out

    loop_runs.donated_body = spy
    try:
        got = spmd.jit(fn)(*args)
    finally:
        loop_runs.donated_body = orig
    return seen, got


def test_a_carry_a_cond_only_reads_is_not_copied_every_step():
    """A pipeline's buffer of inputs: the step writes a slot in place, a cond reads a
    slot (a fresh result), and the buffer goes on as the carry.  The cond's branches
    return no view of it, so it stays the loop's own: no copy per step."""
    def body(c, i):
        buf, total = c
        buf = buf.at[i % 4].set(snp.full((3,), i, np.float32))
        y = lax.cond(i % 2 == 0, lambda b: b[i % 4] * 2.0, lambda b: b[0] + 1.0, buf)
        return (buf, total + y), y

    buf0 = np.zeros((4, 3), np.float32)
    copies, ((buf, total), ys) = _loop_copies(
        lambda b: lax.scan(body, (b, np.zeros(3, np.float32)), np.arange(6)), buf0)
    assert copies == [()], copies
    want, wtotal, wys = buf0.copy(), np.zeros(3, np.float32), []
    for i in range(6):
        want[i % 4] = i
        y = want[i % 4] * 2.0 if i % 2 == 0 else want[0] + 1.0
        wtotal = wtotal + y
        wys.append(y)
    np.testing.assert_array_equal(np.asarray(buf), want)
    np.testing.assert_array_equal(np.asarray(total), wtotal)
    np.testing.assert_array_equal(np.asarray(ys), np.stack(wys))
    assert not buf0.any()


@pytest.mark.parametrize("branch", ["view", "passthrough", "fresh"])
def test_a_cond_returning_a_view_of_a_carry_keeps_its_value(branch):
    """One branch returns the carry or a view of it: the carry is then shared, and its
    update in place later in the step must not reach the cond's result (the loop
    copies it, or updates a copy)."""
    pick = {"view": lambda b: b.reshape(-1)[:3].reshape(3),
            "passthrough": lambda b: b[0],
            "fresh": lambda b: b[0] * 1.0}[branch]

    def body(buf, i):
        y = lax.cond(i >= 0, pick, lambda b: b[1] * 1.0, buf)
        buf = buf.at[0].set(buf[0] + 10.0)  # after the cond read it
        return buf, y

    buf0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    _, (buf, ys) = _loop_copies(lambda b: lax.scan(body, b, np.arange(3)), buf0)
    want = buf0.copy()
    wys = []
    for _ in range(3):
        wys.append(want[0].copy())
        want[0] += 10.0
    np.testing.assert_array_equal(np.asarray(ys), np.stack(wys))
    np.testing.assert_array_equal(np.asarray(buf), want)
    np.testing.assert_array_equal(buf0, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_a_cond_operand_whose_views_are_gone_is_updated_in_place():
    """Per result, the operands a cond's results may view: ``v`` may view ``a`` and
    ``u`` may view ``b``.  Once ``u`` has been read, ``b`` is updated in place (no
    copy) although ``v`` lives on; ``a``'s update must leave ``v``'s value alone."""
    def body(c, i):
        a, b = c
        v, u, w = lax.cond(i % 2 == 0, lambda a, b: (a[0], b[0], b[1] * 2.0),
                           lambda a, b: (a[1], b[1], b[0] * 3.0), a, b)
        s = u * 1.0  # u's last read
        b = b.at[0].set(b[0] + s)
        a = a.at[0].set(a[0] + 10.0)
        return (a, b), v + w

    a0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    b0 = np.arange(6, 12, dtype=np.float32).reshape(2, 3)
    before = {id(e) for e in _bodies_with("_cond_")}
    f = spmd.jit(lambda a, b: lax.scan(body, (a, b), np.arange(4)))
    (a, b), ys = f(a0, b0)
    wa, wb, wys = a0.copy(), b0.copy(), []
    for i in range(4):
        k = 0 if i % 2 == 0 else 1
        v, u, w = wa[k].copy(), wb[k].copy(), wb[1 - k] * (2.0 if k == 0 else 3.0)
        wb[0] += u
        wa[0] += 10.0
        wys.append(v + w)
    np.testing.assert_array_equal(np.asarray(ys), np.stack(wys))
    np.testing.assert_array_equal(np.asarray(a), wa)
    np.testing.assert_array_equal(np.asarray(b), wb)
    np.testing.assert_array_equal(a0, np.arange(6, dtype=np.float32).reshape(2, 3))
    # The body's code: b's update in place, a's into a new buffer (v may view a).
    bodies = [e.source for e in _bodies_with("_cond_") if id(e) not in before]
    assert bodies and all(src.count("_dynamic_update_slice_in_place_") == 1 and
                          src.count("_dynamic_update_slice_") == 2 for src in bodies), bodies


def test_a_buffer_read_before_is_handed_to_a_cond_that_updates_it_in_place():
    """A loop's buffer has a slot read out of it, then goes to a ``cond`` whose branch
    writes a slot (a pipeline stage putting what it received into its buffer only on
    the ticks something came).  Once the slot read is dead the branch updates the
    buffer in place, not a copy of it; while the read lives on past the ``cond``, the
    branch copies and the read keeps the slot's old value."""
    def dead_read(buf, i):
        r = lax.dynamic_index_in_dim(buf, i % 3, 0, keepdims=False)
        y = r * 2.0 + 1.0  # r's last read
        buf = lax.cond(i % 2 == 1, lambda b, v: b,
                       lambda b, v: b.at[(i + 1) % 3].set(v), buf, y)
        return buf, y

    def live_read(buf, i):
        r = lax.dynamic_index_in_dim(buf, i % 3, 0, keepdims=False)
        buf = lax.cond(i % 2 == 1, lambda b, v: b,
                       lambda b, v: b.at[i % 3].set(v), buf, r * 2.0 + 1.0)
        return buf, r + 0.0  # read after the cond wrote r's own slot

    def reference(live):
        buf, ys = np.arange(12, dtype=np.float32).reshape(3, 4), []
        for i in range(5):
            r = buf[i % 3].copy()
            if i % 2 == 0:
                buf[i % 3 if live else (i + 1) % 3] = r * 2.0 + 1.0
            ys.append(r if live else r * 2.0 + 1.0)
        return buf, np.stack(ys)

    for live, body in ((False, dead_read), (True, live_read)):
        b0 = np.arange(12, dtype=np.float32).reshape(3, 4)
        before = {id(e) for per in list(_executables.values()) for e in per.values()}
        buf, ys = spmd.jit(lambda b: lax.scan(body, b, np.arange(5)))(b0)
        want_buf, want_ys = reference(live)
        np.testing.assert_array_equal(np.asarray(buf), want_buf)
        np.testing.assert_array_equal(np.asarray(ys), want_ys)
        np.testing.assert_array_equal(b0, np.arange(12, dtype=np.float32).reshape(3, 4))
        # The writing branch: its own code, compiled for this cond.
        branches = [e.source for per in list(_executables.values()) for e in per.values()
                    if id(e) not in before and "_scatter_" in e.source
                    and "_cond_" not in e.source]
        assert len(branches) == 1, branches
        assert ("_scatter_in_place_" in branches[0]) is not live, branches


def test_executables_name_the_arguments_their_results_may_share():
    from spmd.compiler.core.jit import executable_for

    def f(a, b, c):
        return a, b.reshape(-1), c * 2.0, a + 1.0

    closed = spmd.make_jaxpr(f)(np.ones(3, np.float32), np.ones((2, 2), np.float32),
                                np.ones(3, np.float32))
    exe = executable_for(closed)
    assert exe.aliases == (frozenset({0}), frozenset({1}), frozenset(), frozenset())


def test_swapped_carries_never_write_the_callers_buffers():
    """``(a, b) -> (b, 2 a)``: the body doubles ``a`` into ``a``'s own buffer, and the
    next step's ``a`` is this step's ``b``.  Only carries the loop copied may be
    written: ``b`` starts as the caller's array.  (A jvp's tangent carries, swapped
    so, once gave a silent wrong tangent this way.)"""
    def body(c, _):
        a, b = c
        return (b, a * 2.0), None

    a0 = np.ones(3, np.float32)
    b0 = np.full(3, 5.0, np.float32)
    for f in (spmd.jit(lambda a, b: lax.scan(body, (a, b), None, length=5)[0]),
              lambda a, b: lax.scan(body, (a, b), None, length=5)[0]):
        a, b = f(a0, b0)
        np.testing.assert_array_equal(np.asarray(a), np.full(3, 20.0))  # 5 * 2 * 2
        np.testing.assert_array_equal(np.asarray(b), np.full(3, 8.0))  # 1 * 2 * 2 * 2
        np.testing.assert_array_equal(a0, np.ones(3, np.float32))
        np.testing.assert_array_equal(b0, np.full(3, 5.0, np.float32))
    # The jvp that found it: tangents through swapped carries, jitted and not.
    g = lambda x: lax.scan(lambda c, t: ((c[1], snp.sin(c[0]) * t), None),  # noqa: E731
                           (x[0], x[1]), x)[0][1]
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    t = np.linspace(0.5, 1, 12, dtype=np.float32).reshape(4, 3)
    _, want = spmd.jvp(g, (x,), (t,))
    _, got = spmd.jvp(spmd.jit(g), (x,), (t,))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_a_buffer_read_before_its_update_is_updated_in_place():
    """A slot read out of a buffer, then the buffer updated (a pipeline's input
    buffer each tick): in place once every view read from it is dead."""
    def body(i, a):
        slot = lax.dynamic_slice(a, (i, 0), (1, 4))
        return lax.dynamic_update_slice(a, slot * 2.0 + 1.0, (i, 0))

    f = spmd.jit(lambda a: lax.fori_loop(0, 3, body, a))
    a0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(f(a0)), a0 * 2.0 + 1.0)
    np.testing.assert_array_equal(a0, np.arange(12, dtype=np.float32).reshape(3, 4))
    assert _bodies_with("_dynamic_update_slice_in_place_")


def test_a_view_read_after_the_update_keeps_the_old_value():
    def f(a0):
        a = a0 * 1.0  # this code's own buffer
        v = lax.dynamic_slice(a, (0, 0), (1, 4))  # a view of it
        w = a.T[1]  # a view of a view, read later too
        b = lax.dynamic_update_slice(a, np.full((1, 4), 5.0, np.float32), (0, 0))
        return b, v * 1.0, w * 1.0

    a0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    b, v, w = spmd.jit(f)(a0)
    np.testing.assert_array_equal(np.asarray(v), a0[:1])
    np.testing.assert_array_equal(np.asarray(w), a0.T[1])
    np.testing.assert_array_equal(np.asarray(b)[0], np.full(4, 5.0))
    assert "_in_place_" not in spmd.jit(f).lower(a0).compile().source


def test_the_stacked_layers_gradient_is_written_slab_by_slab():
    """The gradient of weights stacked over layers (``w[k]`` read by layer k) is a
    concatenation of the layers' products along the stacked axis: each product is
    written into its slab of the result, and nothing is concatenated."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 8, 8)).astype(np.float32) / 3
    x = rng.standard_normal((4, 8)).astype(np.float32)

    def loss(w, x):
        for k in range(3):
            x = snp.tanh(x @ w[k])
        return (x ** 2).sum()

    f = spmd.jit(spmd.grad(loss))
    got = f(w, x)
    import gc

    from spmd.compiler.engine.codegen import Executable

    sources = [e.source for e in gc.get_objects() if isinstance(e, Executable)
               and "xp.empty((3, 8, 8)" in e.source]
    assert sources, "no generated program allocates the gradient's buffer"
    source = sources[-1]
    assert "concatenate" not in source, source
    # Each layer's product goes into its slab: out=<buffer>.reshape(-1)[a:b].reshape(...)
    assert source.count(".reshape(-1)[") == 3 and "out=" in source, source
    # against finite differences in float64
    w64, x64 = w.astype(np.float64), x.astype(np.float64)

    def np_loss(w):
        y = x64
        for k in range(3):
            y = np.tanh(y @ w[k])
        return (y ** 2).sum()

    eps, want = 1e-6, np.zeros_like(w64)
    for idx in np.ndindex(*w.shape):
        up, dn = w64.copy(), w64.copy()
        up[idx] += eps
        dn[idx] -= eps
        want[idx] = (np_loss(up) - np_loss(dn)) / (2 * eps)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
