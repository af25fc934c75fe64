"""Indexing primitives: dynamic_slice, dynamic_update_slice, gather, scatter.

Conventions (the numpy front end, ``spmd/numpy/_indexing.py``, maps every
numpy index expression onto them):

- ``dynamic_slice(x, *starts, slice_sizes)`` / ``dynamic_update_slice(x, u,
  *starts)``: one scalar integer start per dimension, clamped so that the
  window stays in bounds (XLA semantics).
- ``gather(x, *idx, axes)``: the integer arrays ``idx`` (all of one shape B)
  index the dimensions ``axes`` of ``x``; the result is ``B + the other dims of
  x in order`` ("B first").  ``mode="clip"`` clamps out-of-range indices (JAX's
  default for gathers), ``mode="fill"`` returns ``fill_value`` (0 when None)
  there.
- ``scatter(x, updates, *idx, axes, mode)``: the same indexing, ``updates``
  shaped ``B + the other dims``; ``mode`` combines (set, add, mul, min, max);
  out-of-range indices are dropped (JAX's default for scatters).

How gather and scatter run on arrays is in :mod:`spmd.compiler.ops.indexing_kernels`
(with a compiled scatter-add of rows, :mod:`spmd.compiler.ops.indexing_jit`).
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.engine import loops
from spmd.compiler.transforms.ad_util import Zero, instantiate, is_undefined
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.ops import indexing_jit, indexing_kernels
from spmd.compiler.ops.elementwise import (add, convert, div, eq, max as lax_max,
                                           min as lax_min, mul, select)
from spmd.compiler.ops.structural import broadcast_in_dim, full, iota, reshape, zeros
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import ArgumentError, DTypeError, IndexOutOfBoundsError, ShapeError
# A module, not names: batching imports spmd.compiler.ops, so importing it first loads
# this module while batching is half made.
from spmd.compiler.transforms import batching


def _zero_out(out):
    """The symbolic zero tangent of a primitive's output ``out``."""
    return Zero(tangent_aval(get_aval(out)))


def _scalar(value, dtype):
    """A scalar constant of ``dtype`` (a literal in traced programs)."""
    return np.array(value, dtype=dtype)[()]


def _check_int_scalars(name, what, avals):
    for i, a in enumerate(avals):
        if a.shape != () or not dtypes.is_int(a.dtype):
            raise DTypeError(f"{name}: {what} {i} must be a scalar integer, got {a}")


def _clamp_index(i, lo, hi):
    """``clip(i, lo, hi)`` elementwise on an integer index array (traced or not)."""
    dt = get_aval(i).dtype
    hi = min(hi, int(np.iinfo(dt).max))  # a bound the index dtype cannot exceed anyway
    return lax_min(lax_max(i, _scalar(lo, dt)), _scalar(hi, dt))


# ----------------------------------------------------------- dynamic_slice

dynamic_slice_p = Primitive("dynamic_slice", traits=())


def _clamped_starts(starts, shape, sizes):
    # int() of a 0-d array: starts are tiny host scalars even on an accelerator.
    return [min(max(int(s), 0), n - k) for s, n, k in zip(starts, shape, sizes)]


@dynamic_slice_p.def_impl
def _ds_impl(xp, x, *starts, slice_sizes):
    st = _clamped_starts(starts, x.shape, slice_sizes)
    return x[tuple(slice(s, s + k) for s, k in zip(st, slice_sizes))]


@dynamic_slice_p.def_abstract_eval
def _ds_aval(x, *starts, slice_sizes):
    if len(starts) != x.ndim or len(slice_sizes) != x.ndim:
        raise ShapeError(f"dynamic_slice: an operand of shape {x.shape} needs {x.ndim} start "
                         f"indices and slice sizes, got {len(starts)} and {slice_sizes}")
    _check_int_scalars("dynamic_slice", "start index", starts)
    for d, (k, n) in enumerate(zip(slice_sizes, x.shape)):
        if not 0 <= k <= n:
            raise ShapeError(f"dynamic_slice: slice size {k} of dimension {d} must be in "
                             f"[0, {n}] for an operand of shape {x.shape}")
    return ShapedArray(slice_sizes, x.dtype, x.weak_type)


