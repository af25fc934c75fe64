"""``dot_general``: contraction with batch dimensions (all matmuls reduce to it).

``dimension_numbers = ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``;
the output's dimensions are: batch, then lhs free, then rhs free (XLA's order).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.engine import threads as _threads
from spmd.compiler.transforms.ad_util import Zero, add_tangents, is_undefined
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.engine.gemm import gemm_into
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import DTypeError, ShapeError
from spmd.compiler import ops
from spmd.compiler.transforms.batching import move_to_front

dot_general_p = Primitive("dot_general", traits=("fresh_result", "dot"))
dot_general_p.unreduced = "one"  # (bilinear: linear in each operand apart)


def _free(ndim, contract, batch):
    return [i for i in range(ndim) if i not in contract and i not in batch]


def _plan(lhs_shape, rhs_shape, dimension_numbers):
    """Permutations and shapes that turn dot_general into one batched matmul."""
    (lc, rc), (lb, rb) = dimension_numbers
    lf = _free(len(lhs_shape), lc, lb)
    rf = _free(len(rhs_shape), rc, rb)
    size = lambda shape, ax: math.prod(shape[a] for a in ax)
    b, m, k, n = size(lhs_shape, lb), size(lhs_shape, lf), size(lhs_shape, lc), size(rhs_shape, rf)
    out_shape = tuple(lhs_shape[a] for a in lb) + tuple(lhs_shape[a] for a in lf) + \
        tuple(rhs_shape[a] for a in rf)
    return (tuple(lb) + tuple(lf) + tuple(lc), (b, m, k),
            tuple(rb) + tuple(rc) + tuple(rf), (b, k, n), out_shape)


@dot_general_p.def_impl
def _dot_impl(xp, x, y, *, dimension_numbers):
    if dtypes.is_narrow_float(x.dtype):
        # In float32 (BLAS), the result rounded once, as XLA's CPU computes a bfloat16
        # product (ml_dtypes' own matmul is a scalar loop, and einsum refuses them).
        f32 = _dot_impl(xp, x.astype(np.float32), y.astype(np.float32),
                        dimension_numbers=dimension_numbers)
        return f32.astype(x.dtype)
    (lc, rc), (lb, rb) = dimension_numbers
    if not lb and len(lc) == 1 and x.ndim <= 2 and y.ndim <= 2:
        # Straight to BLAS; a transposed operand is passed as a view (``x.T @ g``),
        # which BLAS reads in place, as hand-written numpy does: no copy.
        return _matmul(xp, x if lc[0] == x.ndim - 1 else x.T, y if rc[0] == 0 else y.T)
    if not lb:
        two_d = _as_matrices(xp, x, y, lc, rc)
        if two_d is not None:  # one GEMM on (transposed) 2-d views: no copies
            a, b, out_shape = two_d
            return xp.reshape(_matmul(xp, a, b), out_shape)
    lperm, lshape, rperm, rshape, out_shape = _plan(x.shape, y.shape, dimension_numbers)
    if xp is np:
        # Batch dims stay as they are (numpy's matmul loops over any strides), and
        # each operand's matrix is a view where its strides allow one: attention's
        # q, k and v are strided views of the fused projection, and copying them
        # into (batch, m, k) blocks cost as much as the products (measured: the
        # per-head products of the small example 1.34 ms a call with the copies,
        # 0.76 without).
        nb = len(lb)
        a = _matrices(x, lperm, nb, x.ndim - nb - len(lc))
        b = _matrices(y, rperm, nb, len(rc))
        return np.reshape(_matmul(np, a, b), out_shape)
    a = xp.reshape(xp.transpose(x, lperm), lshape)
    b = xp.reshape(xp.transpose(y, rperm), rshape)
    return xp.reshape(_matmul(xp, a, b), out_shape)


def _matrices(z, perm, nb, n_rows):
    """``z`` with axes ``perm`` (``nb`` batch, ``n_rows`` rows, then columns) as
    ``(*batch, R, C)``: a view when
    the rows and the columns each merge into one axis, copied once otherwise, and
    made contiguous where BLAS could not read the matrices in place (numpy's matmul
    would then run its own slow loop)."""
    v = np.transpose(z, perm)
    r = math.prod(v.shape[nb:nb + n_rows])
    c = math.prod(v.shape[nb + n_rows:])
    v = np.reshape(v, v.shape[:nb] + (r, c))
    return v if _blas_readable(v) else np.ascontiguousarray(v)


def _blas_readable(v) -> bool:
    """Whether BLAS reads the last two axes of ``v`` as a matrix in place: one of them
    of unit stride, the other's stride a whole number of items covering the first."""
    if v.ndim < 2:
        return True
    (r, c), (sr, sc), item = v.shape[-2:], v.strides[-2:], v.itemsize
    if r <= 1 or c <= 1:
        return v.flags.c_contiguous or v.flags.f_contiguous
    if sc == item:
        return sr % item == 0 and sr >= c * item
    if sr == item:
        return sc % item == 0 and sc >= r * item
    return False


