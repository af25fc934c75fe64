"""Autodiff: values against numpy, derivatives against finite differences,
program sizes against the hand-written gradient, and every error case."""

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.autodiff import GradientError
from spmd.errors import ArgumentError
from spmd.test_util import check_grads

rng = np.random.default_rng(0)


def mlp_params(sizes):
    return [(rng.standard_normal((m, n)).astype(np.float32) / np.sqrt(m),
             rng.standard_normal(n).astype(np.float32)) for m, n in zip(sizes[:-1], sizes[1:])]


def mlp_loss(params, x):
    for w, b in params:
        x = snp.tanh(x @ w + b)
    return snp.sum(x ** 2)


def count(program, name):
    return sum(e.primitive.name == name for e in program.eqns)


@pytest.mark.parametrize("layers", [1, 2, 3, 4])
def test_mlp_gradient_has_3L_minus_1_dots(layers):
    params = mlp_params([8] * (layers + 1))
    x = rng.standard_normal((4, 8)).astype(np.float32)
    lowered = spmd.jit(spmd.grad(mlp_loss)).lower(params, x)
    assert count(lowered.program, "dot_general") == 3 * layers - 1
    # make_jaxpr shows no dead equations: every equation's output is used.
    closed = spmd.make_jaxpr(spmd.grad(mlp_loss))(params, x)
    used = {a for e in closed.eqns for a in e.inputs} | set(closed.jaxpr.outvars)
    assert all(any(o in used for o in e.outputs) for e in closed.eqns)


def test_mlp_gradient_matches_finite_differences():
    params = mlp_params([3, 4, 2])
    x = rng.standard_normal((5, 3))
    flat = [p for wb in params for p in wb]

    def f(*ps):
        return mlp_loss([(ps[0], ps[1]), (ps[2], ps[3])], x)

    check_grads(f, flat, order=2, modes=("fwd", "rev"))


def test_jvp_linearize_vjp_agree():
    f = lambda x, y: snp.sin(x) * y + snp.exp(y)
    x, y = np.float32(0.3), np.float32(-0.7)
    out, t = spmd.jvp(f, (x, y), (np.float32(1.0), np.float32(2.0)))
    _, f_lin = spmd.linearize(f, x, y)
    np.testing.assert_allclose(f_lin(np.float32(1.0), np.float32(2.0)), t, rtol=1e-6)
    _, f_vjp = spmd.vjp(f, x, y)
    gx, gy = f_vjp(np.float32(1.0))
    np.testing.assert_allclose([gx, gy], [np.cos(x) * y, np.sin(x) + np.exp(y)], rtol=1e-5)
    np.testing.assert_allclose(out, np.sin(x) * y + np.exp(y), rtol=1e-6)


def test_compositions():
    f = lambda x: snp.sum(snp.tanh(x) ** 3)
    x = rng.standard_normal(4).astype(np.float32)
    g1 = spmd.grad(spmd.jit(f))(x)
    g2 = spmd.jit(spmd.grad(f))(x)
    np.testing.assert_allclose(g1, g2, rtol=1e-6)
    h = spmd.jacfwd(spmd.jacrev(f))(x)
    np.testing.assert_allclose(h, spmd.hessian(f)(x), rtol=1e-5)
    gg = spmd.grad(lambda x: spmd.grad(f)(x).sum())(x)
    np.testing.assert_allclose(gg, np.asarray(h).sum(0), rtol=1e-4, atol=1e-6)
    per_example = spmd.vmap(spmd.grad(lambda w, x: snp.sum(snp.tanh(x * w))), in_axes=(None, 0))
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    w = np.float32(0.5)
    expect = [(x_ * (1 - np.tanh(x_ * w) ** 2)).sum() for x_ in xs]
    np.testing.assert_allclose(per_example(w, xs), expect, rtol=1e-5)


def test_integer_inputs_get_float0_cotangents():
    _, f_vjp = spmd.vjp(lambda x, n: x * n, np.float32(2.0), np.int32(3))
    gx, gn = f_vjp(np.float32(1.0))
    assert float(gx) == 3.0
    assert gn.dtype == spmd.compiler.core.dtypes.float0


def test_unused_input_costs_nothing():
    f = lambda x, y: snp.sum(x * 2.0)
    prog = spmd.jit(spmd.grad(f, argnums=(0, 1))).lower(np.ones(3, np.float32),
                                                          np.ones(3, np.float32)).program
    assert count(prog, "mul") == 0  # d/dx of 2x is a constant; y's gradient is zeros