def dynamic_slice(x, start_indices, slice_sizes):
    """The window of ``x`` of shape ``slice_sizes`` at traced ``start_indices`` (clamped).

    >>> dynamic_slice(np.arange(5), [3], [2])  # doctest: +SKIP
    Array([3, 4], dtype=int32)
    """
    sizes = tuple(int(s) for s in slice_sizes)
    return bind(dynamic_slice_p, x, *start_indices, slice_sizes=sizes)


@dynamic_slice_p.def_jvp
def _ds_jvp(primals, tangents, *, slice_sizes):
    x, *starts = primals
    out = dynamic_slice(x, starts, slice_sizes)
    t = tangents[0]
    return out, (_zero_out(out) if isinstance(t, Zero) else dynamic_slice(t, starts, slice_sizes))


@dynamic_slice_p.def_transpose
def _ds_transpose(ct, x, *starts, slice_sizes):
    none = [None] * len(starts)
    if isinstance(ct, Zero):
        return [Zero(x.aval)] + none
    base = zeros(x.aval.shape, get_aval(ct).dtype)
    return [dynamic_update_slice(base, ct, starts)] + none


def _window_indices(starts, shape, sizes, n):
    """Per-dimension index arrays ``(n,) + sizes`` of a batch of clamped windows."""
    full_shape = (n,) + tuple(sizes)
    out = []
    for k, (s, dim, size) in enumerate(zip(starts, shape, sizes)):
        s = _clamp_index(s, 0, dim - size)
        dt = get_aval(s).dtype
        out.append(add(broadcast_in_dim(s, full_shape, (0,)), iota(dt, full_shape, k + 1)))
    return out


def _batched_starts(starts, dims, n):
    dt = dtypes.default_int()
    return [batching.broadcast_batch(convert(s, dt), d, n) for s, d in zip(starts, dims)]


@dynamic_slice_p.def_batch
def _ds_batch(args, dims, *, slice_sizes):
    (x, *starts), (xd, *sdims) = args, dims
    n = batching.bdim_size(args, dims)
    if all(d is None for d in sdims):
        x = batching.move_to_front(x, xd)
        zero = _scalar(0, get_aval(starts[0]).dtype if starts else np.int32)
        return dynamic_slice(x, [zero] + list(starts), (n,) + tuple(slice_sizes)), 0
    if n == 1:
        # One element (a process's one device of a mesh): its starts are the slice's.
        if xd is None:
            x = broadcast_in_dim(x, (1,) + tuple(np.shape(x)), tuple(range(1, np.ndim(x) + 1)))
        else:
            x = batching.move_to_front(x, xd)
        one = [s if d is None else reshape(batching.move_to_front(s, d), ()) for s, d in
               zip(starts, sdims)]
        zero = _scalar(0, get_aval(one[0]).dtype)
        return dynamic_slice(x, [zero] + one, (1,) + tuple(slice_sizes)), 0
    # Starts that differ per batch element: a gather of the windows.
    shape = tuple(np.shape(x))
    shape = shape if xd is None else shape[:xd] + shape[xd + 1:]
    idx = _window_indices(_batched_starts(starts, sdims, n), shape, slice_sizes, n)
    if xd is None:
        return gather(x, idx, tuple(range(len(shape)))), 0
    batch_idx = iota(get_aval(idx[0]).dtype, (n,) + tuple(slice_sizes), 0)
    return gather(batching.move_to_front(x, xd), [batch_idx] + idx,
                  tuple(range(len(shape) + 1))), 0


# ---------------------------------------------------- dynamic_update_slice

dynamic_update_slice_p = Primitive("dynamic_update_slice", traits=("fresh_result",))


