"""custom_vjp.defvjp(symbolic_zeros=True) with JAX's semantics: fwd receives
CustomVJPPrimal(value, perturbed) leaves, bwd receives SymbolicZero for zero output
cotangents and may return None or a SymbolicZero.  Oracles: numpy derivatives and
finite differences (check_grads)."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd.compiler.transforms.custom import CustomRuleError
from spmd.custom_derivatives import CustomVJPPrimal, SymbolicZero, custom_vjp
from spmd.test_util import check_grads

F32 = np.float32


def _sin_times(seen):
    """f(x, y) = (sin(x) * y, 2 y), recording what its rules receive."""
    @custom_vjp
    def f(x, y):
        return snp.sin(x) * y, 2.0 * y

    def fwd(x, y):
        seen.append(("fwd", type(x), x.perturbed, y.perturbed))
        return f(x.value, y.value), (snp.cos(x.value), snp.sin(x.value), y.value)

    def bwd(res, g):
        c, s, y = res
        g1, g2 = g
        seen.append(("bwd", isinstance(g1, SymbolicZero), isinstance(g2, SymbolicZero)))
        if isinstance(g1, SymbolicZero):
            return None, 2.0 * g2
        gy = s * g1 if isinstance(g2, SymbolicZero) else s * g1 + 2.0 * g2
        return c * g1 * y, gy

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f


def test_fwd_sees_which_inputs_are_perturbed_and_bwd_sees_zero_cotangents():
    seen = []
    f = _sin_times(seen)
    x, y = F32(0.5), F32(3.0)
    g = spmd.grad(lambda x, y: f(x, y)[0])(x, y)
    np.testing.assert_allclose(g, np.cos(0.5) * 3.0, rtol=1e-6)
    assert seen == [("fwd", CustomVJPPrimal, True, False), ("bwd", False, True)]
    seen.clear()
    g = spmd.grad(lambda x, y: f(x, y)[1], argnums=1)(x, y)
    assert float(g) == 2.0
    assert seen == [("fwd", CustomVJPPrimal, False, True), ("bwd", True, False)]
    seen.clear()
    gx, gy = spmd.jit(spmd.grad(lambda x, y: snp.sum(f(x, y)[0] + f(x, y)[1]),
                                argnums=(0, 1)))(x, y)
    np.testing.assert_allclose([gx, gy], [np.cos(0.5) * 3.0, np.sin(0.5) + 2.0], rtol=1e-6)
    assert seen[0][1:] == (CustomVJPPrimal, True, True)


def test_values_match_finite_differences_also_under_vmap():
    f = _sin_times([])
    x = np.linspace(-1, 1, 5).astype(F32)
    y = np.linspace(1, 2, 5).astype(F32)
    check_grads(lambda x, y: snp.sum(f(x, y)[0] * f(x, y)[1]), (x, y), order=1,
                modes=("rev",))
    # grad of a vmapped custom_vjp: the rules are mapped, zeros stay symbolic.
    g = spmd.grad(lambda x: snp.sum(spmd.vmap(lambda a, b: f(a, b)[0])(x, y)))(x)
    np.testing.assert_allclose(g, np.cos(x) * y, rtol=1e-6)
    gy = spmd.grad(lambda y: snp.sum(spmd.vmap(lambda a, b: f(a, b)[1])(x, y)))(y)
    np.testing.assert_allclose(gy, 2.0 * np.ones(5), rtol=1e-6)


def test_pytree_arguments_and_nondiff_argnums():
    seen = []

    @custom_vjp
    def f(scale, p):
        return scale * p["a"] * p["b"]

    def fwd(scale, p):
        seen.append((scale, p["a"].perturbed, p["b"].perturbed))
        return f(scale, {"a": p["a"].value, "b": p["b"].value}), (p["a"].value, p["b"].value)

    def bwd(scale, res, g):
        a, b = res
        return ({"a": scale * g * b, "b": scale * g * a},)

    f = custom_vjp(f.fun, nondiff_argnums=(0,))
    f.defvjp(fwd, bwd, symbolic_zeros=True)
    g = spmd.grad(lambda a: f(3.0, {"a": a, "b": F32(2.0)}))(F32(5.0))
    assert float(g) == 6.0
    assert seen == [(3.0, True, False)]


def test_bwd_may_return_a_symbolic_zero():
    @custom_vjp
    def f(x):
        return snp.floor(x)

    f.defvjp(lambda x: (f(x.value), None),
             lambda r, g: (SymbolicZero(spmd.compiler.core.avals.ShapedArray((), F32)),),
             symbolic_zeros=True)
    assert float(spmd.grad(f)(F32(2.5))) == 0.0


def test_fwd_returning_its_primal_objects_is_an_error():
    @custom_vjp
    def f(x):
        return snp.sin(x)

    f.defvjp(lambda x: (f(x.value), x), lambda r, g: (g,), symbolic_zeros=True)
    with pytest.raises(CustomRuleError, match="returned a CustomVJPPrimal in its residuals"):
        spmd.grad(f)(F32(1.0))
    f.defvjp(lambda x: (x, None), lambda r, g: (g,), symbolic_zeros=True)
    with pytest.raises(CustomRuleError, match="CustomVJPPrimal in its output.*x.value"):
        spmd.grad(f)(F32(1.0))


def test_defvjp_rejects_rules_that_are_not_functions():
    f = custom_vjp(lambda x: x)
    with pytest.raises(CustomRuleError, match="defvjp's bwd must be a function, got int"):
        f.defvjp(lambda x: (x, None), 3, symbolic_zeros=True)
    with pytest.raises(CustomRuleError, match="defvjp's fwd must be a function"):
        f.defvjp(None, lambda r, g: (g,))


def test_without_differentiation_fwd_is_not_called():
    seen = []
    f = _sin_times(seen)
    out = f(F32(0.5), F32(3.0))
    np.testing.assert_allclose(out[0], np.sin(0.5) * 3.0, rtol=1e-6)
    assert seen == []
