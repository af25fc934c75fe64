"""Sorting: ``sort`` of several operands together by their first ``num_keys``.

``sort(*operands, dimension, is_stable, num_keys)`` returns every operand
permuted along ``dimension`` by the lexicographic order of the key operands
(the first ``num_keys``); the sort is always stable (numpy's
``kind="stable"``), NaNs last.  Its derivative permutes the tangents the same
way: the jvp sorts an iota along with the operands and gathers the tangents by
that permutation (``take_along_axis``), so reverse mode is a scatter-add.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, ShapeError
from spmd.compiler import ops
from spmd.compiler.transforms.batching import bdim_size, broadcast_batch

sort_p = Primitive("sort", traits=(), multiple_results=True)


def _argsort(xp, k, axis):
    # numpy needs kind="stable" for a stable argsort; CuPy's argsort is always stable.
    if xp is np:
        return xp.argsort(k, axis=axis, kind="stable")
    return xp.argsort(k, axis=axis)


def _permutation(xp, keys, axis):
    """The stable lexicographic order of ``keys`` along ``axis`` (first key major)."""
    perm = _argsort(xp, keys[-1], axis)
    # Least significant key first; each later stable pass keeps the earlier order on ties.
    for k in reversed(keys[:-1]):
        step = _argsort(xp, xp.take_along_axis(k, perm, axis=axis), axis)
        perm = xp.take_along_axis(perm, step, axis=axis)
    return perm


@sort_p.def_impl
def _sort_impl(xp, *operands, dimension, is_stable, num_keys):
    if len(operands) == 1:  # sorting values alone: stability cannot be observed
        return [xp.sort(operands[0], axis=dimension)]
    perm = _permutation(xp, operands[:num_keys], dimension)
    return [xp.take_along_axis(o, perm, axis=dimension) for o in operands]


sort_p.def_emit(lambda ins, dimension, is_stable, num_keys:
                f"[xp.sort({ins[0]}, axis={dimension})]" if len(ins) == 1 else None)


@sort_p.def_abstract_eval
def _sort_aval(*operands, dimension, is_stable, num_keys):
    if not operands:
        raise ArgumentError("sort: needs at least one operand")
    shape = operands[0].shape
    for i, o in enumerate(operands):
        if o.shape != shape:
            raise ShapeError(f"sort: all operands must have one shape; operand 0 has shape "
                             f"{shape} and operand {i} has shape {o.shape}")
    if not shape:
        raise ShapeError("sort: cannot sort a 0-d operand (it has no dimension to sort along)")
    if not 0 <= dimension < len(shape):
        raise ArgumentError(f"sort: dimension {dimension} is out of range for operands of "
                            f"shape {shape}")
    if not 1 <= num_keys <= len(operands):
        raise ArgumentError(f"sort: num_keys={num_keys} must be between 1 and the number of "
                            f"operands ({len(operands)})")
    return [ShapedArray(o.shape, o.dtype, o.weak_type) for o in operands]


def sort(operand, dimension: int = -1, is_stable: bool = True, num_keys: int = 1):
    """Sort ``operand`` (an array, or a sequence sorted together by its first
    ``num_keys``) along ``dimension``, as ``lax.sort``.

    >>> sort(np.array([3, 1, 2]))  # doctest: +SKIP
    Array([1, 2, 3], dtype=int32)
    >>> keys, vals = sort((np.array([2, 1]), np.array([10, 20])))  # doctest: +SKIP
    """
    single = not isinstance(operand, (list, tuple))
    operands = [operand] if single else list(operand)
    nd = len(np.shape(operands[0])) if operands else 0
    d = int(dimension)
    if nd and -nd <= d < nd:
        d %= nd
    outs = bind(sort_p, *operands, dimension=d, is_stable=bool(is_stable),
                num_keys=int(num_keys))
    return outs[0] if single else tuple(outs)


def sort_key_val(keys, values, dimension: int = -1, is_stable: bool = True):
    """Sort ``keys`` along ``dimension`` and permute ``values`` the same way."""
    k, v = sort((keys, values), dimension, is_stable, 1)
    return k, v


def _index_dtype(n):
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def take_along_axis(x, idx, axis: int):
    """``x`` picked along ``axis`` by ``idx`` (same shape as ``x``): numpy's
    ``take_along_axis`` for a full index array, as one gather."""
    shape = tuple(np.shape(x))
    idt = get_aval(idx).dtype
    ids = [idx if d == axis else ops.structural.iota(idt, shape, d) for d in range(len(shape))]
    return ops.indexing.gather(x, ids, tuple(range(len(shape))))


@sort_p.def_jvp
def _sort_jvp(primals, tangents, *, dimension, is_stable, num_keys):
    shape = tuple(np.shape(primals[0]))
    if all(isinstance(t, Zero) for t in tangents):
        outs = bind(sort_p, *primals, dimension=dimension, is_stable=is_stable,
                    num_keys=num_keys)
        return outs, [Zero(tangent_aval(get_aval(o))) for o in outs]
    # Sort an iota along: its result is the permutation the tangents follow.
    idx = ops.structural.iota(_index_dtype(shape[dimension]), shape, dimension)
    *outs, perm = bind(sort_p, *primals, idx, dimension=dimension, is_stable=is_stable,
                       num_keys=num_keys)
    tans = [Zero(tangent_aval(get_aval(o))) if isinstance(t, Zero)
            else take_along_axis(t, perm, dimension) for o, t in zip(outs, tangents)]
    return outs, tans


@sort_p.def_batch
def _sort_batch(args, dims, *, dimension, is_stable, num_keys):
    size = bdim_size(args, dims)
    # Unbatched operands are broadcast: every operand must share one shape.
    ops = [broadcast_batch(a, d, size) for a, d in zip(args, dims)]
    outs = bind(sort_p, *ops, dimension=dimension + 1, is_stable=is_stable, num_keys=num_keys)
    return outs, [0] * len(outs)


def argsort_along(x, axis: int, index_dtype=None):
    """The stable ascending argsort of ``x`` along ``axis`` (int32 indices by default)."""
    shape = tuple(np.shape(x))
    index_dtype = dtypes.default_int() if index_dtype is None else np.dtype(index_dtype)
    _, perm = bind(sort_p, x, ops.structural.iota(index_dtype, shape, axis), dimension=axis,
                   is_stable=True, num_keys=1)
    return perm