def _dus_in_place(xp, x, update, *starts):
    """Write ``update`` into ``x`` itself (the generated code calls this where ``x``'s
    buffer is its own and read nowhere else: ``buffers.updatable_operand``)."""
    st = _clamped_starts(starts, x.shape, update.shape)
    x[tuple(slice(s, s + k) for s, k in zip(st, update.shape))] = update
    return x


@dynamic_update_slice_p.def_impl
def _dus_impl(xp, x, update, *starts):
    # Inputs are never modified: other values may share their buffers.
    return _dus_in_place(xp, x.copy(), update, *starts)


dynamic_update_slice_p.rules.in_place = _dus_in_place


@dynamic_update_slice_p.def_abstract_eval
def _dus_aval(x, update, *starts):
    if len(starts) != x.ndim or update.ndim != x.ndim:
        raise ShapeError(f"dynamic_update_slice: an operand of shape {x.shape} needs an update "
                         f"of the same rank and {x.ndim} start indices, got update shape "
                         f"{update.shape} and {len(starts)} start indices")
    if update.dtype != x.dtype:
        raise DTypeError(f"dynamic_update_slice: update dtype {update.dtype} differs from the "
                         f"operand's {x.dtype}; convert it first")
    if any(u > n for u, n in zip(update.shape, x.shape)):
        raise ShapeError(f"dynamic_update_slice: update of shape {update.shape} does not fit "
                         f"in an operand of shape {x.shape}")
    _check_int_scalars("dynamic_update_slice", "start index", starts)
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def dynamic_update_slice(x, update, start_indices):
    """``x`` with the window at traced ``start_indices`` (clamped) replaced by ``update``."""
    return bind(dynamic_update_slice_p, x, update, *start_indices)


@dynamic_update_slice_p.def_jvp
def _dus_jvp(primals, tangents):
    x, u, *starts = primals
    tx, tu = tangents[:2]
    out = dynamic_update_slice(x, u, starts)
    if isinstance(tx, Zero) and isinstance(tu, Zero):
        return out, _zero_out(out)
    return out, dynamic_update_slice(instantiate(tx), instantiate(tu), starts)


@dynamic_update_slice_p.def_transpose
def _dus_transpose(ct, x, u, *starts):
    none = [None] * len(starts)
    if isinstance(ct, Zero):
        return [Zero(x.aval) if is_undefined(x) else None,
                Zero(u.aval) if is_undefined(u) else None] + none
    u_shape = u.aval.shape if is_undefined(u) else np.shape(u)
    ct_x = ct_u = None
    if is_undefined(x):
        ct_x = dynamic_update_slice(ct, zeros(u_shape, get_aval(ct).dtype), starts)
    if is_undefined(u):
        ct_u = dynamic_slice(ct, starts, u_shape)
    return [ct_x, ct_u] + none


@dynamic_update_slice_p.def_batch
def _dus_batch(args, dims):
    (x, u, *starts), (xd, ud, *sdims) = args, dims
    n = batching.bdim_size(args, dims)
    x, u = batching.broadcast_batch(x, xd, n), batching.broadcast_batch(u, ud, n)
    if all(d is None for d in sdims):
        zero = _scalar(0, get_aval(starts[0]).dtype if starts else np.int32)
        return dynamic_update_slice(x, u, [zero] + list(starts)), 0
    if n == 1:
        # One element: its starts are the update's.
        one = [s if d is None else reshape(batching.move_to_front(s, d), ()) for s, d in
               zip(starts, sdims)]
        zero = _scalar(0, get_aval(one[0]).dtype)
        return dynamic_update_slice(x, u, [zero] + one), 0
    # Per-element starts: a scatter of the windows (always in bounds once clamped).
    shape, sizes = np.shape(x)[1:], np.shape(u)[1:]
    idx = _window_indices(_batched_starts(starts, sdims, n), shape, sizes, n)
    batch_idx = iota(get_aval(idx[0]).dtype, (n,) + tuple(sizes), 0)
    return scatter(x, u, [batch_idx] + idx, tuple(range(len(shape) + 1)), "set"), 0


