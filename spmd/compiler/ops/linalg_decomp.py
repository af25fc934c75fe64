"""Matrix decompositions and solves: ``cholesky``, ``solve``, ``slogdet``, ``qr``,
``eigh``, ``svd`` (the primitives under ``spmd.numpy.linalg``).

Each takes matrices in the last two axes, with any leading (batch) axes, and
runs the array module's LAPACK binding (``numpy.linalg``).  The batch rule
moves the vmapped axis to the front, so it is one more leading axis.

Derivatives are the standard matrix-calculus results, written in other
primitives so that reverse mode transposes them:

- ``solve``:    ``dx = solve(a, db - da @ x)``; linear in ``b`` (transpose:
  ``solve(a.T, ct)``), the only primitive here with a transpose rule.
- ``cholesky``: ``dL = L phi(L^-1 dA L^-T)``, ``phi`` the lower triangle with a
  halved diagonal (``dA`` symmetric).
- ``slogdet``:  ``d logabsdet = trace(solve(a, da))``; the sign is constant.
- ``qr`` (m >= n, reduced): with ``C = Q^T dA R^-1`` and ``W = tril(C, -1)``,
  ``O = W - W^T``: ``dQ = Q (O - C) + dA R^-1``, ``dR = (C - O) R``.
- ``eigh``: with ``E = V^T dA V``: ``dw = diag(E)``,
  ``dV = V (E / (w_j - w_i))`` off the diagonal (distinct eigenvalues).
- ``svd`` (reduced): with ``E = U^T dA V``: ``ds = diag(E)``; the singular
  vectors' tangents follow from the symmetric eigenproblems of ``A A^T`` and
  ``A^T A`` plus, for non-square ``A``, the part outside the span of ``U``
  (or ``V``).

Complex matrices (``complex64``/``complex128``) follow JAX's rules: transposes
in the formulas above become conjugate transposes (``^H``; ``cholesky`` and
``eigh`` read Hermitian matrices), eigenvalues, singular values and
``log|det|`` are real, ``slogdet``'s sign is the phase ``det/|det|`` (with
``d sign = sign * i Im(trace(a^-1 da))``), and the ``qr`` and ``svd`` tangents
carry JAX's extra terms for the complex phase freedom (the imaginary diagonal
of ``Q^H dA R^-1``; ``(E - E^H)/2 * diag(1/s)`` in ``dU``).  The linear maps
inside the rules are transposed without conjugation, the package's convention
(``spmd/compiler/ops/complex.py``), so reverse mode gives JAX's gradients.

Failing factorizations (a singular matrix in ``solve``, a matrix that is not
positive definite in ``cholesky``) give NaNs for that matrix, as JAX's do.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import add_tangents, is_undefined, Zero
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.compiler.ops import complex as cx, elementwise as ew
from spmd.compiler.ops.complex import conj, real
from spmd.compiler.ops.elementwise import convert
from spmd.compiler.ops.linalg import dot_general
from spmd.compiler.ops.reduce import reduce_sum
from spmd.compiler.ops.structural import broadcast_in_dim, full, iota, transpose, zeros
from spmd.compiler.transforms.batching import bdim_size, broadcast_batch

cholesky_p = Primitive("cholesky", traits=())
solve_p = Primitive("linalg_solve", traits=())
slogdet_p = Primitive("slogdet", traits=(), multiple_results=True)
qr_p = Primitive("qr", traits=(), multiple_results=True)
eigh_p = Primitive("eigh", traits=(), multiple_results=True)
svd_p = Primitive("svd", traits=(), multiple_results=True)

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64),
           np.dtype(np.complex128))


def _check_matrix(name, a, square=True):
    if a.ndim < 2:
        raise ShapeError(f"{name}: needs matrices in the last two axes, got shape {a.shape}")
    if square and a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"{name}: needs square matrices, got shape {a.shape}")
    if a.dtype not in _FLOATS:
        raise DTypeError(f"{name}: supports float32, float64, complex64 and complex128 "
                         f"matrices, got {a.dtype}; convert with .astype(float32)")


def _out(shape, dtype):
    return ShapedArray(tuple(shape), dtype, False)


def _nan_on_failure(xp, fn, a, *rest):
    """``fn(a, *rest)``, with NaN results for the matrices LAPACK cannot factor."""
    errors = tuple({np.linalg.LinAlgError, getattr(getattr(xp, "linalg", None),
                                                  "LinAlgError", np.linalg.LinAlgError)})
    try:
        return fn(a, *rest)
    except errors:
        pass
    batch = a.shape[:-2]
    out = None
    for idx in np.ndindex(*batch):
        try:
            r = fn(a[idx], *(x[idx] for x in rest))
        except errors:
            r = None
        if out is None and r is not None:
            out = xp.full(batch + r.shape, xp.nan, dtype=r.dtype)
        if r is not None:
            out[idx] = r
    if out is None:  # every matrix failed: the shape is that of the first operand's result
        shape = a.shape if not rest else rest[0].shape
        out = xp.full(shape, xp.nan, dtype=a.dtype)
    return out


# ------------------------------------------------------------- small helpers

def _mT(x):
    nd = len(np.shape(x))
    return transpose(x, tuple(range(nd - 2)) + (nd - 1, nd - 2))


def _is_c(x) -> bool:
    return dtypes.is_complex(get_aval(x).dtype)


def _H(x):
    """The conjugate transpose of the last two axes (the transpose for real ``x``)."""
    return conj(_mT(x)) if _is_c(x) else _mT(x)


def _re(x):
    """The real part (``x`` itself when real)."""
    return real(x) if _is_c(x) else x


def _like(x, ref):
    """Real ``x`` in ``ref``'s (complex) dtype, to multiply with it."""
    dt = get_aval(ref).dtype
    return x if get_aval(x).dtype == dt else convert(x, dt)


