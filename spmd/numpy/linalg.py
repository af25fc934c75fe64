"""``spmd.numpy.linalg``: norms, solves and decompositions (like ``jax.numpy.linalg``).

Matrices sit in the last two axes; leading axes are batches.  Integer inputs
are promoted to the default float.  Everything is differentiable (the
decompositions' derivatives are in :mod:`spmd.compiler.ops.linalg_decomp`)
and vmappable.

>>> import spmd.numpy as snp
>>> a = snp.array([[4.0, 2.0], [2.0, 3.0]])
>>> snp.linalg.solve(a, snp.array([2.0, 1.0]))
Array([0.5, 0. ], dtype=float32)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.custom import custom_jvp
from spmd.compiler.ops import linalg_decomp as _ld
from spmd.errors import ArgumentError, ShapeError
from spmd.numpy import _elementwise as ew
from spmd.numpy import _reductions as red
from spmd.numpy._complex import conj
from spmd.numpy._creation import eye
from spmd.numpy._elementwise import exp, where
from spmd.numpy._reductions import prod, sum as sum_
from spmd.numpy._shape import moveaxis, swapaxes
from spmd.numpy._util import (broadcast_shapes, broadcast_to_shape, canonicalize_axes,
                              promote_to_float, require_static)

__all__ = ["cholesky", "det", "eigh", "eigvalsh", "inv", "norm", "qr", "slogdet", "solve",
           "svd", "svdvals", "EighResult", "QRResult", "SlogdetResult", "SVDResult"]


class EighResult(NamedTuple):
    eigenvalues: object
    eigenvectors: object


class QRResult(NamedTuple):
    Q: object
    R: object


class SlogdetResult(NamedTuple):
    sign: object
    logabsdet: object


class SVDResult(NamedTuple):
    U: object
    S: object
    Vh: object


def _matrix(a, fname, square=True):
    (x,) = promote_to_float(a, fname=fname)
    shape = x.shape
    if len(shape) < 2:
        raise ShapeError(f"{fname}: a must have at least 2 dimensions (matrices in the last "
                         f"two axes), got shape {shape}")
    if square and shape[-1] != shape[-2]:
        raise ShapeError(f"{fname}: a must hold square matrices, got shape {shape}")
    return x


def _H(x):
    """The conjugate transpose of the last two axes (the transpose for real ``x``)."""
    t = swapaxes(x, -1, -2)
    return conj(t) if dtypes.is_complex(x.dtype) else t


def _symmetrize(x):
    """``(x + x^H) / 2``: the symmetric (Hermitian) part, as JAX symmetrizes."""
    return (x + _H(x)) * 0.5


def solve(a, b):
    """``x`` with ``a @ x == b``.  ``b`` is a vector when it is 1-d, otherwise a stack of
    matrices (numpy 2's rule); batch axes broadcast.

    >>> solve(snp.eye(2) * 2, snp.ones((2, 3))).shape
    (2, 3)
    """
    fname = "spmd.numpy.linalg.solve"
    x = _matrix(a, fname)
    x, y = promote_to_float(x, b, fname=fname)
    n = x.shape[-1]
    vector = y.ndim == 1
    if vector:
        y = y[:, None]
    if y.ndim < 2 or y.shape[-2] != n:
        raise ShapeError(f"{fname}: b of shape {tuple(b.shape) if hasattr(b, 'shape') else np.shape(b)} "
                         f"does not match a of shape {x.shape}: b needs {n} rows "
                         "(shape (n,) or (..., n, k))")
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2], fname=fname)
    x = broadcast_to_shape(x, batch + x.shape[-2:])
    y = broadcast_to_shape(y, batch + y.shape[-2:])
    out = _ld.solve(x, y)
    return out[..., 0] if vector else out


def inv(a):
    """The inverse of the matrices ``a`` (NaN for singular ones, as JAX).

    >>> inv(snp.eye(2) * 2)
    Array([[0.5, 0. ],
           [0. , 0.5]], dtype=float32)
    """
    x = _matrix(a, "spmd.numpy.linalg.inv")
    ident = broadcast_to_shape(eye(x.shape[-1], dtype=x.dtype), x.shape)
    return _ld.solve(x, ident)


def slogdet(a) -> SlogdetResult:
    """``(sign, logabsdet)`` of the determinants of ``a``."""
    sign, logdet = _ld.slogdet(_matrix(a, "spmd.numpy.linalg.slogdet"))
    return SlogdetResult(sign, logdet)


def det(a):
    """The determinants of ``a`` (``sign * exp(logabsdet)``).  The derivative is
    ``trace(adj(a) da)``, with the adjugate from an SVD, so it is finite at singular
    matrices too (as JAX's)."""
    return _det(_matrix(a, "spmd.numpy.linalg.det"))


def _det_value(x):
    sign, logdet = slogdet(x)
    return sign * exp(logdet)


def _adjugate(x):
    """``adj(x) = det(x) inv(x)``, as ``V diag(prod_{j != i} s_j) U^T det(U) det(V^T)``
    from ``x = U diag(s) V^T``: defined for singular ``x`` too."""
    u, s, vh = _ld.svd(x, full_matrices=False)
    n = x.shape[-1]
    others = where(eye(n, dtype=bool), 1.0, s[..., None, :])  # row i: s with s_i -> 1
    cof = prod(others, axis=-1)
    signs = _ld.slogdet(u)[0] * _ld.slogdet(vh)[0]  # det(U) det(V^H): phases when complex
    adj = _H(vh) @ (cof[..., :, None] * _H(u))
    return adj * signs[..., None, None]


def _make_det():
    @custom_jvp
    def det_(x):
        return _det_value(x)

    @det_.defjvp
    def det_jvp(primals, tangents):
        (x,), (dx,) = primals, tangents
        # d det = trace(adj(x) dx) = sum(adj(x)^T * dx)
        return det_(x), sum_(swapaxes(_adjugate(x), -1, -2) * dx, axis=(-2, -1))

    return det_


_det = _make_det()


def cholesky(a, *, upper: bool = False, symmetrize_input: bool = True):
    """The Cholesky factor (lower, or upper ``L^H`` with ``upper=True``); NaN where
    ``a`` is not positive definite.  ``a`` is symmetrized first (``(a + a^H) / 2``),
    as JAX does; complex ``a`` is Hermitian."""
    x = _matrix(a, "spmd.numpy.linalg.cholesky")
    L = _ld.cholesky(_symmetrize(x) if symmetrize_input else x)
    return _H(L) if upper else L


def qr(a, mode: str = "reduced"):
    """QR decomposition; ``mode`` is ``"reduced"``, ``"complete"`` or ``"r"``."""
    require_static(mode, "spmd.numpy.linalg.qr", "mode", "str")
    if mode not in ("reduced", "complete", "r"):
        raise ArgumentError(f"spmd.numpy.linalg.qr: mode={mode!r} is not supported; use "
                            "'reduced', 'complete' or 'r'")
    q, r = _ld.qr(_matrix(a, "spmd.numpy.linalg.qr", square=False),
                  full_matrices=mode == "complete")
    return r if mode == "r" else QRResult(q, r)


def eigh(a, UPLO: str | None = None, symmetrize_input: bool = True) -> EighResult:
    """Eigenvalues (ascending) and eigenvectors of the symmetric matrices ``a``;
    ``a`` is symmetrized first, as JAX does (``UPLO`` picks the triangle otherwise)."""
    x = _matrix(a, "spmd.numpy.linalg.eigh")
    if UPLO not in (None, "L", "U"):
        raise ArgumentError(f"spmd.numpy.linalg.eigh: UPLO={UPLO!r} must be 'L' or 'U'")
    if symmetrize_input:
        x = _symmetrize(x)
    elif UPLO == "U":  # the upper triangle of a Hermitian matrix is the lower's ^H
        x = _H(x)
    w, v = _ld.eigh(x)
    return EighResult(w, v)


def eigvalsh(a, UPLO: str | None = None):
    """The eigenvalues of the symmetric matrices ``a``, ascending."""
    return eigh(a, UPLO).eigenvalues


def svd(a, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False):
    """``SVDResult(U, S, Vh)`` with ``a = U @ diag(S) @ Vh``, or ``S`` alone."""
    x = _matrix(a, "spmd.numpy.linalg.svd", square=False)
    out = _ld.svd(x, full_matrices=full_matrices, compute_uv=compute_uv)
    return SVDResult(*out) if compute_uv else out


def svdvals(x):
    """The singular values of ``x``, descending."""
    return svd(x, compute_uv=False)


# --------------------------------------------------------------------- norm

def norm(x, ord=None, axis=None, keepdims: bool = False):
    """Vector or matrix norm, as ``numpy.linalg.norm``.

    ``axis=None``: the 2-norm of the flattened array when ``ord`` is None, else
    the vector (1-d) or matrix (2-d) norm; an int ``axis`` gives vector norms,
    a pair gives matrix norms (``'fro'``, ``'nuc'``, ``±1``, ``±2``, ``±inf``).

    >>> norm(snp.array([3.0, 4.0]))
    Array(5., dtype=float32)
    """
    fname = "spmd.numpy.linalg.norm"
    (a,) = promote_to_float(x, fname=fname)
    require_static(ord, fname, "ord", "number or string")
    nd = a.ndim
    if axis is None:
        if ord is None:
            a = _magnitude(a, fname, ord, 1)
            return _keep(_vector_norm(a.reshape(-1), 2, 0, fname), a.shape, tuple(range(nd)),
                         keepdims)
        if nd not in (1, 2):
            raise ArgumentError(f"{fname}: ord={ord!r} with axis=None needs a 1-d or 2-d "
                                f"array, got shape {a.shape}; pass axis")
        axis = tuple(range(nd))
    axes = canonicalize_axes(axis, nd, fname)
    a = _magnitude(a, fname, ord, len(axes))
    if len(axes) == 1:
        out = _vector_norm(a, 2 if ord is None else ord, axes[0], fname)
    elif len(axes) == 2:
        out = _matrix_norm(a, "fro" if ord is None else ord, axes, fname)
    else:
        raise ArgumentError(f"{fname}: axis={axis!r} must name one axis (vector norm) or "
                            "two (matrix norm)")
    return _keep(out, a.shape, axes, keepdims)


def _keep(out, shape, axes, keepdims):
    if not keepdims:
        return out
    return out.reshape(tuple(1 if i in axes else n for i, n in enumerate(shape)))


def _magnitude(a, fname, ord, n_axes):
    """|a| for complex ``a`` where the norm depends only on magnitudes; the spectral
    norms (2, -2, 'nuc') take the complex matrix to its (real) singular values."""
    if not dtypes.is_complex(a.dtype) or (n_axes == 2 and ord in (2, -2, "nuc")):
        return a
    return ew.abs(a)


def _vector_norm(a, ord, axis, fname):
    if isinstance(ord, str):
        raise ArgumentError(f"{fname}: ord={ord!r} is a matrix norm; vector norms take "
                            "numbers (None, 0, 1, 2, inf, -inf, p)")
    if ord == 2:
        return ew.sqrt(red.sum(a * a, axis=axis))
    mag = ew.abs(a)
    if ord == np.inf:
        return red.max(mag, axis=axis)
    if ord == -np.inf:
        return red.min(mag, axis=axis)
    if ord == 0:
        return red.sum((a != 0).astype(a.dtype), axis=axis)
    if ord == 1:
        return red.sum(mag, axis=axis)
    p = float(ord)
    return red.sum(mag ** p, axis=axis) ** (1.0 / p)


def _matrix_norm(a, ord, axes, fname):
    r, c = axes
    if ord == "fro":
        return ew.sqrt(red.sum(a * a, axis=axes))
    if ord in (1, -1, np.inf, -np.inf):
        # 1: the largest column sum of |a| (sum over rows); inf: the largest row sum.
        summed, kept = (r, c) if ord in (1, -1) else (c, r)
        sums = red.sum(ew.abs(a), axis=summed)
        return (red.max if ord > 0 else red.min)(sums, axis=kept - (kept > summed))
    if ord in (2, -2, "nuc"):
        s = svdvals(moveaxis(a, (r, c), (-2, -1)))
        if ord == "nuc":
            return red.sum(s, axis=-1)
        return s[..., 0] if ord == 2 else s[..., -1]
    raise ArgumentError(f"{fname}: ord={ord!r} is not a matrix norm; use 'fro', 'nuc', 1, -1, "
                        "2, -2, inf or -inf")
