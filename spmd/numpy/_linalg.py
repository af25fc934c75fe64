"""Products: dot, matmul, tensordot, outer, inner, vdot, einsum."""

from __future__ import annotations

import numpy as np

from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops.linalg import dot_general
from spmd.compiler.ops.reduce import reduce_sum
from spmd.compiler.ops.structural import broadcast_in_dim, full, iota, squeeze, transpose
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._complex import conj
from spmd.numpy._creation import astype
from spmd.numpy._elementwise import multiply
from spmd.numpy._shape import ravel
from spmd.shard.explicit.modes import with_out_sharding
from spmd.numpy._util import (broadcast_shapes, broadcast_to_shape, canonicalize_axis,
                              promote_dtypes, require_static)

__all__ = ["matmul", "dot", "tensordot", "outer", "inner", "vdot", "einsum"]


def matmul(a, b, /, *, out_sharding=None):
    """Matrix product with numpy's rules for 1-d operands and batch broadcasting;
    ``out_sharding``: the result's sharding (on explicit axes it settles an ambiguous
    one, docs/explicit_sharding.md)."""
    return with_out_sharding(_matmul, (a, b), out_sharding, "spmd.numpy.matmul")


def _matmul(a, b):
    x, y = promote_dtypes(a, b, fname="spmd.numpy.matmul")
    xs, ys = get_aval(x).shape, get_aval(y).shape
    if not xs or not ys:
        raise ShapeError(f"spmd.numpy.matmul: operands must be at least 1-d, got shapes {xs} "
                         f"and {ys}; use * for scalars")
    if xs[-1] != (ys[0] if len(ys) == 1 else ys[-2]):
        raise ShapeError(f"spmd.numpy.matmul: shapes {xs} and {ys} do not align "
                         f"({xs[-1]} != {ys[0] if len(ys) == 1 else ys[-2]})")
    if len(xs) <= 2 and len(ys) <= 2:
        return dot_general(x, y, (((len(xs) - 1,), (0,)), ((), ())))
    if len(xs) == 1:  # (k,) @ (..., k, n): contract y's rows; nothing is broadcast
        return dot_general(y, x, (((len(ys) - 2,), (0,)), ((), ())))
    if len(ys) == 1:
        return dot_general(x, y, (((len(xs) - 1,), (0,)), ((), ())))
    return _batched_matmul(x, y, xs, ys)


def _batched_matmul(x, y, xs, ys):
    """``x @ y`` with batch dims, as one ``dot_general`` on the operands as they are.

    A batch dim both operands have (of one size) is a ``dot_general`` batch dim;
    one only ``x`` has (absent or of size 1 in ``y``) is one of ``x``'s free dims,
    and so for ``y``: ``(b, t, d) @ (d, h)`` is one ``(b*t, d) @ (d, h)`` product,
    not ``b`` products against a broadcast copy of the weight (``jax.numpy.matmul``
    treats such dims alike).
    The result is transposed into numpy's order only where the free dims of ``y``
    must move ahead of ``x``'s rows.
    """
    nb = max(len(xs), len(ys)) - 2
    batch = broadcast_shapes(xs[:-2], ys[:-2], fname="spmd.numpy.matmul")
    xpad, ypad = nb - (len(xs) - 2), nb - (len(ys) - 2)
    xsq = tuple(i for i in range(nb) if i >= xpad and xs[i - xpad] == 1 != batch[i])
    ysq = tuple(i for i in range(nb) if i >= ypad and ys[i - ypad] == 1 != batch[i])
    if xsq:
        x = squeeze(x, tuple(i - xpad for i in xsq))
    if ysq:
        y = squeeze(y, tuple(i - ypad for i in ysq))
    # Each batch position is in both operands, only in x or only in y (a size-1
    # position of both stays in both); xpos/ypos: its dim in x/y after the squeezes.
    xpos = {i: n for n, i in enumerate(i for i in range(nb) if i >= xpad and i not in xsq)}
    ypos = {i: n for n, i in enumerate(i for i in range(nb) if i >= ypad and i not in ysq)}
    both = [i for i in range(nb) if i in xpos and i in ypos]
    x_only = [i for i in range(nb) if i in xpos and i not in ypos]
    y_only = [i for i in range(nb) if i in ypos and i not in xpos]
    xk, yk = len(xpos), len(ypos)  # x's rows at xk, its contraction at xk + 1; y's at yk
    out = dot_general(x, y, (((xk + 1,), (yk,)),
                             (tuple(xpos[i] for i in both), tuple(ypos[i] for i in both))))
    # dot_general's order: both, x_only, m, y_only, n; numpy's: batch positions, m, n.
    order = both + x_only + ["m"] + y_only + ["n"]
    want = list(range(nb)) + ["m", "n"]
    if order != want:
        out = transpose(out, tuple(order.index(w) for w in want))
    return out