def _mm(a, b):
    """Batched matrix product of ``(..., m, k)`` and ``(..., k, n)`` (equal batch shapes)."""
    nd = len(np.shape(a))
    bd = tuple(range(nd - 2))
    return dot_general(a, b, (((nd - 1,), (nd - 2,)), (bd, bd)))


def _tril(x, k: int = 0):
    """Entries on or below the ``k``-th diagonal of the last two axes; zero elsewhere."""
    aval = get_aval(x)
    nd = aval.ndim
    rows = iota(np.int32, aval.shape, nd - 2)
    cols = iota(np.int32, aval.shape, nd - 1)
    keep = ew.ge(ew.add(rows, np.array(k, np.int32)), cols)
    return ew.select(keep, x, zeros(aval.shape, aval.dtype))


def _eye_mask(shape):
    nd = len(shape)
    return ew.eq(iota(np.int32, shape, nd - 2), iota(np.int32, shape, nd - 1))


def _diagonal(x):
    """``(..., n, n) -> (..., n)``."""
    aval = get_aval(x)
    masked = ew.select(_eye_mask(aval.shape), x, zeros(aval.shape, aval.dtype))
    return reduce_sum(masked, (aval.ndim - 1,))


def _diag_embed(v):
    """``(..., n) -> (..., n, n)`` with ``v`` on the diagonal."""
    aval = get_aval(v)
    shape = aval.shape + (aval.shape[-1],)
    full = broadcast_in_dim(v, shape, tuple(range(aval.ndim - 1)) + (aval.ndim,))
    return ew.select(_eye_mask(shape), full, zeros(shape, aval.dtype))


def _row(v):
    """``(..., n) -> (..., 1, n)`` broadcast to ``(..., n, n)``."""
    aval = get_aval(v)
    n = aval.shape[-1]
    return broadcast_in_dim(v, aval.shape[:-1] + (n, n), tuple(range(aval.ndim - 1)) +
                            (aval.ndim,))


def _col(v, cols):
    """``(..., n) -> (..., n, 1)`` broadcast to ``(..., n, cols)``."""
    aval = get_aval(v)
    return broadcast_in_dim(v, aval.shape + (cols,), tuple(range(aval.ndim)))


def _batch_all(prim):
    """Batch rule: move the vmapped axis of every operand to the front."""
    def rule(args, dims, **params):
        size = bdim_size(args, dims)
        ops = [broadcast_batch(a, d, size) for a, d in zip(args, dims)]
        outs = bind(prim, *ops, **params)
        return outs, ([0] * len(outs) if prim.multiple_results else 0)

    prim.def_batch(rule)


for _p in (cholesky_p, solve_p, slogdet_p, qr_p, eigh_p, svd_p):
    _batch_all(_p)


# ------------------------------------------------------------------ cholesky

