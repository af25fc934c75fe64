"""``spmd.scipy.linalg`` (as ``jax.scipy.linalg``): Cholesky solves, triangular
solves and the decompositions of :mod:`spmd.numpy.linalg` with scipy's signatures.

>>> import numpy as np
>>> from spmd.scipy.linalg import cho_factor, cho_solve
>>> a = np.array([[4.0, 2.0], [2.0, 3.0]], np.float32)
>>> cho_solve(cho_factor(a), np.array([2.0, 1.0], np.float32))
Array([0.5, 0. ], dtype=float32)
"""

from __future__ import annotations

import spmd.numpy as snp
from spmd.errors import ArgumentError
from spmd.numpy import linalg as _la

__all__ = ["cho_factor", "cho_solve", "cholesky", "det", "eigh", "inv", "qr", "solve",
           "solve_triangular", "svd"]


def cholesky(a, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True):
    """The Cholesky factor, upper by default (scipy's convention)."""
    return _la.cholesky(a, upper=not lower)


def cho_factor(a, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True):
    """``(c, lower)`` for :func:`cho_solve` (``c`` is the factor; the other triangle is
    zero here, where scipy leaves garbage)."""
    return cholesky(a, lower=lower), lower


def _tri(a, b, lower, trans):
    """``x`` with ``op(a) x = b`` for triangular ``a``, ``op`` the identity or a transpose."""
    a = snp.asarray(a)
    if trans in (1, 2, "T", "C"):
        a, lower = snp.swapaxes(a, -1, -2), not lower
        if trans in (2, "C"):  # the conjugate transpose (the transpose for real a)
            a = snp.conj(a)
    elif trans not in (0, "N"):
        raise ArgumentError(f"solve_triangular: trans={trans!r} must be 0, 1, 2, 'N', 'T' or "
                            "'C'")
    a = snp.tril(a) if lower else snp.triu(a)
    return _la.solve(a, b)


def solve_triangular(a, b, trans=0, lower: bool = False, unit_diagonal: bool = False,
                     overwrite_b: bool = False, check_finite: bool = True):
    """Solve ``a x = b`` (or ``a.T x = b``) reading only ``a``'s triangle."""
    if unit_diagonal:
        a = snp.asarray(a)
        n = a.shape[-1]
        a = snp.where(snp.eye(n, dtype=bool), snp.ones((), a.dtype), a)
    return _tri(a, b, lower, trans)


def cho_solve(c_and_lower, b, overwrite_b: bool = False, check_finite: bool = True):
    """Solve ``A x = b`` given ``cho_factor(A)``."""
    c, lower = c_and_lower
    if lower:  # A = L L^H
        return _tri(c, _tri(c, b, True, 0), True, "C")
    return _tri(c, _tri(c, b, False, "C"), False, 0)  # A = U^H U


def solve(a, b, lower: bool = False, overwrite_a: bool = False, overwrite_b: bool = False,
          debug: bool = False, check_finite: bool = True, assume_a: str = "gen"):
    """Solve ``a x = b`` (``assume_a='pos'`` uses a Cholesky factorization)."""
    if assume_a == "pos":
        return cho_solve(cho_factor(a, lower=lower), b)
    if assume_a not in ("gen", "sym", "her"):
        raise ArgumentError(f"solve: assume_a={assume_a!r} must be 'gen', 'sym', 'her' or "
                            "'pos'")
    return _la.solve(a, b)


def inv(a, overwrite_a: bool = False, check_finite: bool = True):
    """The matrix inverse."""
    return _la.inv(a)


def det(a, overwrite_a: bool = False, check_finite: bool = True):
    """The determinant."""
    return _la.det(a)


def eigh(a, b=None, lower: bool = True, eigvals_only: bool = False, **kwargs):
    """Eigenvalues (and eigenvectors) of a symmetric matrix (no generalized problem)."""
    if b is not None:
        raise ArgumentError("eigh: the generalized problem (b=...) is not supported")
    w, v = _la.eigh(a, UPLO="L" if lower else "U")
    return w if eigvals_only else (w, v)


def svd(a, full_matrices: bool = True, compute_uv: bool = True, overwrite_a: bool = False,
        check_finite: bool = True, lapack_driver: str = "gesdd"):
    """The singular value decomposition ``(U, s, Vh)`` (or ``s``)."""
    return _la.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)


def qr(a, overwrite_a: bool = False, lwork=None, mode: str = "full", pivoting: bool = False,
       check_finite: bool = True):
    """QR decomposition with scipy's modes (``'full'``, ``'economic'``, ``'r'``)."""
    if pivoting:
        raise ArgumentError("qr: pivoting=True is not supported")
    modes = {"full": "complete", "economic": "reduced", "r": "r"}
    if mode not in modes:
        raise ArgumentError(f"qr: mode={mode!r} must be 'full', 'economic' or 'r'")
    out = _la.qr(a, mode=modes[mode])
    return (out,) if mode == "r" else tuple(out)
