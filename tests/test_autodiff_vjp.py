"""``spmd.vjp``'s backward function is a pytree whose leaves are its residuals (as JAX's
``Partial``): it passes through jit, through a custom_vjp's residuals and through
``tree_util``, and gives the cotangents numpy does.  ``grad(..., allow_int=True)``
returns float0 cotangents out of jit too (``spmd.dtypes.float0``)."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import tree_util
from spmd.errors import SpmdError


def f(x, y):
    return snp.sin(x) * y, x * 2.0


X = np.float32(0.5)
Y = np.arange(3, dtype=np.float32)
CT = (np.ones(3, np.float32), np.float32(1.0))
# d/dx of sum(sin(x) * y) + 2x, and of sum(...) by y.
WANT = (np.cos(X) * Y.sum() + 2.0, np.sin(X) * np.ones(3))


def test_the_backward_function_is_a_pytree_of_its_residuals():
    out, f_vjp = spmd.vjp(f, X, Y)
    leaves, tree = tree_util.tree_flatten(f_vjp)
    assert leaves and all(hasattr(v, "shape") for v in leaves)
    rebuilt = tree_util.tree_unflatten(tree, leaves)
    for got, want in zip(rebuilt(CT), WANT):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_the_backward_function_passes_through_jit():
    _, f_vjp = spmd.vjp(f, X, Y)
    got = spmd.jit(lambda fn, c: fn(c))(f_vjp, CT)
    for g, w in zip(got, WANT):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)
    # Under jit, vjp's function is made of traced residuals, returned as leaves.
    fn = spmd.jit(lambda x, y: spmd.vjp(f, x, y)[1])(X, Y)
    for g, w in zip(fn(CT), WANT):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


def test_the_backward_function_as_a_custom_vjp_residual():
    @spmd.custom_vjp
    def h(x, y):
        return f(x, y)

    def h_fwd(x, y):
        return spmd.vjp(f, x, y)

    def h_bwd(f_vjp, ct):
        return f_vjp(ct)

    h.defvjp(h_fwd, h_bwd)
    loss = lambda x, y: snp.sum(h(x, y)[0]) + h(x, y)[1]  # noqa: E731
    for fn in (spmd.grad(loss, argnums=(0, 1)), spmd.jit(spmd.grad(loss, argnums=(0, 1)))):
        for g, w in zip(fn(X, Y), WANT):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


def test_a_cotangent_of_the_wrong_structure_is_named():
    _, f_vjp = spmd.vjp(f, X, Y)
    with pytest.raises(SpmdError, match=r"vjp\(f\): the cotangent's structure"):
        f_vjp(CT[0])


def test_float0_cotangents_leave_jit():
    g = spmd.jit(spmd.grad(lambda x, n: snp.sum(x * 2.0), argnums=(0, 1), allow_int=True))
    gx, gn = g(np.ones(3, np.float32), np.arange(3))
    np.testing.assert_array_equal(np.asarray(gx), 2.0)
    assert gn.dtype == spmd.dtypes.float0 and gn.shape == (3,)
    assert spmd.dtypes.canonicalize_dtype(np.float64) == np.float32