@cholesky_p.def_impl
def _cholesky_impl(xp, a):
    return _nan_on_failure(xp, xp.linalg.cholesky, a)


@cholesky_p.def_abstract_eval
def _cholesky_aval(a):
    _check_matrix("cholesky", a)
    return _out(a.shape, a.dtype)


def cholesky(a):
    """The lower Cholesky factor of the (symmetric positive definite) matrices ``a``,
    read from their lower triangles."""
    return bind(cholesky_p, a)


@cholesky_p.def_jvp
def _cholesky_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    L = cholesky(a)
    if isinstance(da, Zero):
        return L, Zero(tangent_aval(get_aval(L)))
    # X = L^-1 dA L^-H, then phi(X): lower triangle, diagonal halved.
    x = solve(L, _H(solve(L, da)))
    half = np.array(0.5, get_aval(x).dtype)
    phi = ew.sub(_tril(x), ew.mul(_diag_embed(_diagonal(x)), half))
    return L, _mm(L, phi)


# --------------------------------------------------------------------- solve

@solve_p.def_impl
def _solve_impl(xp, a, b):
    return _nan_on_failure(xp, xp.linalg.solve, a, b)


@solve_p.def_abstract_eval
def _solve_aval(a, b):
    _check_matrix("solve", a)
    if b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != a.shape[-1]:
        raise ShapeError(f"solve: b must have shape batch + ({a.shape[-1]}, k) with a's batch "
                         f"{a.shape[:-2]}; got a of shape {a.shape} and b of shape {b.shape}")
    if b.dtype != a.dtype:
        raise DTypeError(f"solve: a and b dtypes differ ({a.dtype} and {b.dtype})")
    return _out(b.shape, b.dtype)


def solve(a, b):
    """``x`` with ``a @ x == b``, for ``a`` of shape ``(..., n, n)`` and ``b`` of shape
    ``(..., n, k)`` (equal batch shapes)."""
    return bind(solve_p, a, b)


@solve_p.def_jvp
def _solve_jvp(primals, tangents):
    (a, b), (da, db) = primals, tangents
    x = solve(a, b)
    rhs = Zero(tangent_aval(get_aval(x)))
    rhs = add_tangents(rhs, db)
    if not isinstance(da, Zero):
        rhs = add_tangents(rhs, ew.neg(_mm(da, x)))
    if isinstance(rhs, Zero):
        return x, rhs
    return x, solve(a, rhs)


@solve_p.def_transpose
def _solve_transpose(ct, a, b):
    if is_undefined(a):
        raise ArgumentError("solve is linear in b only; its transpose was asked for a "
                            "(an internal error: please report it)")
    if isinstance(ct, Zero):
        return [None, Zero(b.aval)]
    return [None, solve(_mT(a), ct)]


# ------------------------------------------------------------------- slogdet

@slogdet_p.def_impl
def _slogdet_impl(xp, a):
    sign, logdet = xp.linalg.slogdet(a)
    return [xp.asarray(sign, dtype=a.dtype), xp.asarray(logdet, dtype=a.real.dtype)]


@slogdet_p.def_abstract_eval
def _slogdet_aval(a):
    _check_matrix("slogdet", a)
    # The sign is the phase det/|det| for complex matrices; log|det| is real.
    return [_out(a.shape[:-2], a.dtype), _out(a.shape[:-2], dtypes.real_dtype(a.dtype))]


def slogdet(a):
    """``(sign, log|det a|)`` of the matrices ``a``."""
    sign, logdet = bind(slogdet_p, a)
    return sign, logdet


@slogdet_p.def_jvp
def _slogdet_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    sign, logdet = slogdet(a)
    zeros = [Zero(tangent_aval(get_aval(sign))), Zero(tangent_aval(get_aval(logdet)))]
    if isinstance(da, Zero):
        return [sign, logdet], zeros
    t = _diagonal_sum(solve(a, da))
    if not _is_c(t):
        return [sign, logdet], [zeros[0], t]
    # d log|det| = Re t; d sign = sign * i Im t (the phase turns), as JAX's rule.
    im = cx.make_complex(ew.mul(cx.real(t), np.array(0, get_aval(logdet).dtype)), cx.imag(t))
    return [sign, logdet], [ew.mul(sign, im), cx.real(t)]


def _diagonal_sum(x):
    d = _diagonal(x)
    return reduce_sum(d, (get_aval(d).ndim - 1,))


