"""More structural primitives: concatenate, pad, slice, rev.

Like those of ``structural.py`` they move data without arithmetic and are
linear; each transpose is another member of the family (the transpose of
``concatenate`` slices, that of ``slice`` pads with zeros, that of ``pad``
slices, that of ``rev`` reverses).
"""

from __future__ import annotations

import builtins

import numpy as np

from spmd.compiler.transforms.ad_util import Zero, instantiate, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.compiler import ops
from spmd.compiler.transforms.batching import bdim_size, broadcast_batch


# ``slice`` below is lax's name for the primitive's binder; Python's is this one.
_pyslice = builtins.slice


def _zero_out(out):
    """The symbolic zero tangent of a primitive's output ``out``."""
    return Zero(tangent_aval(get_aval(out)))


# ---------------------------------------------------------------- concatenate

concatenate_p = Primitive("concatenate", traits=(), linear=True)
concatenate_p.unreduced = "joint"


@concatenate_p.def_impl
def _concat_impl(xp, *xs, dimension):
    # numpy lays the result out as its operands are when none is C-contiguous (pieces
    # transposed into the reader's layout, spmd.compiler.passes.pads, would come back
    # transposed): the result is made C-contiguous, as every other result is.
    if all(getattr(x, "flags", None) is None or x.flags.c_contiguous for x in xs):
        return xp.concatenate(xs, axis=dimension)
    shape = list(xs[0].shape)
    shape[dimension] = sum(x.shape[dimension] for x in xs)
    return xp.concatenate(xs, axis=dimension, out=xp.empty(shape, xs[0].dtype))


concatenate_p.def_emit(
    lambda ins, dimension: f"xp.concatenate(({', '.join(ins)},), axis={dimension})"
    if len(ins) == 1 else None)  # else the impl: a C-contiguous result


@concatenate_p.def_abstract_eval
def _concat_aval(*xs, dimension):
    if not xs:
        raise ArgumentError("concatenate: needs at least one operand")
    first = xs[0]
    if {x.dtype for x in xs} != {first.dtype}:
        raise DTypeError(f"concatenate: operand dtypes {[str(x.dtype) for x in xs]} differ; "
                         "convert first (spmd.numpy.concatenate promotes automatically)")
    if not 0 <= dimension < first.ndim:
        raise ArgumentError(f"concatenate: dimension={dimension} is out of range for operands "
                            f"of rank {first.ndim} (shapes {[x.shape for x in xs]})")
    for x in xs[1:]:
        if x.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, first.shape))
                                       if i != dimension):
            raise ShapeError(f"concatenate: operand shapes {[x.shape for x in xs]} must agree "
                             f"except in dimension {dimension}")
    shape = list(first.shape)
    shape[dimension] = sum(x.shape[dimension] for x in xs)
    return ShapedArray(tuple(shape), first.dtype, all(x.weak_type for x in xs))


def concatenate(operands, dimension: int):
    """Join ``operands`` (equal dtype, equal shape except ``dimension``) along ``dimension``.

    >>> concatenate([np.ones(2, np.float32), np.zeros(1, np.float32)], 0)  # doctest: +SKIP
    """
    operands = list(operands)
    if len(operands) == 1:
        return operands[0]
    return bind(concatenate_p, *operands, dimension=int(dimension))


@concatenate_p.def_jvp
def _concat_jvp(primals, tangents, *, dimension):
    out = bind(concatenate_p, *primals, dimension=dimension)
    if all(isinstance(t, Zero) for t in tangents):
        return out, _zero_out(out)
    return out, bind(concatenate_p, *map(instantiate, tangents), dimension=dimension)


@concatenate_p.def_transpose
def _concat_transpose(ct, *xs, dimension):
    outs, start = [], 0
    for x in xs:
        aval = x.aval if is_undefined(x) else get_aval(x)
        size = aval.shape[dimension]
        if not is_undefined(x):
            outs.append(None)
        elif isinstance(ct, Zero):
            outs.append(Zero(x.aval))
        else:
            outs.append(slice_in_dim(ct, start, start + size, 1, dimension))
        start += size
    return outs


@concatenate_p.def_batch
def _concat_batch(args, dims, *, dimension):
    size = bdim_size(args, dims)
    moved = [broadcast_batch(x, d, size) for x, d in zip(args, dims)]
    return bind(concatenate_p, *moved, dimension=dimension + 1), 0


# ----------------------------------------------------------------------- pad

pad_p = Primitive("pad", traits=(), linear=True)


def _pad_out_shape(shape, config):
    return tuple(lo + hi + n + max(n - 1, 0) * interior
                 for n, (lo, hi, interior) in zip(shape, config))


@pad_p.def_impl
def _pad_impl(xp, x, padding_value, *, padding_config):
    # Interior padding first, on the non-negative edges; then crop negative edges.
    grown = [(max(lo, 0), max(hi, 0), it) for lo, hi, it in padding_config]
    out = xp.empty(_pad_out_shape(x.shape, grown), dtype=x.dtype)
    out[...] = padding_value
    out[tuple(_pyslice(lo, lo + (n - 1) * (it + 1) + 1, it + 1) if n else _pyslice(lo, lo)
              for n, (lo, _, it) in zip(x.shape, grown))] = x
    crop = tuple(_pyslice(-min(lo, 0), size - (-min(hi, 0)))
                 for size, (lo, hi, _) in zip(out.shape, padding_config))
    return out[crop]