def dot(a, b, /, *, out_sharding=None):
    """numpy.dot: matmul for 1-d/2-d, scalar product for 0-d, sum over the last/second-last
    axes otherwise; ``out_sharding`` as for :func:`matmul`."""
    return with_out_sharding(_dot, (a, b), out_sharding, "spmd.numpy.dot")


def _dot(a, b):
    x, y = promote_dtypes(a, b, fname="spmd.numpy.dot")
    xs, ys = get_aval(x).shape, get_aval(y).shape
    if not xs or not ys:
        return multiply(x, y)
    yc = 0 if len(ys) == 1 else len(ys) - 2
    if xs[-1] != ys[yc]:
        raise ShapeError(f"spmd.numpy.dot: shapes {xs} and {ys} not aligned: {xs[-1]} (dim "
                         f"{len(xs) - 1}) != {ys[yc]} (dim {yc})")
    return dot_general(x, y, (((len(xs) - 1,), (yc,)), ((), ())))


def tensordot(a, b, axes=2):
    """Sum products over ``axes``: an int N (last N of ``a`` with first N of ``b``) or a pair
    of axis sequences.

    >>> tensordot(ones((2, 3, 4)), ones((3, 4, 5))).shape
    (2, 5)
    """
    x, y = promote_dtypes(a, b, fname="spmd.numpy.tensordot")
    xs, ys = get_aval(x).shape, get_aval(y).shape
    require_static(axes, "spmd.numpy.tensordot", "axes", "int or pair of axis sequences")
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if n < 0 or n > len(xs) or n > len(ys):
            raise ArgumentError(f"spmd.numpy.tensordot: axes={n} does not fit operands of "
                                f"shapes {xs} and {ys}")
        ax, bx = tuple(range(len(xs) - n, len(xs))), tuple(range(n))
    else:
        try:
            ax, bx = axes
        except (TypeError, ValueError):
            raise ArgumentError(f"spmd.numpy.tensordot: axes must be an int or a pair of axis "
                                f"sequences, got {axes!r}") from None
        ax = ax if isinstance(ax, (tuple, list)) else (ax,)
        bx = bx if isinstance(bx, (tuple, list)) else (bx,)
        if len(ax) != len(bx):
            raise ArgumentError(f"spmd.numpy.tensordot: axes {axes!r} pair sequences of "
                                "different lengths")
        ax = tuple(canonicalize_axis(i, len(xs), "spmd.numpy.tensordot", "axes") for i in ax)
        bx = tuple(canonicalize_axis(i, len(ys), "spmd.numpy.tensordot", "axes") for i in bx)
    for i, j in zip(ax, bx):
        if xs[i] != ys[j]:
            raise ShapeError(f"spmd.numpy.tensordot: shape mismatch for sum: a's axis {i} has "
                             f"size {xs[i]} (shape {xs}), b's axis {j} has size {ys[j]} "
                             f"(shape {ys})")
    return dot_general(x, y, ((ax, bx), ((), ())))


def outer(a, b):
    """Outer product of the flattened inputs: ``out[i, j] = a[i] * b[j]``."""
    x, y = promote_dtypes(a, b, fname="spmd.numpy.outer")
    return dot_general(ravel(x), ravel(y), (((), ()), ((), ())))