# ------------------------------------------------------------------------ qr

@qr_p.def_impl
def _qr_impl(xp, a, *, full_matrices):
    q, r = xp.linalg.qr(a, mode="complete" if full_matrices else "reduced")
    return [q, r]


@qr_p.def_abstract_eval
def _qr_aval(a, *, full_matrices):
    _check_matrix("qr", a, square=False)
    m, n = a.shape[-2:]
    k = m if full_matrices else min(m, n)
    return [_out(a.shape[:-2] + (m, k), a.dtype), _out(a.shape[:-2] + (k, n), a.dtype)]


def qr(a, full_matrices: bool = False):
    """``(q, r)`` with ``a = q @ r``, ``q`` orthonormal columns, ``r`` upper triangular."""
    q, r = bind(qr_p, a, full_matrices=bool(full_matrices))
    return q, r


@qr_p.def_jvp
def _qr_jvp(primals, tangents, *, full_matrices):
    (a,), (da,) = primals, tangents
    q, r = qr(a, full_matrices)
    if isinstance(da, Zero):
        return [q, r], [Zero(tangent_aval(get_aval(q))), Zero(tangent_aval(get_aval(r)))]
    m, n = get_aval(a).shape[-2:]
    if m < n or (full_matrices and m != n):
        raise NotImplementedError(
            f"qr: the derivative needs a tall or square matrix in reduced mode, got shape "
            f"{get_aval(a).shape} with full_matrices={full_matrices}; differentiate "
            "qr(a.T) (or use full_matrices=False)")
    da_rinv = _mT(solve(_mT(r), _mT(da)))  # dA R^-1
    c = _mm(_H(q), da_rinv)
    low = _tril(c, -1)
    omega = ew.sub(low, _H(low))
    if _is_c(c):  # R's real diagonal leaves Q^H dQ an imaginary diagonal (JAX's term)

        d = _diag_embed(_diagonal(c))
        omega = ew.add(omega, ew.sub(d, _like(cx.real(d), d)))
    dq = ew.add(_mm(q, ew.sub(omega, c)), da_rinv)
    dr = _mm(ew.sub(c, omega), r)
    return [q, r], [dq, dr]


# ---------------------------------------------------------------------- eigh

@eigh_p.def_impl
def _eigh_impl(xp, a):
    w, v = xp.linalg.eigh(a, UPLO="L")
    return [w, v]  # w is real also for Hermitian complex matrices


@eigh_p.def_abstract_eval
def _eigh_aval(a):
    _check_matrix("eigh", a)
    return [_out(a.shape[:-1], dtypes.real_dtype(a.dtype)), _out(a.shape, a.dtype)]


def eigh(a):
    """``(w, v)``: ascending eigenvalues and eigenvectors (columns) of the symmetric
    matrices ``a``, read from their lower triangles."""
    w, v = bind(eigh_p, a)
    return w, v


def _inverse_gaps(w):
    """``F[i, j] = 1 / (w_j - w_i)`` off the diagonal, 0 on it (``(..., n, n)``)."""
    gaps = ew.sub(_row(w), _mT(_row(w)))
    shape, dtype = get_aval(gaps).shape, get_aval(gaps).dtype
    eye = _eye_mask(shape)
    safe = ew.select(eye, full(shape, 1, dtype), gaps)
    return ew.select(eye, zeros(shape, dtype), ew.div(full(shape, 1, dtype), safe))


@eigh_p.def_jvp
def _eigh_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    w, v = eigh(a)
    if isinstance(da, Zero):
        return [w, v], [Zero(tangent_aval(get_aval(w))), Zero(tangent_aval(get_aval(v)))]
    e = _mm(_H(v), _mm(da, v))
    dv = _mm(v, ew.mul(e, _like(_inverse_gaps(w), e)))
    return [w, v], [_re(_diagonal(e)), dv]


# ----------------------------------------------------------------------- svd

@svd_p.def_impl
def _svd_impl(xp, a, *, full_matrices, compute_uv):
    if not compute_uv:
        return [xp.linalg.svd(a, compute_uv=False)]
    u, s, vh = xp.linalg.svd(a, full_matrices=full_matrices)
    return [u, s, vh]