# ------------------------------------------------------------------ gather

gather_p = Primitive("gather", traits=())
gather_p.def_impl(indexing_kernels.gather_impl)


def _check_indexing(name, x, idx, axes):
    if not idx or len(idx) != len(axes):
        raise ArgumentError(f"{name}: needs one index array per axis in axes={axes} (at least "
                            f"one), got {len(idx)}")
    if len(set(axes)) != len(axes) or any(not 0 <= a < x.ndim for a in axes):
        raise ArgumentError(f"{name}: axes={axes} must be distinct axes of the operand of "
                            f"shape {x.shape}")
    for i, a in enumerate(idx):
        if not dtypes.is_int(a.dtype):
            raise DTypeError(f"{name}: index array {i} has dtype {a.dtype}; indices must be "
                             "integers")
        if a.shape != idx[0].shape:
            raise ShapeError(f"{name}: index arrays must share one shape (broadcast them "
                             f"first), got {[j.shape for j in idx]}")
    rest = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    return idx[0].shape, rest


@gather_p.def_abstract_eval
def _gather_aval(x, *idx, axes, mode, fill_value):
    b_shape, rest = _check_indexing("gather", x, idx, axes)
    if mode not in ("clip", "fill"):
        raise ArgumentError(f"gather: mode={mode!r}; expected 'clip' or 'fill'")
    if mode == "clip" and any(x.shape[a] == 0 for a in axes) and np.prod(b_shape) > 0:
        raise IndexOutOfBoundsError(f"gather: cannot index an axis of size 0 of the operand "
                                    f"of shape {x.shape} (axes={axes})")
    return ShapedArray(b_shape + rest, x.dtype, x.weak_type)


def gather(x, idx, axes, mode: str = "clip", fill_value=None):
    """``x`` indexed on ``axes`` by the integer arrays ``idx`` (one shape B): ``B + other dims``.

    >>> gather(np.arange(6).reshape(2, 3), [np.array([2, 0])], (1,))  # doctest: +SKIP
    Array([[2, 5], [0, 3]], dtype=int32)
    """
    axes = tuple(int(a) for a in axes)
    if isinstance(fill_value, np.generic):  # params are hashable Python values
        fill_value = fill_value.item()
    return bind(gather_p, x, *idx, axes=axes, mode=mode, fill_value=fill_value)


@gather_p.def_jvp
def _gather_jvp(primals, tangents, **params):
    out = bind(gather_p, *primals, **params)
    t = tangents[0]
    if isinstance(t, Zero):
        return out, _zero_out(out)
    # The fill value is a constant: its tangent is 0.
    return out, bind(gather_p, t, *primals[1:], **dict(params, fill_value=None))


@gather_p.def_transpose
def _gather_transpose(ct, x, *idx, axes, mode, fill_value):
    none = [None] * len(idx)
    if isinstance(ct, Zero):
        return [Zero(x.aval)] + none
    shape = x.aval.shape
    if mode == "clip":  # the reads happened at the clamped positions
        idx = [_clamp_index(i, 0, shape[a] - 1) for i, a in zip(idx, axes)]
    return [scatter(zeros(shape, get_aval(ct).dtype), ct, idx, axes, "add")] + none


@gather_p.def_batch
def _gather_batch(args, dims, *, axes, mode, fill_value):
    (x, *idx), (xd, *idims) = args, dims
    shifted = tuple(a + 1 for a in axes)
    if all(d is None for d in idims):
        # The batch axis of x is the first of its non-indexed dims: it lands after B.
        out = gather(batching.move_to_front(x, xd), idx, shifted, mode, fill_value)
        return out, len(np.shape(idx[0]))
    n = batching.bdim_size(args, dims)
    idx = [batching.broadcast_batch(i, d, n) for i, d in zip(idx, idims)]
    if xd is None:
        return gather(x, idx, axes, mode, fill_value), 0
    # Both batched: element b reads x[b], so index the batch axis with an iota.
    batch_idx = iota(get_aval(idx[0]).dtype, np.shape(idx[0]), 0)
    return gather(batching.move_to_front(x, xd), [batch_idx] + idx, (0,) + shifted, mode,
                  fill_value), 0