def inner(a, b, /):
    """Sum over the last axes of ``a`` and ``b`` (a product when either is a scalar)."""
    x, y = promote_dtypes(a, b, fname="spmd.numpy.inner")
    xs, ys = get_aval(x).shape, get_aval(y).shape
    if not xs or not ys:
        return multiply(x, y)
    if xs[-1] != ys[-1]:
        raise ShapeError(f"spmd.numpy.inner: last dimensions of shapes {xs} and {ys} differ")
    return dot_general(x, y, (((len(xs) - 1,), (len(ys) - 1,)), ((), ())))


def vdot(a, b, /):
    """Dot product of the flattened inputs, conjugating the first when complex
    (``vdot([1j], [1j]) == 1``, as numpy)."""
    x, y = promote_dtypes(a, b, fname="spmd.numpy.vdot")
    x, y = ravel(conj(x)), ravel(y)
    if get_aval(x).shape != get_aval(y).shape:
        raise ShapeError(f"spmd.numpy.vdot: inputs have {get_aval(x).size} and "
                         f"{get_aval(y).size} elements; they must have the same size")
    return dot_general(x, y, (((0,), (0,)), ((), ())))


# -------------------------------------------------------------------- einsum

def einsum(subscripts, *operands, out=None, optimize="greedy", precision=None,
           preferred_element_type=None, out_sharding=None):
    """Einstein summation, as numpy.einsum (``optimize`` and ``precision`` are ignored;
    ``out_sharding`` as for :func:`matmul`).

    Operands are contracted pairwise, left to right, with ``dot_general``; an
    index that no later operand or the output needs is summed out as early as
    possible.  Repeated indices in one operand take its diagonal.

    >>> einsum("ij,jk->ik", ones((2, 3)), ones((3, 4))).shape
    (2, 4)
    """
    if out_sharding is not None:
        return with_out_sharding(_einsum_static, operands, out_sharding, "spmd.numpy.einsum",
                                 (subscripts, out, optimize, precision, preferred_element_type))
    return _einsum(subscripts, *operands, out=out, optimize=optimize, precision=precision,
                   preferred_element_type=preferred_element_type)


def _einsum_static(subscripts, out, optimize, precision, preferred_element_type, *operands):
    return _einsum(subscripts, *operands, out=out, optimize=optimize, precision=precision,
                   preferred_element_type=preferred_element_type)


def _einsum(subscripts, *operands, out=None, optimize="greedy", precision=None,
            preferred_element_type=None):
    if out is not None:
        raise NotImplementedError("spmd.numpy.einsum: out= is not supported (arrays are "
                                  "immutable); use the return value")
    if not isinstance(subscripts, str):
        raise NotImplementedError("spmd.numpy.einsum: only the subscripts-string form is "
                                  "supported, e.g. einsum('ij,jk->ik', a, b)")
    arrs = promote_dtypes(*operands, fname="spmd.numpy.einsum")
    if preferred_element_type is not None:
        arrs = [astype(a, preferred_element_type) for a in arrs]
    inputs, output = _parse_einsum(subscripts, [get_aval(a).shape for a in arrs])
    terms = [_einsum_prepare(a, idx) for a, idx in zip(arrs, inputs)]
    _drop_broadcast_ones(terms)
    # Sum out what only one operand uses, then contract left to right.
    x, idx = _sum_unneeded(*terms[0], [t[1] for t in terms[1:]], output)
    for k, (y, yidx) in enumerate(terms[1:], start=1):
        later = [t[1] for t in terms[k + 1:]]
        y, yidx = _sum_unneeded(y, yidx, [idx] + later, output)
        x, idx = _contract(x, idx, y, yidx, set(output).union(*later))
    return transpose(x, tuple(idx.index(c) for c in output))