@svd_p.def_abstract_eval
def _svd_aval(a, *, full_matrices, compute_uv):
    _check_matrix("svd", a, square=False)
    *batch, m, n = a.shape
    k = min(m, n)
    s = _out(tuple(batch) + (k,), dtypes.real_dtype(a.dtype))  # real, also for complex a
    if not compute_uv:
        return [s]
    ku, kv = (m, n) if full_matrices else (k, k)
    return [_out(tuple(batch) + (m, ku), a.dtype), s, _out(tuple(batch) + (kv, n), a.dtype)]


def svd(a, full_matrices: bool = True, compute_uv: bool = True):
    """``(u, s, vh)`` with ``a = u @ diag(s) @ vh`` (``s`` descending), or ``s`` alone."""
    outs = bind(svd_p, a, full_matrices=bool(full_matrices), compute_uv=bool(compute_uv))
    return tuple(outs) if compute_uv else outs[0]


@svd_p.def_jvp
def _svd_jvp(primals, tangents, *, full_matrices, compute_uv):
    (a,), (da,) = primals, tangents
    if compute_uv and full_matrices:
        m, n = get_aval(a).shape[-2:]
        if m != n:
            raise NotImplementedError(
                f"svd: the derivative of the full_matrices=True decomposition of a "
                f"non-square matrix (shape {get_aval(a).shape}) is not unique; use "
                "full_matrices=False")
    u, s, vh = svd(a, full_matrices=False, compute_uv=True)
    outs = [u, s, vh] if compute_uv else [s]
    if isinstance(da, Zero):
        return outs, [Zero(tangent_aval(get_aval(o))) for o in outs]
    v = _H(vh)
    e = _mm(_H(u), _mm(da, v))  # U^H dA V, (..., k, k)
    ds = _re(_diagonal(e))
    if not compute_uv:
        return outs, [ds]
    du, dv = _svd_vector_tangents(a, da, u, s, v, e)
    return outs, [du, ds, _H(dv)]


def _svd_vector_tangents(a, da, u, s, v, e):
    """Tangents of ``U`` and ``V`` of the reduced SVD (distinct non-zero singular values)."""
    dtype = get_aval(s).dtype
    sr = _row(s)                       # s_j at [i, j]
    sc = _mT(sr)                       # s_i at [i, j]
    shape = get_aval(sr).shape
    eye = _eye_mask(shape)
    one = full(shape, 1, dtype)
    # F[i, j] = 1 / (s_j^2 - s_i^2) off the diagonal.
    diffs = ew.mul(ew.add(sr, sc), ew.sub(sr, sc))
    f = _like(ew.select(eye, zeros(shape, dtype), ew.div(one, ew.select(eye, one, diffs))), e)
    es, se = ew.mul(e, _like(sr, e)), ew.mul(_like(sc, e), e)   # E diag(s), diag(s) E
    inner = ew.mul(f, ew.add(es, _H(es)))
    if _is_c(e):  # the phase of each singular pair: JAX's (E - E^H)/2 diag(1/s) term
        keep = ew.bitwise_and(eye, ew.ne(sr, zeros(shape, dtype)))  # 1/s, 0 where s == 0
        inv_s = ew.select(keep, ew.div(one, ew.select(keep, sr, one)), zeros(shape, dtype))
        half = np.array(0.5, get_aval(e).dtype)
        inner = ew.add(inner, ew.mul(ew.mul(ew.sub(e, _H(e)), half), _like(inv_s, e)))
    du = _mm(u, inner)
    dv = _mm(v, ew.mul(f, ew.add(se, _H(se))))
    m, n = get_aval(a).shape[-2:]
    # Non-square: the component outside the span of the k computed vectors.
    if m > n:
        dav = _mm(da, v)
        du = ew.add(du, ew.div(ew.sub(dav, _mm(u, _mm(_H(u), dav))), _like(_row_of(s, m), dav)))
    if n > m:
        dahu = _mm(_H(da), u)
        dv = ew.add(dv, ew.div(ew.sub(dahu, _mm(v, _mm(_H(v), dahu))),
                               _like(_row_of(s, n), dahu)))
    return du, dv


def _row_of(s, rows):
    """``(..., k) -> (..., rows, k)``: each row is ``s``."""
    aval = get_aval(s)
    return broadcast_in_dim(s, aval.shape[:-1] + (rows, aval.shape[-1]),
                            tuple(range(aval.ndim - 1)) + (aval.ndim,))