# A batch of products (attention's per-head products, a simulated mesh's per-device
# ones) is shared among the engine's threads by batch, each part one BLAS call on its
# slice, when all together have at least SPLIT_FLOPS flops (2 m n k; about 40 us of
# one core's work, the cost of handing a part to a thread).  Products large enough for
# OpenBLAS to thread are made with BLAS held to one thread meanwhile
# (spmd.compiler.engine.threads.run_products): numpy's matmul calls BLAS once per product of
# a batch, and OpenBLAS's two threads on a product of (128, 32) @ (32, 128) gain
# nothing.  Measured (2 cores): 128 such products 1.25 ms as one call, 0.69 ms split;
# 128 of (64, 64) @ (64, 64) 0.90 against 0.49 ms; 8 of (512, 256) @ (256, 1024)
# 12.3 against 12.0 ms.  A single large product stays one call in BLAS's threads
# (split by rows on one BLAS thread each it was 5% slower: each part packs the other
# operand again).
SPLIT_FLOPS = 1 << 22


def _matmul(xp, a, b, out=None):
    """``xp.matmul(a, b, out=out)``; a batch of products is split by batch among the
    engine's threads, each part one BLAS call on its slice (the same products, to
    rounding: BLAS may add a part's terms in another order than the whole call's, by
    its thread count and its kernel's choices, as OPENBLAS_CORETYPE=Haswell does)."""
    if xp is np and a.ndim == b.ndim >= 3 and a.shape[:-2] == b.shape[:-2]:
        (m, k), n = a.shape[-2:], b.shape[-1]
        batch = math.prod(a.shape[:-2])
        if batch > 1 and 2 * batch * m * n * k >= SPLIT_FLOPS and \
                _threads.can_split(m * n * k):
            if out is None:
                out = np.empty(a.shape[:-1] + (n,), np.result_type(a.dtype, b.dtype))
            # Cut the longest batch axis: any one gives independent products.
            axis = max(range(a.ndim - 2), key=lambda i: a.shape[i])
            size = a.shape[axis]
            parts = min(_threads.POOL.size(), size)
            lead = (slice(None),) * axis
            cuts = [lead + (slice(i * size // parts, (i + 1) * size // parts),)
                    for i in range(parts)]
            _threads.run_products([functools.partial(np.matmul, a[c], b[c], out=out[c])
                                   for c in cuts], m * n * k)
            return out
    return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)


def _pmatmul(a, b, out=None):
    """:func:`_matmul` on numpy, as the generated code of a batch of products calls it."""
    return _matmul(np, a, b, out)


def _flops(in_avals, dimension_numbers) -> int:
    (lc, _), _ = dimension_numbers
    x, y = in_avals
    out = _plan(x.shape, y.shape, dimension_numbers)[-1]
    return 2 * int(np.prod(out, dtype=np.int64)) * int(
        np.prod([x.shape[i] for i in lc], dtype=np.int64))


def _as_matrices(xp, x, y, lc, rc):
    """2-d views ``(a, b, out_shape)`` with ``a @ b`` the product, when each operand's
    contracting dims form one block at its front or back (in the same order in both):
    e.g. the weight gradient ``sum over (device, batch)`` of stacked activations."""
    def side(z, c, lhs):
        nd, k = z.ndim, len(c)
        if tuple(c) == tuple(range(nd - k, nd)):  # contract at the back
            free = z.shape[:nd - k]
            m = int(np.prod(free, dtype=np.int64))
            v = xp.reshape(z, (m, -1))
            return (v if lhs else v.T), free
        if tuple(c) == tuple(range(k)):  # contract at the front
            free = z.shape[k:]
            m = int(np.prod(free, dtype=np.int64))
            v = xp.reshape(z, (-1, m))
            return (v.T if lhs else v), free
        return None

    order = np.argsort(lc)
    lc, rc = tuple(lc[i] for i in order), tuple(rc[i] for i in order)
    if list(rc) != sorted(rc) or not x.flags.c_contiguous or not y.flags.c_contiguous:
        return None
    left, right = side(x, lc, True), side(y, rc, False)
    if left is None or right is None:
        return None
    return left[0], right[0], tuple(left[1]) + tuple(right[1])


def _dot_emit(names, avals, *, dimension_numbers, xp=np, out=None, accumulate=False):
    """``(x @ y)``, ``(x.T @ y)``, ... for the cases the impl sends straight to BLAS
    (and their forms on a process's stacked device blocks, ``xp.matmul`` of 3-d).

    Hand-written numpy, with no Python call between the generated code and
    the matmul.  (A registered ``emit_avals`` rule: it needs the operands'
    ranks, which ``emit`` does not see; ``xp`` is the array module.)  With ``out``
    (the name of a dead buffer of the result's shape and dtype),
    ``xp.matmul(x, y, out=out)``.
    Other cases call the impl.  On numpy a batch of products large enough to be
    split among the engine's threads (:data:`SPLIT_FLOPS`) calls ``_pmatmul``
    (:func:`_matmul`) instead.  ``accumulate=True``: add the product into ``out``
    (``_gemm_into``, :mod:`spmd.compiler.engine.gemm`), for one matrix only (None for a
    batch of several, or other arrays).
    """
    (lc, rc), (lb, rb) = dimension_numbers
    x, y = avals
    if len(lc) != 1 or dtypes.is_narrow_float(x.dtype):
        return None  # (narrow floats: the impl's float32 product)
    large = xp is np and bool(lb) and _flops(avals, dimension_numbers) >= SPLIT_FLOPS
    if not lb and 1 <= x.ndim <= 2 and 1 <= y.ndim <= 2:
        a = names[0] if lc[0] == x.ndim - 1 else f"{names[0]}.T"
        b = names[1] if rc[0] == 0 else f"{names[1]}.T"
    elif not lb and x.ndim == 3 and x.shape[0] == 1 and lc[0] == 2 and y.ndim == 2:
        # One device's stacked block (a process's program with one local device):
        # a single GEMM, as the impl's 2-d view makes.
        a, b = names[0], names[1] if rc[0] == 0 else f"{names[1]}.T"
    elif lb == (0,) and rb == (0,) and x.ndim == 3 and y.ndim == 3:
        # Stacked per-device products (a weight gradient ``x.T @ g`` per device).
        a = names[0] if lc[0] == 2 else f"{names[0]}.transpose(0, 2, 1)"
        b = names[1] if rc[0] == 1 else f"{names[1]}.transpose(0, 2, 1)"
    else:
        return None
    if accumulate:  # (matrices only: a vector's product stays a product and an add)
        one = xp is np and out is not None and x.ndim >= 2 and y.ndim >= 2 and all(
            math.prod(v.shape[:-2]) == 1 for v in (x, y) if v.ndim == 3)
        return f"_gemm_into({a}, {b}, out={out})" if one else None
    if large:  # a batch the engine's threads may share (decided per call)
        return f"_pmatmul({a}, {b})" if out is None else f"_pmatmul({a}, {b}, out={out})"
    if out is None:
        return f"({a} @ {b})" if x.ndim <= 2 else f"xp.matmul({a}, {b})"
    return f"xp.matmul({a}, {b}, out={out})"


dot_general_p.rules.emit_avals = _dot_emit
dot_general_p.rules.emit_globals = {"_pmatmul": _pmatmul,
                                       "_gemm_into": gemm_into}


@dot_general_p.def_abstract_eval
def _dot_aval(x, y, *, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    if x.dtype != y.dtype:
        raise DTypeError(f"dot_general: operand dtypes {x.dtype} and {y.dtype} differ")
    if dtypes.is_bool(x.dtype):
        raise DTypeError("dot_general: bool operands are not supported; convert with .astype")
    for name, dims, aval in (("lhs", tuple(lc) + tuple(lb), x), ("rhs", tuple(rc) + tuple(rb), y)):
        if any(not 0 <= d < aval.ndim for d in dims) or len(set(dims)) != len(dims):
            raise ShapeError(f"dot_general: bad {name} dimensions {dims} for shape {aval.shape}")
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ShapeError(f"dot_general: dimension_numbers {dimension_numbers} pair unequal "
                         "numbers of dimensions")
    for a, b, what in [(i, j, "contracting") for i, j in zip(lc, rc)] + \
                      [(i, j, "batch") for i, j in zip(lb, rb)]:
        if x.shape[a] != y.shape[b]:
            raise ShapeError(f"dot_general: {what} dimensions differ in size: lhs shape "
                             f"{x.shape} (dim {a}) and rhs shape {y.shape} (dim {b})")
    out = _plan(x.shape, y.shape, dimension_numbers)[-1]
    return ShapedArray(out, x.dtype, x.weak_type and y.weak_type)


def dot_general(x, y, dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    dn = ((tuple(map(int, lc)), tuple(map(int, rc))), (tuple(map(int, lb)), tuple(map(int, rb))))
    return bind(dot_general_p, x, y, dimension_numbers=dn)


@dot_general_p.def_jvp
def _dot_jvp(primals, tangents, *, dimension_numbers):
    x, y = primals
    tx, ty = tangents
    out = dot_general(x, y, dimension_numbers)
    t = Zero(get_aval(out).update(weak_type=False))
    if not isinstance(tx, Zero):
        t = add_tangents(t, dot_general(tx, y, dimension_numbers))
    if not isinstance(ty, Zero):
        t = add_tangents(t, dot_general(x, ty, dimension_numbers))
    return out, t


def _transpose_operand(ct, other, my_ndim, dimension_numbers, swap):
    """Cotangent of one operand of dot_general given the other's value."""
    (lc, rc), (lb, rb) = dimension_numbers
    if swap:  # the rhs: exchange roles
        lc, rc, lb, rb = rc, lc, rb, lb
    other_ndim = len(np.shape(other))
    my_free = _free(my_ndim, lc, lb)
    other_free = _free(other_ndim, rc, rb)
    nb = len(lb)
    # ct's layout is batch + lhs_free + rhs_free.
    if swap:
        ct_other_free = tuple(range(nb, nb + len(other_free)))
    else:
        ct_other_free = tuple(range(nb + len(my_free), nb + len(my_free) + len(other_free)))
    dims = ((ct_other_free, tuple(other_free)), (tuple(range(nb)), tuple(rb)))
    # dot_general(ct, other) is batch + (ct's remaining free dims = my free) + other's
    # contracting dims (sorted); dot_general(other, ct) puts the last two groups the
    # other way round.  Whichever is already in my layout needs no transpose: the
    # weight gradient of `x @ w` is then `x.T @ ct`, as written by hand.
    partner = dict(zip(rc, lc))
    contracted = [partner[d] for d in sorted(rc)]
    as_mine = list(lb) + my_free + contracted
    if as_mine != sorted(as_mine) and nb == 0 and \
            contracted + my_free == sorted(contracted + my_free):
        (a, b), batch = dims
        return dot_general(other, ct, ((b, a), batch))
    out = dot_general(ct, other, dims)
    if as_mine == sorted(as_mine):
        return out
    return ops.structural.transpose(out, tuple(int(i) for i in np.argsort(as_mine)))


@dot_general_p.def_transpose
def _dot_transpose(ct, x, y, *, dimension_numbers):
    assert is_undefined(x) != is_undefined(y)
    if is_undefined(x):
        if isinstance(ct, Zero):
            return [Zero(x.aval), None]
        return [_transpose_operand(ct, y, x.aval.ndim, dimension_numbers, False), None]
    if isinstance(ct, Zero):
        return [None, Zero(y.aval)]
    return [None, _transpose_operand(ct, x, y.aval.ndim, dimension_numbers, True)]


@dot_general_p.def_batch
def _dot_batch(args, dims, *, dimension_numbers):
    (x, y), (dx, dy) = args, dims
    (lc, rc), (lb, rb) = dimension_numbers
    up = lambda ds: tuple(d + 1 for d in ds)
    if dx is not None and dy is not None:
        x, y = move_to_front(x, dx), move_to_front(y, dy)
        return dot_general(x, y, ((up(lc), up(rc)), ((0,) + up(lb), (0,) + up(rb)))), 0
    if dx is not None:
        x = move_to_front(x, dx)
        return dot_general(x, y, ((up(lc), rc), (up(lb), rb))), len(lb)
    y = move_to_front(y, dy)
    x_free = _free(len(np.shape(x)), lc, lb)
    return dot_general(x, y, ((lc, up(rc)), (lb, up(rb)))), len(lb) + len(x_free)
