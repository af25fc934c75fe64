"""Python control flow on primal values under grad/vjp/jvp/linearize outside jit
(JAX's autodiff cookbook), against closed-form derivatives and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.errors import TracerBoolConversionError


def _f(x):
    if x < 3:
        return 3.0 * x ** 2
    return -4 * x


def test_cookbook_branch_on_a_value():
    g = spmd.grad(_f)
    assert float(g(2.0)) == 12.0 and float(g(4.0)) == -4.0
    # Second derivatives take the branch too.
    gg = spmd.grad(spmd.grad(_f))
    assert float(gg(2.0)) == 6.0 and float(gg(4.0)) == 0.0
    # Forward mode, vjp and linearize.
    y, t = spmd.jvp(_f, (2.0,), (1.0,))
    assert (float(y), float(t)) == (12.0, 12.0)
    y, pull = spmd.vjp(_f, 4.0)
    assert float(y) == -16.0 and float(pull(1.0)[0]) == -4.0
    y, push = spmd.linearize(_f, 2.0)
    assert float(push(2.0)) == 24.0


def test_loops_conversions_and_arrays():
    def power(x, n):
        out = 1.0
        for _ in range(int(n)):  # int() of a concrete value
            out = out * x
        return out

    assert float(spmd.grad(power)(3.0, 4)) == 108.0

    def h(x):
        y = snp.sin(x)
        while float(snp.sum(y)) > 0.5:  # float() of a concrete primal
            y = y / 2
        return snp.sum(y * x)

    x = np.array([1.0, 2.0], np.float32)
    # sum(sin(x)) = 1.75 is halved twice (to 0.44): the derivative is scaled by 1/4.
    g = spmd.grad(h)(x)
    np.testing.assert_allclose(np.asarray(g), 0.25 * (np.cos(x) * x + np.sin(x)), rtol=1e-6)

    def relu_sum(x):
        if snp.all(x > 0):
            return snp.sum(x ** 2)
        return snp.sum(snp.maximum(x, 0.0))

    np.testing.assert_allclose(np.asarray(spmd.grad(relu_sum)(x)), 2 * x)
    np.testing.assert_allclose(np.asarray(spmd.grad(relu_sum)(-x)), [0.0, 0.0])


def test_higher_order_primitives_give_concrete_primals():
    @spmd.jit
    def inner(x):
        return snp.sin(x) * 2

    def k(x):
        y = inner(x)
        if y > 1.0:  # y comes out of a jit call: concrete all the same
            return y * x
        return -y

    np.testing.assert_allclose(float(spmd.grad(k)(1.0)), 2 * np.cos(1.0) + 2 * np.sin(1.0),
                               rtol=1e-6)
    np.testing.assert_allclose(float(spmd.grad(k)(0.1)), -2 * np.cos(0.1), rtol=1e-6)

    def prod(x):
        c, _ = lax.scan(lambda c, v: (c * v, c), 1.0, x)
        return c if c > 0 else -c

    np.testing.assert_allclose(np.asarray(spmd.grad(prod)(np.array([1.0, 2.0, 3.0]))),
                               [6.0, 3.0, 2.0])
    np.testing.assert_allclose(np.asarray(spmd.grad(prod)(np.array([1.0, -2.0, 3.0]))),
                               [6.0, -3.0, 2.0])

    mesh = spmd.make_mesh((4,), ("i",))
    total = spmd.shard_map(lambda b: lax.psum(snp.sum(b * b), "i"), mesh=mesh,
                           in_specs=P("i"), out_specs=P())

    def sm(x):
        t = total(x)
        return t if t < 100 else snp.sqrt(t)

    x = np.arange(8, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(spmd.grad(sm)(x / 8)), 2 * x / 8, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(spmd.grad(sm)(x)), x / np.sqrt((x * x).sum()),
                               rtol=1e-6)


def test_matches_the_traced_path_and_finite_differences():
    from spmd.test_util import check_grads

    def f(x, w):
        y = snp.tanh(x @ w)
        if snp.sum(y) > 0:
            y = y * 2
        return snp.sum(lax.cumsum(y, axis=0) ** 2)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    check_grads(f, (x, w), order=2, modes=("rev",))
    # Without the branch, the eager and the jitted gradients agree.
    g_eager = spmd.grad(lambda x, w: snp.sum(snp.tanh(x @ w) ** 2), argnums=(0, 1))(x, w)
    g_jit = spmd.jit(spmd.grad(lambda x, w: snp.sum(snp.tanh(x @ w) ** 2),
                               argnums=(0, 1)))(x, w)
    for a, b in zip(g_eager, g_jit):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5)


def test_under_jit_the_branch_still_needs_cond():
    with pytest.raises(TracerBoolConversionError, match="lax.cond"):
        spmd.jit(spmd.grad(_f))(2.0)
    with pytest.raises(TracerBoolConversionError):
        spmd.vmap(spmd.grad(_f))(np.array([2.0, 4.0]))


def test_pullback_keeps_its_inputs_when_the_caller_mutates_them():
    x = np.array([1.0, 2.0], np.float32)
    y, pull = spmd.vjp(lambda x: snp.sum(snp.sin(x) * x), x)
    x[:] = 100.0
    (g,) = pull(np.float32(1.0))
    x0 = np.array([1.0, 2.0])
    np.testing.assert_allclose(np.asarray(g), np.cos(x0) * x0 + np.sin(x0), rtol=1e-6)
