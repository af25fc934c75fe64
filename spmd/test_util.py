"""Testing helpers: ``check_grads`` compares derivatives with finite differences."""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.autodiff import jvp, vjp
from spmd.config import config


def _as_f64(x):
    """x in 64-bit precision: complex stays complex (complex128), so neither the
    imaginary parts of inputs nor those of outputs are dropped from the check."""
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _numerical_jvp(f, args, tangents, eps):
    plus = f(*[a + eps * t for a, t in zip(args, tangents)])
    minus = f(*[a - eps * t for a, t in zip(args, tangents)])
    return tree_util.tree_map(lambda p, m: (_as_f64(p) - _as_f64(m)) / (2 * eps), plus, minus)


def _rand_like(rng, x):
    """A random direction for ``x``: complex for a complex ``x`` (a real one would
    check only the derivative along the real axis)."""
    if np.iscomplexobj(x):
        return rng.standard_normal(np.shape(x)) + 1j * rng.standard_normal(np.shape(x))
    return rng.standard_normal(np.shape(x))


def _pair(a, b) -> float:
    """The real pairing Re(sum(a * b)) under which JAX's vjp is the transpose of
    its jvp (for complex values: grad = dL/dx - i dL/dy)."""
    return float(np.real(np.sum(_as_f64(a) * _as_f64(b))))


def _close(name, a, b, atol, rtol):
    for x, y in zip(tree_util.tree_leaves(a), tree_util.tree_leaves(b)):
        np.testing.assert_allclose(_as_f64(x), _as_f64(y), atol=atol, rtol=rtol,
                                   err_msg=f"check_grads: {name} mismatch")


def check_grads(f: Callable, args: Sequence, order: int = 2, modes=("fwd", "rev"),
                atol: float = 1e-5, rtol: float = 1e-4, eps: float = 1e-4, seed: int = 0) -> None:
    """Check ``f``'s derivatives up to ``order`` against central finite differences.

    The check runs in float64 (64-bit mode is switched on for its duration), so
    float32 truncation does not hide or fake errors.  ``modes`` chooses forward
    (jvp) and/or reverse (vjp) mode; order 2 checks the derivatives of the
    derivative functions as well.  Complex inputs get complex directions and complex
    outputs are compared whole; reverse mode is checked under the real pairing
    Re(sum(a * b)), JAX's convention (``grad`` of a real function of ``z = x + iy``
    is ``dL/dx - i dL/dy``).

    >>> check_grads(lambda x: (x ** 3).sum(), (np.array([1.0, 2.0]),), order=2)
    """
    old = config.enable_x64
    config.update("enable_x64", True)
    try:
        args = [_as_f64(a) for a in args]
        rng = np.random.default_rng(seed)
        _check(f, args, order, modes, atol, rtol, eps, rng, jvp, vjp)
    finally:
        config.update("enable_x64", old)


def _check(f, args, order, modes, atol, rtol, eps, rng, jvp, vjp):
    if order == 0:
        return
    tangents = [_rand_like(rng, a) for a in args]
    if "fwd" in modes:
        num = _numerical_jvp(f, args, tangents, eps)
        _, ana = jvp(f, tuple(args), tuple(tangents))
        _close("jvp", ana, num, atol, rtol)
        if order > 1:
            _check(lambda *a: jvp(f, tuple(a), tuple(tangents))[1], args, order - 1, modes,
                   atol, rtol, eps, rng, jvp, vjp)
    if "rev" in modes:
        out, f_vjp = vjp(f, *args)
        cts = tree_util.tree_map(lambda o: _rand_like(rng, o), out)
        ct_in = f_vjp(cts)
        # <ct, J t> must equal <J^T ct, t> (the real pairing, see _pair).
        num = _numerical_jvp(f, args, tangents, eps)
        lhs = sum(_pair(c, n) for c, n in
                  zip(tree_util.tree_leaves(cts), tree_util.tree_leaves(num)))
        rhs = sum(_pair(g, t) for g, t in zip(ct_in, tangents))
        np.testing.assert_allclose(rhs, lhs, atol=atol * 10, rtol=rtol,
                                   err_msg="check_grads: vjp mismatch")
        if order > 1:
            _check(lambda *a: vjp(f, *a)[1](cts), args, order - 1, modes, atol, rtol, eps,
                   rng, jvp, vjp)

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()