@pad_p.def_abstract_eval
def _pad_aval(x, padding_value, *, padding_config):
    if padding_value.shape != ():
        raise ShapeError(f"pad: padding_value must be a scalar, got shape {padding_value.shape}")
    if padding_value.dtype != x.dtype:
        raise DTypeError(f"pad: padding_value dtype {padding_value.dtype} differs from the "
                         f"operand's {x.dtype}; convert it first")
    if len(padding_config) != x.ndim:
        raise ShapeError(f"pad: padding_config {padding_config} needs one (lo, hi, interior) "
                         f"triple per dimension of the operand of shape {x.shape}")
    if any(it < 0 for _, _, it in padding_config):
        raise ArgumentError(f"pad: interior padding must be >= 0, got {padding_config}")
    shape = _pad_out_shape(x.shape, padding_config)
    if any(s < 0 for s in shape):
        raise ShapeError(f"pad: padding_config {padding_config} removes more than the operand "
                         f"of shape {x.shape} holds (result shape {shape})")
    return ShapedArray(shape, x.dtype, x.weak_type)


def pad(x, padding_value, padding_config):
    """Pad ``x`` with the scalar ``padding_value``: per dim ``(lo, hi, interior)``, as lax.pad.

    Negative ``lo``/``hi`` remove elements from that edge (after interior padding).
    """
    config = tuple((int(lo), int(hi), int(it)) for lo, hi, it in padding_config)
    if all(c == (0, 0, 0) for c in config) and len(config) == len(np.shape(x)):
        return x
    return bind(pad_p, x, padding_value, padding_config=config)


@pad_p.def_jvp
def _pad_jvp(primals, tangents, *, padding_config):
    out = bind(pad_p, *primals, padding_config=padding_config)
    tx, tv = tangents
    if isinstance(tx, Zero) and isinstance(tv, Zero):
        return out, _zero_out(out)
    return out, bind(pad_p, instantiate(tx), instantiate(tv), padding_config=padding_config)


def _unpad(ct, padding_config):
    """The operand-shaped part of a pad's output ``ct`` (the transpose of pad)."""
    lo, hi, interior = zip(*padding_config)
    # Undo the edges (re-growing cropped ones with zeros), then skip interior padding.
    unpadded = pad(ct, np.zeros((), get_aval(ct).dtype),
                   tuple((-a, -b, 0) for a, b in zip(lo, hi)))
    shape = np.shape(unpadded)
    return slice(unpadded, (0,) * len(shape), shape, tuple(i + 1 for i in interior))


@pad_p.def_transpose
def _pad_transpose(ct, x, padding_value, *, padding_config):
    if isinstance(ct, Zero):
        return [Zero(x.aval) if is_undefined(x) else None,
                Zero(padding_value.aval) if is_undefined(padding_value) else None]
    t_x = _unpad(ct, padding_config)
    t_v = None
    if is_undefined(padding_value):
        # Every output element that is not an operand element is the padding value.
        total = lambda a: ops.reduce.reduce_sum(a, tuple(range(len(np.shape(a)))))
        t_v = ops.elementwise.sub(total(ct), total(t_x))
    return [t_x if is_undefined(x) else None, t_v]


@pad_p.def_batch
def _pad_batch(args, dims, *, padding_config):
    (x, v), (dx, dv) = args, dims
    size = bdim_size(args, dims)
    config = ((0, 0, 0),) + tuple(padding_config)
    x = broadcast_batch(x, dx, size)
    if dv is None:
        return pad(x, v, config), 0
    # A padding value per batch element: pad with zeros, then select by a mask.
    padded = pad(x, np.zeros((), get_aval(x).dtype), config)
    in_shape = np.shape(x)[1:]
    mask = pad(ops.structural.full(in_shape, True, np.dtype(bool)), np.array(False), padding_config)
    out_shape = np.shape(padded)
    mask = ops.structural.broadcast_in_dim(mask, out_shape, tuple(range(1, len(out_shape))))
    v = ops.structural.broadcast_in_dim(broadcast_batch(v, dv, size), out_shape, (0,))
    return ops.elementwise.select(mask, padded, v), 0


# --------------------------------------------------------------------- slice

slice_p = Primitive("slice", traits=("view",), linear=True)
slice_p.unreduced = "keep"


@slice_p.def_impl
def _slice_impl(xp, x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * len(start_indices)
    return x[tuple(_pyslice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides))]


def _slice_emit(ins, start_indices, limit_indices, strides):
    strides = strides or (1,) * len(start_indices)
    if not start_indices:
        return ins[0]
    idx = ", ".join(f"{s}:{l}" + (f":{st}" if st != 1 else "")
                    for s, l, st in zip(start_indices, limit_indices, strides))
    return f"{ins[0]}[{idx},]"