def test_custom_jvp_and_vjp():
    @spmd.custom_jvp
    def f(x):
        return snp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        return f(primals[0]), 2.0 * snp.cos(primals[0]) * tangents[0]

    np.testing.assert_allclose(spmd.grad(f)(np.float32(1.0)), 2 * np.cos(1.0), rtol=1e-6)

    @spmd.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (snp.clip(g, -1.0, 1.0),))
    g = spmd.grad(lambda x: snp.sum(clip_grad(x) * 5.0))(np.ones(3, np.float32))
    np.testing.assert_allclose(g, np.ones(3))

    @spmd.custom_vjp
    def scale(s, x):
        return x * s

    scale.defvjp(lambda s, x: (x * s, s), lambda s, res, g: (res * g,))
    scale.nondiff_argnums = (0,)
    np.testing.assert_allclose(spmd.grad(lambda x: scale(3.0, x))(np.float32(2.0)), 3.0)


@pytest.mark.parametrize("policy,expect_dots", [
    ("nothing_saveable", 0), ("dots_saveable", 1), ("everything_saveable", None)])
def test_checkpoint_residuals_follow_policy(policy, expect_dots):
    pol = getattr(spmd.checkpoint_policies, policy)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)

    def layer(w, x):
        return snp.sin(x @ w) @ w

    f = lambda w, x: snp.sum(spmd.checkpoint(layer, policy=pol)(w, x))
    res = spmd.ad_checkpoint.saved_residuals(f, w, x)
    shapes = sorted(tuple(a.shape) for a, _ in res)
    assert (4, 4) in shapes and (2, 4) in shapes  # the inputs are always available
    plain = spmd.grad(lambda w, x: snp.sum(layer(w, x)))(w, x)
    np.testing.assert_allclose(spmd.grad(f)(w, x), plain, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(spmd.jit(spmd.grad(f))(w, x), plain, rtol=1e-5, atol=1e-6)
    prog = spmd.jit(spmd.grad(f)).lower(w, x).program
    recompute = [e for e in prog.eqns if e.primitive.name == "remat"]
    if policy == "everything_saveable":
        assert not recompute
    else:
        assert len(recompute) == 1
        dots = count(recompute[0].params["program"].program, "dot_general")
        assert dots == (1 if policy == "nothing_saveable" else 0)


# ------------------------------------------------------------------ errors

def test_grad_errors():
    with pytest.raises(GradientError, match="scalar"):
        spmd.grad(lambda x: x * 2.0)(np.ones(3, np.float32))
    with pytest.raises(GradientError, match="floating"):
        spmd.grad(lambda x: snp.sum(x))(np.ones(3, np.int32))
    with pytest.raises(ArgumentError, match="argnums=2"):
        spmd.grad(lambda x, y: snp.sum(x), argnums=2)(1.0, 2.0)
    with pytest.raises(GradientError, match="pair"):
        spmd.grad(lambda x: x * 2.0, has_aux=True)(1.0)
    g, aux = spmd.grad(lambda x: (x * 2.0, {"a": x}), has_aux=True)(1.0)
    assert float(g) == 2.0 and float(aux["a"]) == 1.0


def test_vmap_errors():
    with pytest.raises(ArgumentError, match="prefix"):
        spmd.vmap(lambda x, y: x, in_axes=((0, 0), None))(np.ones(3), np.ones(3))
    with pytest.raises(ArgumentError, match=r"3 .*argument\[1\].*4|4 .*argument\[1\]"):
        spmd.vmap(lambda x, y: x + y)(np.ones(4), np.ones(3))
    with pytest.raises(ArgumentError, match="out of range"):
        spmd.vmap(lambda x: x, in_axes=2)(np.ones((2, 2)))


def test_a_cotangent_of_the_right_dtype_is_taken_as_it_is():
    """A weak-typed cotangent (a Python float) of a float32 output adds no conversion
    to the backward program, as in JAX; one of another dtype is converted."""
    f_vjp = spmd.vjp(lambda x: x * 2.0, np.float32(1.0))[1]
    text = str(spmd.make_jaxpr(f_vjp)(1.0))
    assert "convert_element_type" not in text, text
    (g,) = f_vjp(1.0)
    assert g.dtype == np.float32 and float(g) == 2.0
    (g,) = f_vjp(np.float64(3.0))  # (canonicalised to float32: no x64)
    assert g.dtype == np.float32 and float(g) == 6.0
