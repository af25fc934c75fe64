"""Control flow (``spmd.lax.cond/switch/scan/fori_loop/while_loop``): values against
Python ``if``/loops, derivatives against finite differences, vmap against Python
loops, jit, and every user error."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import errors, lax
from spmd.test_util import check_grads

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def close(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(spmd.tree_util.tree_leaves(a), spmd.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.fixture(params=["eager", "jit"])
def run(request):
    """Call a function eagerly or under ``spmd.jit``."""
    return (lambda f: f) if request.param == "eager" else spmd.jit


# ------------------------------------------------------------------ values

def _branchy(p, x):
    return lax.cond(p, lambda d: {"a": d["x"] * 2, "b": (d["y"], d["x"].sum())},
                    lambda d: {"a": -d["x"], "b": (d["y"] + 1, d["x"].max())}, {"x": x, "y": p})


@pytest.mark.parametrize("pred", [True, False])
def test_cond_pytrees(run, pred):
    x = rand(3)
    out = run(lambda p, x: lax.cond(p, lambda x, y: (x * 2, {"k": y}),
                                    lambda x, y: (-x, {"k": y + 1}), x, 3))(pred, x)
    ref = (x * 2, 3) if pred else (-x, 4)
    close(out[0], ref[0])
    assert int(out[1]["k"]) == ref[1]


@pytest.mark.parametrize("pred", [0, 2, 0.0, -1.5])
def test_cond_numeric_predicate(run, pred):
    x = rand(3)
    out = run(lambda p, x: lax.cond(p, lambda x: x + 1, lambda x: x - 1, x))(pred, x)
    close(out, x + 1 if pred else x - 1)


def test_cond_closure_and_no_operands(run):
    w = rand(3)
    out = run(lambda p: lax.cond(p, lambda: w * 2, lambda: w))(True)
    close(out, w * 2)


@pytest.mark.parametrize("i", [-3, 0, 1, 2, 7])
def test_switch_clamps(run, i):
    x = rand(4)
    fns = [lambda x: x, lambda x: snp.sin(x), lambda x: x * 3]
    out = run(lambda i, x: lax.switch(i, fns, x))(i, x)
    close(out, np.asarray(fns[min(max(i, 0), 2)](x)))


def test_switch_single_branch():
    assert float(lax.switch(5, [lambda x: x + 1], 1.0)) == 2.0


def _py_scan(f, init, xs, reverse=False):
    n = len(spmd.tree_util.tree_leaves(xs)[0])
    carry, ys = init, [None] * n
    for i in (reversed(range(n)) if reverse else range(n)):
        carry, ys[i] = f(carry, spmd.tree_util.tree_map(lambda a: a[i], xs))
    return carry, spmd.tree_util.tree_map(lambda *a: np.stack(a), *ys)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_pytrees(run, reverse):
    def step(c, x):
        h = snp.tanh(c["h"] * c["w"] + x[0])
        return {"h": h, "w": c["w"], "n": c["n"] + 1}, (h * x[1], None, {"s": c["n"]})

    init = {"h": rand(3), "w": rand(3), "n": np.int32(0)}
    xs = (rand(5, 3), rand(5, 1))
    out = run(lambda init, xs: lax.scan(step, init, xs, reverse=reverse))(init, xs)
    ref = _py_scan(step, init, xs, reverse)
    close(out, ref)
    assert out[1][1] is None and int(out[0]["n"]) == 5


def test_scan_length_only_and_empty(run):
    out = run(lambda: lax.scan(lambda c, _: (c * 2, c), 1.0, None, length=4))()
    close(out[0], 16.0)
    close(out[1], np.array([1.0, 2.0, 4.0, 8.0]))
    c, ys = run(lambda x: lax.scan(lambda c, x: (c + x, c), 1.0, x))(np.zeros((0,), np.float32))
    assert float(c) == 1.0 and np.shape(ys) == (0,)


def test_fori_loop_static_and_traced(run):
    body = lambda i, x: x * 2 + i  # noqa: E731
    ref = 1.0
    for i in range(2, 6):
        ref = ref * 2 + i
    close(run(lambda x: lax.fori_loop(2, 6, body, x))(1.0), ref)
    close(spmd.jit(lambda n, x: lax.fori_loop(2, n, body, x))(6, 1.0), ref)
    close(lax.fori_loop(5, 2, body, 1.0), 1.0)  # empty range


def test_fori_loop_static_lowers_to_scan_traced_to_while():
    assert "scan[" in str(spmd.make_jaxpr(lambda x: lax.fori_loop(0, 3, lambda i, c: c + i, x))(
        1.0))
    assert "while[" in str(spmd.make_jaxpr(lambda n, x: lax.fori_loop(0, n, lambda i, c: c + i,
                                                                      x))(3, 1.0))


def test_while_loop_pytree(run):
    def body(c):
        return {"i": c["i"] + 1, "x": c["x"] * 1.5}

    out = run(lambda x: lax.while_loop(lambda c: c["x"].sum() < 100.0, body,
                                       {"i": 0, "x": x}))(np.ones(2, np.float32))
    i, x = 0, np.ones(2, np.float32)
    while x.sum() < 100.0:
        i, x = i + 1, x * 1.5
    assert int(out["i"]) == i
    close(out["x"], x)


def test_nested_control_flow(run):
    def f(xs):
        def step(c, x):
            c = lax.cond(x.sum() > 0, lambda c: c + x, lambda c: c * 0.5, c)
            inner, _ = lax.scan(lambda a, b: (a + b * c.sum(), None), 0.0, x)
            return c, inner
        return lax.scan(step, snp.zeros(3), xs)

    xs = rand(4, 3)
    c, ref_ys = np.zeros(3, np.float32), []
    for x in xs:
        c = c + x if x.sum() > 0 else c * 0.5
        ref_ys.append(x.sum() * c.sum())
    out = run(f)(xs)
    close(out[0], c)
    close(out[1], np.array(ref_ys), rtol=1e-4)


def test_eager_scan_compiles_body_once():
    # 2000 iterations run compiled code; interpreting equations would be far slower.
    c, _ = lax.scan(lambda c, x: (c * 0.999 + x, None), 0.0, np.ones(2000, np.float32))
    close(c, sum(0.999 ** k for k in range(2000)), rtol=1e-3)


# ------------------------------------------------------------ derivatives

X3 = np.array([0.5, -1.2, 2.0])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_grads(sign):
    def f(x, y):
        return lax.cond(x.sum() > 0, lambda x, y: (snp.sin(x) * y, x[0]),
                        lambda x, y: (snp.cos(x), y[1] * 3.0), x, y)
    check_grads(f, (sign * X3, X3 + 1.0), order=2)


def test_switch_grads():
    fns = [lambda a, b: a * b, lambda a, b: snp.sin(a) * b * b, lambda a, b: a]
    for i in range(3):
        check_grads(lambda x, w: lax.switch(i, fns, x, w), (X3, X3 + 1), order=2)


def _rnn(w, xs, reverse=False):
    def step(h, x):
        h = snp.tanh(w * h + x)
        return h, h * 2
    return lax.scan(step, snp.zeros(3), xs, reverse=reverse)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_grads(reverse):
    check_grads(lambda w, xs: _rnn(w, xs, reverse), (X3, rand(4, 3)), order=2)


def test_scan_grads_consts_carries_and_int_carry():
    def f(w, init, xs):
        def step(c, x):
            h, n = c
            return (snp.sin(h * w) + x, n + 1), h * n
        (h, n), ys = lax.scan(step, (init, 0), xs)
        return h, ys
    check_grads(f, (X3, X3 * 2, rand(3, 3)), order=2)


def test_fori_loop_static_grads():
    check_grads(lambda x: lax.fori_loop(0, 3, lambda i, c: snp.sin(c) * (i + 1.0), x), (X3,),
                order=2)


def test_while_loop_forward_grads():
    def f(x):
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, snp.sin(c[1]) * 2.0),
                              (0, x))[1]
    check_grads(f, (X3,), order=1, modes=("fwd",))
    _, lin = spmd.linearize(f, np.float32(0.3))
    _, ref = spmd.jvp(f, (np.float32(0.3),), (np.float32(1.0),))
    close(lin(np.float32(1.0)), ref)


def test_nested_grads():
    def f(w, xs):
        def step(c, x):
            c = lax.cond(x.sum() > 0, lambda c: c * w + x, lambda c: snp.sin(c) * x, c)
            return c, c.sum()
        return lax.scan(step, w, xs)
    check_grads(f, (X3, rand(4, 3)), order=2)


def test_grad_rnn_against_finite_differences():
    w, xs = rand(3).astype(np.float64), rand(6, 3).astype(np.float64)

    def loss(w):
        c, ys = _rnn(w, xs)
        return (ys ** 2).sum() + c.sum()

    g = np.asarray(spmd.grad(loss)(w.astype(np.float32)))
    eps = 1e-3
    num = np.array([(float(loss((w + eps * e).astype(np.float32)))
                     - float(loss((w - eps * e).astype(np.float32)))) / (2 * eps)
                    for e in np.eye(3)])
    np.testing.assert_allclose(g, num, rtol=2e-2, atol=2e-3)
    close(spmd.jit(spmd.grad(loss))(w.astype(np.float32)), g, rtol=1e-5)
    close(spmd.grad(spmd.jit(loss))(w.astype(np.float32)), g, rtol=1e-5)


def test_grad_program_saves_residuals_not_loop_invariants():
    text = str(spmd.make_jaxpr(spmd.grad(lambda w, xs: _rnn(w, xs)[1].sum()))(X3, rand(6, 3)))
    assert text.count("scan[") == 2  # the known forward scan and the transposed one
    assert "reverse=True" in text


# ------------------------------------------------------------------- vmap

def test_vmap_cond_batched_predicate():
    f = lambda x: lax.cond(x.sum() > 0, lambda x: snp.sin(x) * x, lambda x: snp.cos(x), x)  # noqa
    xs = rand(6, 3)
    close(spmd.vmap(f)(xs), np.stack([np.asarray(f(x)) for x in xs]))
    close(spmd.jit(spmd.vmap(f))(xs), np.stack([np.asarray(f(x)) for x in xs]))


def test_vmap_cond_batched_operands_only():
    g = lambda x, y: lax.cond(True, lambda x, y: (x * y, y), lambda x, y: (x, y), x, y)  # noqa
    xs = rand(5, 3)
    out = spmd.vmap(g, in_axes=(0, None))(xs, xs[0])
    close(out[0], xs * xs[0])
    close(out[1], np.broadcast_to(xs[0], xs.shape))  # out_axes=0 broadcasts it


def test_vmap_switch_batched_index():
    h = lambda i, x: lax.switch(i, [lambda x: x, lambda x: x * 2, lambda x: -x], x)  # noqa
    idx = np.array([0, 1, 2, 5, -1], np.int32)
    xs = rand(5, 3)
    close(spmd.vmap(h)(idx, xs), np.stack([np.asarray(h(i, x)) for i, x in zip(idx, xs)]))


def test_vmap_scan():
    ws, xss = rand(4, 3), rand(4, 6, 3)
    out = spmd.vmap(_rnn)(ws, xss)
    refs = [_rnn(w, x) for w, x in zip(ws, xss)]
    close(out, (np.stack([r[0] for r in refs]), np.stack([r[1] for r in refs])))
    # batched xs along axis 1, unbatched consts
    out = spmd.vmap(_rnn, in_axes=(None, 1))(ws[0], xss)
    refs = [_rnn(ws[0], xss[:, j]) for j in range(6)]
    close(out, (np.stack([r[0] for r in refs]), np.stack([r[1] for r in refs])))


def test_vmap_scan_batched_init_only():
    f = lambda c0: lax.scan(lambda c, x: (c * x, c + x), c0, np.arange(1.0, 4.0))  # noqa
    c0 = rand(5)
    out = spmd.vmap(f)(c0)
    refs = [f(c) for c in c0]
    close(out, (np.stack([r[0] for r in refs]), np.stack([r[1] for r in refs])))


def test_vmap_while_batched_predicate():
    wl = lambda x: lax.while_loop(lambda c: c[0] < x, lambda c: (c[0] * 2, c[1] + 1),  # noqa
                                  (1.0, 0))
    xs = np.array([0.5, 3.0, 10.0, 100.0], np.float32)
    out = spmd.vmap(wl)(xs)
    refs = [wl(x) for x in xs]
    close(out, (np.stack([r[0] for r in refs]), np.stack([r[1] for r in refs])))
    fl = lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 2 + i, x)  # noqa
    ns = np.array([0, 1, 4], np.int32)
    ref = np.array([float(fl(n, 1.0)) for n in ns])
    close(spmd.jit(spmd.vmap(fl))(ns, np.ones(3, np.float32)), ref)


def test_vmap_while_unbatched_predicate_batched_carry():
    def f(x):
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))
    xs = rand(4, 2)
    close(spmd.vmap(f)(xs)[1], xs * 8)


def test_vmap_of_grad_and_grad_of_vmap():
    ws, xs = rand(3, 3), rand(5, 3)
    loss = lambda w: _rnn(w, xs)[1].sum()  # noqa: E731
    g = spmd.vmap(spmd.grad(loss))(ws)
    close(g, np.stack([np.asarray(spmd.grad(loss)(w)) for w in ws]), rtol=1e-4)
    g2 = spmd.grad(lambda ws: spmd.vmap(loss)(ws).sum())(ws)
    close(g2, g, rtol=1e-4)


# ----------------------------------------------------------------- errors

def test_error_branch_output_mismatch():
    with pytest.raises(errors.ProgramTypeError, match=r"\['b'\].*f32\[3\].*f32\[4\]"):
        lax.cond(True, lambda: {"b": snp.zeros(3)}, lambda: {"b": snp.zeros(4)})
    with pytest.raises(errors.ProgramTypeError, match="pytree structure"):
        lax.cond(True, lambda: (1.0, 2.0), lambda: 1.0)
    with pytest.raises(errors.ProgramTypeError, match=r"branches\[0\] and branches\[1\]"):
        lax.switch(0, [lambda x: x, lambda x: x.astype(np.int32)], np.ones(2, np.float32))


def test_error_carry_type_change():
    with pytest.raises(errors.ProgramTypeError,
                       match=r"carry\['h'\] the input is f32\[3\] and the output is f32\[1,3\]"):
        lax.scan(lambda c, x: ({"h": c["h"][None]}, x), {"h": snp.zeros(3)}, np.ones(2))
    with pytest.raises(errors.ProgramTypeError, match=r"i32\[\].*f32\[\]"):
        lax.while_loop(lambda c: c < 3, lambda c: c * 1.5, np.int32(0))
    with pytest.raises(errors.ProgramTypeError, match="pytree structure"):
        lax.fori_loop(0, 3, lambda i, c: (c, c), 1.0)
    with pytest.raises(errors.ProgramTypeError, match="pair"):
        lax.scan(lambda c, x: c, 0.0, np.ones(3))


def test_error_reverse_mode_while():
    f = lambda x: lax.while_loop(lambda c: c < 10.0, lambda c: c * 2.0, x)  # noqa: E731
    with pytest.raises(errors.SpmdError, match="Reverse-mode differentiation does not work "
                                              "for lax.while_loop"):
        spmd.grad(f)(1.0)
    g = spmd.jit(lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 2.0, x))
    with pytest.raises(errors.SpmdError, match="use lax.scan|Use lax.scan"):
        spmd.grad(lambda x: g(3, x))(1.0)


def test_error_predicates_and_indices():
    with pytest.raises(errors.ShapeError, match="scalar"):
        lax.cond(np.array([True, False]), lambda: 1.0, lambda: 2.0)
    with pytest.raises(errors.DTypeError, match="integer"):
        lax.switch(1.0, [lambda: 1.0, lambda: 2.0])
    with pytest.raises(errors.ShapeError, match="scalar"):
        lax.switch(np.array([0, 1]), [lambda: 1.0, lambda: 2.0])
    with pytest.raises(errors.ArgumentError, match="empty"):
        lax.switch(0, [])
    with pytest.raises(errors.DTypeError, match="boolean scalar"):
        lax.while_loop(lambda c: c, lambda c: c + 1.0, 1.0)


def test_error_scan_lengths():
    with pytest.raises(errors.ShapeError, match="length"):
        lax.scan(lambda c, x: (c, x), 0.0, (np.ones(3), np.ones(4)))
    with pytest.raises(errors.ShapeError, match="length"):
        lax.scan(lambda c, x: (c, x), 0.0, np.ones(3), length=4)
    with pytest.raises(errors.ArgumentError, match="length must be given"):
        lax.scan(lambda c, x: (c, x), 0.0, None)
    with pytest.raises(errors.ShapeError, match="leading axis"):
        lax.scan(lambda c, x: (c, x), 0.0, np.float32(1.0))


def test_vmap_of_one_element_runs_only_the_branch_taken():
    # A batch of one (a process's one device of a mesh): the batched index is the
    # cond's own, so only the branch taken runs (no select of every branch's result).
    import spmd

    f = spmd.vmap(lambda p, x: spmd.lax.switch(p, [lambda v: v + 1.0, lambda v: v * 3.0,
                                                   lambda v: -v], x))
    for k, want in ((0, 3.0), (1, 6.0), (2, -2.0), (5, -2.0), (-1, 3.0)):
        got = f(np.array([k], np.int32), np.array([2.0], np.float32))
        np.testing.assert_allclose(np.asarray(got), [want])
    text = str(spmd.make_jaxpr(f)(np.array([1], np.int32), np.array([2.0], np.float32)))
    assert "cond[" in text and "select_n" not in text
    # Larger batches still select per element.
    got = f(np.array([0, 1, 2], np.int32), np.array([2.0, 2.0, 2.0], np.float32))
    np.testing.assert_allclose(np.asarray(got), [3.0, 6.0, -2.0])