# ----------------------------------------------------------------- scatter

scatter_p = Primitive("scatter", traits=("fresh_result",))
SCATTER_MODES = ("set", "add", "mul", "min", "max")


@scatter_p.def_impl
def _scatter_impl(xp, x, updates, *idx, axes, mode):
    # Inputs are never modified: other values may share their buffers.
    return indexing_kernels.scatter_in_place(xp, x.copy(), updates, *idx, axes=axes,
                                             mode=mode)


scatter_p.rules.in_place = indexing_kernels.scatter_in_place
# On numpy, an equation adding rows by one index (an embedding's gradient) switches
# to a compiled loop once it is compiled (spmd/compiler/ops/indexing_jit.py).
scatter_p.rules.bind_impl = loops.bind_site(_scatter_impl, indexing_jit.Runner)


@scatter_p.def_abstract_eval
def _scatter_aval(x, updates, *idx, axes, mode):
    if mode not in SCATTER_MODES:
        raise ArgumentError(f"scatter: mode={mode!r}; expected one of {SCATTER_MODES}")
    b_shape, rest = _check_indexing("scatter", x, idx, axes)
    if updates.dtype != x.dtype:
        raise DTypeError(f"scatter: updates dtype {updates.dtype} differs from the operand's "
                         f"{x.dtype}; convert them first")
    if updates.shape != b_shape + rest:
        raise ShapeError(f"scatter: updates of shape {updates.shape} must have the index shape "
                         f"{b_shape} followed by the non-indexed dims {rest} of the operand "
                         f"of shape {x.shape}")
    return ShapedArray(x.shape, x.dtype, x.weak_type)


def scatter(x, updates, idx, axes, mode: str = "set"):
    """``x`` with ``updates`` combined (``mode``) at the positions ``idx`` index on ``axes``.

    >>> scatter(np.zeros(3), np.ones(2), [np.array([0, 0])], (0,), "add")  # doctest: +SKIP
    Array([2., 0., 0.], dtype=float32)
    """
    axes = tuple(int(a) for a in axes)
    return bind(scatter_p, x, updates, *idx, axes=axes, mode=mode)


def _scatter_jvp(primals, tangents, *, axes, mode):
    x, u, *idx = primals
    tx, tu = tangents[:2]
    out = scatter(x, u, idx, axes, mode)
    if (isinstance(tx, Zero) and isinstance(tu, Zero)) or not dtypes.is_inexact(get_aval(x).dtype):
        return out, _zero_out(out)
    if mode in ("set", "add"):  # linear in (x, updates) together
        return out, scatter(instantiate(tx), instantiate(tu), idx, axes, mode)
    if mode == "mul":
        return out, _scatter_mul_tangent(x, u, idx, axes, tx, tu)
    return out, _scatter_extremum_tangent(x, u, out, idx, axes, mode, tx, tu)


def _scatter_mul_tangent(x, u, idx, axes, tx, tu):
    # out = x * P with P the product of the updates at each position, so
    # d out = tx * P + x * sum_i du_i * (product of the *other* updates there).
    dt = get_aval(x).dtype
    shape = get_aval(x).shape
    t = None
    if not isinstance(tx, Zero):
        t = mul(tx, scatter(full(shape, 1, dt), u, idx, axes, "mul"))
    if not isinstance(tu, Zero):
        # "Product of the others" without dividing by a zero: with P' the product
        # of the non-zero updates at a position and Z that of its zero updates,
        # it is P'/u_i * Z for a non-zero u_i (Z keeps the derivative with
        # respect to the zeros), and for a zero u_i P' if it is the only zero
        # there, else 0.  (Higher derivatives with two or more exact zeros at
        # one position are therefore not exact.)
        one = _scalar(1, dt)
        is0 = eq(u, _scalar(0, dt))
        ones_u, ones_x = full(np.shape(u), 1, dt), full(shape, 1, dt)
        u_nz = select(is0, ones_u, u)
        count0 = gather(scatter(zeros(shape, dt), convert(is0, dt), idx, axes, "add"), idx, axes)
        prod_nz = gather(scatter(ones_x, u_nz, idx, axes, "mul"), idx, axes)
        prod_z = gather(scatter(ones_x, select(is0, u, ones_u), idx, axes, "mul"), idx, axes)
        others = select(is0, select(eq(count0, one), prod_nz, zeros(np.shape(u), dt)),
                        mul(div(prod_nz, u_nz), prod_z))
        du = scatter(zeros(shape, dt), mul(tu, others), idx, axes, "add")
        t = mul(x, du) if t is None else add(t, mul(x, du))
    return t