def _parse_einsum(subscripts, shapes):
    """Lists of index letters per operand and for the output, with '...' expanded."""
    spec = subscripts.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise ArgumentError(f"spmd.numpy.einsum: subscripts {subscripts!r} name {len(ins)} "
                            f"operands but {len(shapes)} were given")
    used = set(spec) - set(".,->")
    spare = (c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used)
    n_ell = max((len(s) - len(t.replace("...", "")) for t, s in zip(ins, shapes) if "..." in t),
                default=0)
    ell = [next(spare) for _ in range(n_ell)]
    inputs = []
    for term, shape in zip(ins, shapes):
        if not all(c.isalpha() for c in term.replace("...", "")):
            raise ArgumentError(f"spmd.numpy.einsum: bad subscripts {subscripts!r}: indices "
                                "must be letters")
        if "..." in term:
            head, _, tail = term.partition("...")
            k = len(shape) - len(head) - len(tail)
            letters = list(head) + (ell[n_ell - k:] if k > 0 else []) + list(tail)
        else:
            letters = list(term)
        if len(letters) != len(shape):
            raise ShapeError(f"spmd.numpy.einsum: subscripts {term!r} name {len(letters)} axes "
                             f"but the operand has shape {shape}")
        inputs.append(letters)
    if arrow:
        if "..." in rhs:
            head, _, tail = rhs.partition("...")
            output = list(head) + ell + list(tail)
        else:
            output = list(rhs)
        for c in output:
            if c not in set().union(*map(set, inputs)):
                raise ArgumentError(f"spmd.numpy.einsum: output index {c!r} of {subscripts!r} "
                                    "appears in no input")
        if len(set(output)) != len(output):
            raise ArgumentError(f"spmd.numpy.einsum: output subscripts of {subscripts!r} "
                                "repeat an index")
    else:
        counts = {}
        for letters in inputs:
            for c in letters:
                counts[c] = counts.get(c, 0) + 1
        output = [c for c in ell if c in counts] + sorted(
            c for c, n in counts.items() if n == 1 and c not in ell)
    return inputs, output


def _einsum_prepare(x, idx):
    """Take diagonals for letters repeated within one operand."""
    idx = list(idx)
    while len(set(idx)) != len(idx):
        c = next(c for c in idx if idx.count(c) > 1)
        i = idx.index(c)
        j = idx.index(c, i + 1)
        shape = get_aval(x).shape
        if shape[i] != shape[j]:
            raise ShapeError(f"spmd.numpy.einsum: repeated index {c!r} names axes of sizes "
                             f"{shape[i]} and {shape[j]}")
        rows = broadcast_in_dim(iota(np.int32, shape[i]), shape, (i,))
        cols = broadcast_in_dim(iota(np.int32, shape[j]), shape, (j,))
        x = reduce_sum(ew.select(ew.eq(rows, cols), x, full(shape, 0, get_aval(x).dtype)), (j,))
        del idx[j]
    return x, idx


def _drop_broadcast_ones(terms):
    """Squeeze size-1 axes whose letter has a larger size elsewhere (numpy broadcasting)."""
    sizes = {}
    for x, idx in terms:
        for c, n in zip(idx, get_aval(x).shape):
            if sizes.get(c, 1) not in (1, n) and n != 1:
                raise ShapeError(f"spmd.numpy.einsum: index {c!r} has sizes {sizes[c]} and {n} "
                                 "in different operands")
            sizes[c] = max(sizes.get(c, 1), n) if n != 1 else sizes.get(c, 1)
    for k, (x, idx) in enumerate(terms):
        drop = [i for i, (c, n) in enumerate(zip(idx, get_aval(x).shape))
                if n == 1 and sizes[c] != 1]
        if drop:
            terms[k] = (squeeze(x, drop), [c for i, c in enumerate(idx) if i not in drop])


def _sum_unneeded(x, idx, others, output):
    needed = set(output).union(*map(set, others))
    axes = [i for i, c in enumerate(idx) if c not in needed]
    if not axes:
        return x, idx
    return reduce_sum(x, axes), [c for c in idx if c in needed]


def _contract(x, xidx, y, yidx, keep):
    """dot_general of two terms: shared letters are batch dims if kept, else contracted."""
    shared = [c for c in xidx if c in yidx]
    batch = [c for c in shared if c in keep]
    contract = [c for c in shared if c not in keep]
    dn = ((tuple(xidx.index(c) for c in contract), tuple(yidx.index(c) for c in contract)),
          (tuple(xidx.index(c) for c in batch), tuple(yidx.index(c) for c in batch)))
    out = dot_general(x, y, dn)
    idx = batch + [c for c in xidx if c not in shared] + [c for c in yidx if c not in shared]
    return out, idx