slice_p.def_emit(_slice_emit)


def _sliced_size(start, limit, stride):
    return max(0, -(-(limit - start) // stride))


@slice_p.def_abstract_eval
def _slice_aval(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * x.ndim
    if not len(start_indices) == len(limit_indices) == len(strides) == x.ndim:
        raise ShapeError(f"slice: start_indices {start_indices}, limit_indices {limit_indices} "
                         f"and strides {strides} need one entry per dimension of the operand "
                         f"of shape {x.shape}")
    for d, (s, l, st, n) in enumerate(zip(start_indices, limit_indices, strides, x.shape)):
        if not 0 <= s <= l <= n:
            raise ShapeError(f"slice: dimension {d} of the operand of shape {x.shape} cannot be "
                             f"sliced from {s} to {l} (need 0 <= start <= limit <= {n}; "
                             "spmd.numpy indexing clamps out-of-bounds slices)")
        if st < 1:
            raise ArgumentError(f"slice: strides must be >= 1, got {strides}")
    shape = tuple(_sliced_size(s, l, st) for s, l, st in zip(start_indices, limit_indices,
                                                             strides))
    return ShapedArray(shape, x.dtype, x.weak_type)


def slice(x, start_indices, limit_indices, strides=None):  # noqa: A001  (lax's name)
    """``x[start:limit:stride]`` per dimension (in-bounds static indices, as lax.slice)."""
    start = tuple(int(s) for s in start_indices)
    limit = tuple(int(s) for s in limit_indices)
    strides = None if strides is None else tuple(int(s) for s in strides)
    if strides is not None and all(s == 1 for s in strides):
        strides = None
    if strides is None and all(s == 0 for s in start) and limit == tuple(np.shape(x)):
        return x
    return bind(slice_p, x, start_indices=start, limit_indices=limit, strides=strides)


def slice_in_dim(x, start: int, limit: int, stride: int = 1, axis: int = 0):
    """``slice`` along one axis only."""
    shape = np.shape(x)
    starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
    starts[axis], limits[axis], strides[axis] = start, limit, stride
    return slice(x, starts, limits, strides)


def _linear_unary_jvp(p, f):
    def rule(primals, tangents, **params):
        out = bind(p, *primals, **params)
        (t,) = tangents
        return out, (_zero_out(out) if isinstance(t, Zero) else f(t, **params))

    p.def_jvp(rule)


_linear_unary_jvp(slice_p, lambda t, **params: bind(slice_p, t, **params))


@slice_p.def_transpose
def _slice_transpose(ct, x, *, start_indices, limit_indices, strides):
    if isinstance(ct, Zero):
        return [Zero(x.aval)]
    shape = x.aval.shape
    strides = strides or (1,) * len(shape)
    ct_shape = np.shape(ct)
    # The index one past the last element taken, per dimension.
    real_limits = [s + (0 if n == 0 else 1 + (n - 1) * st)
                   for s, n, st in zip(start_indices, ct_shape, strides)]
    config = tuple((s, d - l, st - 1) for s, l, d, st in zip(start_indices, real_limits, shape,
                                                              strides))
    return [pad(ct, np.zeros((), get_aval(ct).dtype), config)]


@slice_p.def_batch
def _slice_batch(args, dims, *, start_indices, limit_indices, strides):
    (x,), (d,) = args, dims
    strides = strides or (1,) * len(start_indices)
    ins = lambda t, v: t[:d] + (v,) + t[d:]
    n = np.shape(x)[d]
    return slice(x, ins(start_indices, 0), ins(limit_indices, n), ins(strides, 1)), d


# ----------------------------------------------------------------------- rev

rev_p = Primitive("rev", traits=(), linear=True)
rev_p.unreduced = "keep"
rev_p.def_impl(lambda xp, x, *, dimensions: xp.flip(x, axis=dimensions))
rev_p.def_emit(lambda ins, dimensions: f"xp.flip({ins[0]}, axis={dimensions!r})")


@rev_p.def_abstract_eval
def _rev_aval(x, *, dimensions):
    if any(not 0 <= d < x.ndim for d in dimensions) or len(set(dimensions)) != len(dimensions):
        raise ArgumentError(f"rev: dimensions {dimensions} must be distinct axes of the "
                            f"operand of shape {x.shape}")
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def rev(x, dimensions):
    """Reverse ``x`` along each axis in ``dimensions``."""
    dimensions = tuple(sorted(int(d) for d in dimensions))
    if not dimensions:
        return x
    return bind(rev_p, x, dimensions=dimensions)


_linear_unary_jvp(rev_p, lambda t, *, dimensions: rev(t, dimensions))
rev_p.def_transpose(lambda ct, x, *, dimensions: [
    Zero(x.aval) if isinstance(ct, Zero) else rev(ct, dimensions)])


@rev_p.def_batch
def _rev_batch(args, dims, *, dimensions):
    (x,), (d,) = args, dims
    return rev(x, tuple(a + (a >= d) for a in dimensions)), d