def _scatter_extremum_tangent(x, u, out, idx, axes, mode, tx, tu):
    # The tangent of each position is the mean of the tangents of the values
    # (x itself and the updates) that attain the extremum there (JAX's rule).
    dt = get_aval(x).dtype
    shape = get_aval(x).shape
    won_u = convert(eq(u, gather(out, idx, axes)), dt)
    kept_x = convert(eq(x, out), dt)
    count = scatter(kept_x, won_u, idx, axes, "add")
    num = None
    if not isinstance(tx, Zero):
        num = mul(tx, kept_x)
    if not isinstance(tu, Zero):
        from_u = scatter(zeros(shape, dt), mul(tu, won_u), idx, axes, "add")
        num = from_u if num is None else add(num, from_u)
    return div(num, count)


scatter_p.def_jvp(_scatter_jvp)


@scatter_p.def_transpose
def _scatter_transpose(ct, x, u, *idx, axes, mode):
    none = [None] * len(idx)
    x_undef, u_undef = is_undefined(x), is_undefined(u)
    if isinstance(ct, Zero):
        return [Zero(x.aval) if x_undef else None, Zero(u.aval) if u_undef else None] + none
    ct_dt = get_aval(ct).dtype
    u_shape = u.aval.shape if u_undef else np.shape(u)
    if mode == "mul":
        if u_undef:
            raise NotImplementedError("scatter(mode='mul') is linear in the operand only; it "
                                      "cannot be transposed with respect to its updates")
        scale = scatter(full(x.aval.shape, 1, ct_dt), u, idx, axes, "mul")
        return [mul(ct, scale), None] + none
    if mode not in ("add", "set"):
        raise NotImplementedError(f"scatter(mode={mode!r}) is not linear: no transpose")
    ct_x = ct_u = None
    if x_undef:
        # set: the overwritten positions receive nothing from x.
        ct_x = ct if mode == "add" else scatter(ct, zeros(u_shape, ct_dt), idx, axes, "set")
    if u_undef:
        # Dropped (out-of-bounds) updates get a zero cotangent: gather with fill 0.
        ct_u = gather(ct, idx, axes, "fill", None)
    return [ct_x, ct_u] + none


@scatter_p.def_batch
def _scatter_batch(args, dims, *, axes, mode):
    (x, u, *idx), (xd, ud, *idims) = args, dims
    n = batching.bdim_size(args, dims)
    x = batching.broadcast_batch(x, xd, n)
    shifted = tuple(a + 1 for a in axes)
    if all(d is None for d in idims):
        # x's batch axis is its first non-indexed dim, so in updates it follows B.
        b_rank = len(np.shape(idx[0]))
        u = batching.broadcast_batch(u, ud, n)
        return scatter(x, batching.move_axis(u, 0, b_rank), idx, shifted, mode), 0
    idx = [batching.broadcast_batch(i, d, n) for i, d in zip(idx, idims)]
    u = batching.broadcast_batch(u, ud, n)
    batch_idx = iota(get_aval(idx[0]).dtype, np.shape(idx[0]), 0)
    return scatter(x, u, [batch_idx] + idx, (0,) + shifted, mode), 0
