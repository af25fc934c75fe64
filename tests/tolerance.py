"""Tolerances that follow the scale of the summed terms (docs/testing.md, "Tolerances").

BLAS chooses a kernel, and with it the order in which a product's or a sum's terms
are added, by the CPU, the operands' shapes, its thread count and settings such as
``OPENBLAS_CORETYPE``: the same values multiplied in one call or in parts, or laid out
differently, may differ in their last bits, and a relative tolerance fails where
terms cancel (a result near zero made of large terms).  What any summation order
keeps is the rounding bound: ``n`` float terms added in any order are within
``n * eps * sum(|terms|)`` of their exact sum (twice the classical bound ``n * u``,
so it also covers two computations compared with each other).  A wrong result (a
term lost, doubled or misplaced) is off by about one term, far more than that.

The oracle of gradient tests, a central difference in float64, is here too
(:func:`numerical_grad`).

>>> assert_product_close(split_matmul(a, b), a, b)          # doctest: +SKIP
>>> assert_sum_close(total, x, axis=0)                      # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np


def _eps(*arrays) -> float:
    dtype = np.result_type(*[np.asarray(a).dtype for a in arrays])
    return float(np.finfo(dtype if np.issubdtype(dtype, np.inexact) else np.float64).eps)


def product_tolerance(a, b) -> np.ndarray:
    """Elementwise bound on the rounding of ``a @ b`` (matmul's broadcasting): ``k * eps *
    (|a| @ |b|)``, ``k`` the contracted length and ``eps`` that of the operands' type."""
    a, b = np.asarray(a), np.asarray(b)
    k = a.shape[-1]
    return k * _eps(a, b) * np.matmul(np.abs(a.astype(np.float64)),
                                      np.abs(b.astype(np.float64)))


def sum_tolerance(x, axis=None) -> np.ndarray:
    """Elementwise bound on the rounding of ``x.sum(axis)``: ``n * eps * sum(|x|)``, ``n``
    the number of terms in each sum."""
    x = np.asarray(x)
    n = x.size // max(np.asarray(x.sum(axis=axis)).size, 1) if x.size else 0
    return n * _eps(x) * np.abs(x.astype(np.float64)).sum(axis=axis)


def assert_within(actual, expected, tolerance, what: str = "") -> None:
    """``|actual - expected| <= tolerance`` elementwise (NaN equal to NaN); the message
    names how many elements are off, the worst against its tolerance, and the first."""
    actual = np.asarray(actual)
    expected = np.broadcast_to(np.asarray(expected, np.float64), actual.shape)
    tolerance = np.broadcast_to(np.asarray(tolerance, np.float64), actual.shape)
    diff = np.abs(actual.astype(np.float64) - expected)
    bad = ~((diff <= tolerance) | (np.isnan(actual) & np.isnan(expected)))
    if not bad.any():
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        worst = float(np.nanmax(np.where(bad, diff / tolerance, 0)))
    raise AssertionError(
        f"{what or 'result'}: {int(bad.sum())} of {bad.size} elements differ by more than "
        f"their tolerance (n * eps * the sum of the terms' magnitudes); the worst by "
        f"{worst:.3g}x it; first at {first}: actual {actual[first]!r}, expected "
        f"{expected[first]!r}, tolerance {tolerance[first]:.3g}")


def assert_product_close(actual, a, b, what: str = "a @ b") -> None:
    """``actual`` is ``a @ b`` to rounding, whatever order its terms were added in
    (compared with the product in float64)."""
    exact = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert_within(actual, exact, product_tolerance(a, b), what)


def assert_sum_close(actual, x, axis=None, what: str = "the sum") -> None:
    """``actual`` is ``x.sum(axis)`` to rounding, whatever order its terms were added in
    (compared with the sum in float64)."""
    exact = np.asarray(x, np.float64).sum(axis=axis)
    assert_within(actual, exact, sum_tolerance(x, axis), what)


def numerical_grad(f, x, eps: float) -> np.ndarray:
    """The central-difference gradient of the scalar function ``f`` at ``x``, in
    float64: the oracle of gradient tests (its error is O(eps**2) plus rounding of
    order ``1e-16 / eps``; choose ``eps`` and the tolerance together).

    >>> numerical_grad(lambda x: (x ** 2).sum(), np.array([1.0, 2.0]), 1e-3)
    array([2., 4.])
    """
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g
