"""Flipping, tiling, repeating, rolling and padding arrays (numpy semantics).

Each function is a thin composition of the structural primitives (``rev``,
``concatenate``, ``pad``, ``reshape``, ``broadcast_in_dim``); all sizes and axes are
static (``repeat`` with traced counts needs ``total_repeat_length``).

>>> import spmd.numpy as snp
>>> snp.tile(snp.array([1, 2]), 2)
Array([1, 2, 1, 2], dtype=int32)
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import to_host
from spmd.compiler.core.trace import get_aval
from spmd.compiler.ops import slicing as sm, structural as st
from spmd.compiler.ops.elementwise import convert
from spmd.errors import ArgumentError, ShapeError
from spmd.numpy._shape import ravel, reshape
from spmd.numpy._util import (canonicalize_axes, canonicalize_axis, require_static, static_int,
                              static_shape, to_array)

__all__ = ["flip", "fliplr", "flipud", "pad", "repeat", "roll", "tile"]


def flip(m, axis=None):
    """Reverse the order of elements along ``axis`` (all axes when None)."""
    x = to_array(m)
    return sm.rev(x, canonicalize_axes(axis, get_aval(x).ndim, "spmd.numpy.flip"))


def fliplr(m):
    return flip(m, 1)


def flipud(m):
    return flip(m, 0)


def tile(A, reps):
    """Repeat the whole array ``reps`` times along each axis.

    >>> tile(arange(2), (2, 2)).shape
    (2, 4)
    """
    x = to_array(A)
    reps = static_shape(reps, "spmd.numpy.tile", "reps")
    shape = get_aval(x).shape
    nd = max(len(reps), len(shape))
    shape = (1,) * (nd - len(shape)) + shape
    reps = (1,) * (nd - len(reps)) + reps
    # (r0, s0, r1, s1, ...): a broadcast along new axes, then merge each pair.
    x = st.reshape(x, shape)
    big = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    x = st.broadcast_in_dim(x, big, tuple(range(1, 2 * nd, 2)))
    return st.reshape(x, tuple(r * s for r, s in zip(reps, shape)))


def repeat(a, repeats, axis=None, *, total_repeat_length=None):
    """Repeat each element ``repeats`` times (an int, or a sequence per element).

    With ``total_repeat_length`` (a static int) ``repeats`` may be traced, and the result
    has that length, as in JAX: cut short when the repeats sum to more, the last element
    repeated when they sum to less.

    >>> repeat(snp.arange(3.0), r, total_repeat_length=6)  # doctest: +SKIP
    """
    x = to_array(a)
    if axis is None:
        x, axis = ravel(x), 0
    shape = get_aval(x).shape
    ax = canonicalize_axis(axis, len(shape), "spmd.numpy.repeat")
    if total_repeat_length is not None:
        return _repeat_to_length(x, repeats, ax, total_repeat_length)
    require_static(repeats, "spmd.numpy.repeat", "repeats", "int or sequence of ints")
    if isinstance(repeats, (list, tuple)):
        repeats = [static_int(r, "spmd.numpy.repeat", "repeats") for r in repeats]
    reps = to_host(repeats.value if isinstance(repeats, Array) else repeats).reshape(-1)
    if reps.size == 1:
        r = int(reps[0])
        inner = shape[:ax + 1] + (r,) + shape[ax + 1:]
        y = st.broadcast_in_dim(x, inner, tuple(i for i in range(len(inner)) if i != ax + 1))
        out = st.reshape(y, shape[:ax] + (shape[ax] * r,) + shape[ax + 1:])
    else:
        if reps.size != shape[ax]:
            raise ShapeError(f"spmd.numpy.repeat: {reps.size} repeats for an axis of size "
                             f"{shape[ax]}")
        parts = []
        for i, r in enumerate(reps):
            piece = sm.slice_in_dim(x, i, i + 1, 1, ax)
            parts.append(st.broadcast_in_dim(piece, shape[:ax] + (int(r),) + shape[ax + 1:],
                                             tuple(range(len(shape)))))
        out = sm.concatenate(parts, ax) if parts else st.reshape(x, shape)
    return out


def _repeat_to_length(x, repeats, ax: int, total):
    """``repeat`` to a static length, ``repeats`` static or traced: output position p
    takes the element whose block of repeats holds p (a scatter of ones at the blocks'
    starts, summed: each block's start counts one more element)."""
    import spmd.numpy as snp  # siblings through their package (no import circle)

    total = static_int(total, "spmd.numpy.repeat", "total_repeat_length")
    if total < 0:
        raise ArgumentError(f"spmd.numpy.repeat: total_repeat_length={total} must be >= 0")
    shape = get_aval(x).shape
    n = shape[ax]
    reps = to_array(repeats)
    if get_aval(reps).dtype.kind not in "iu":
        raise ArgumentError(f"spmd.numpy.repeat: repeats must be integers, got "
                            f"{get_aval(reps).dtype}")
    reps = ravel(convert(reps, np.dtype(np.int32)))
    if get_aval(reps).shape[0] not in (1, n):
        raise ShapeError(f"spmd.numpy.repeat: {get_aval(reps).shape[0]} repeats for an axis "
                         f"of size {n}")
    if total == 0 or n == 0:
        return snp.zeros(shape[:ax] + (total if n else 0,) + shape[ax + 1:], get_aval(x).dtype)
    reps = st.broadcast_in_dim(reps, (n,), (0,)) if get_aval(reps).shape[0] != n else reps
    starts = snp.cumsum(reps) - reps  # where each element's block begins
    marks = snp.zeros((total,), np.int32).at[starts].add(np.int32(1), mode="drop")
    return snp.take(x, snp.cumsum(marks) - 1, axis=ax)


def roll(a, shift, axis=None):
    """Shift elements cyclically along ``axis`` (of the flattened array when None)."""
    x = to_array(a)
    require_static(shift, "spmd.numpy.roll", "shift", "int or sequence of ints")
    if isinstance(shift, (list, tuple)):
        shift = [static_int(s, "spmd.numpy.roll", "shift") for s in shift]
    if axis is None:
        shape = get_aval(x).shape
        return reshape(roll(ravel(x), shift, 0), shape)
    shifts = np.broadcast_to(to_host(shift), np.shape(axis)).reshape(-1)
    axes = np.asarray(axis).reshape(-1)
    if shifts.size != axes.size:
        raise ArgumentError(f"spmd.numpy.roll: shift {shift} and axis {axis} do not match")
    nd = get_aval(x).ndim
    for s, ax in zip(shifts, axes):
        ax = canonicalize_axis(ax, nd, "spmd.numpy.roll")
        n = get_aval(x).shape[ax]
        s = int(s) % n if n else 0
        if s:
            x = sm.concatenate([sm.slice_in_dim(x, n - s, n, 1, ax),
                                sm.slice_in_dim(x, 0, n - s, 1, ax)], ax)
    return x


def _static_nested(x, fname, argname):
    """Nested sequences of static ints (traced entries raise ConcretizationError)."""
    if isinstance(x, (list, tuple)):
        return [_static_nested(e, fname, argname) for e in x]
    require_static(x, fname, argname, "int or sequence of int pairs")
    return to_host(x.value if isinstance(x, Array) else x)


def pad(array, pad_width, mode: str = "constant", constant_values=0):
    """Pad with a constant (numpy's ``mode='constant'``; other modes are not supported).

    >>> pad(ones(2), 1).shape
    (4,)
    """
    if mode != "constant":
        raise NotImplementedError(f"spmd.numpy.pad: mode={mode!r} is not supported; only "
                                  "mode='constant'")
    x = to_array(array)
    av = get_aval(x)
    require_static(pad_width, "spmd.numpy.pad", "pad_width", "int or sequence of int pairs")
    widths = np.asarray(_static_nested(pad_width, "spmd.numpy.pad", "pad_width"), dtype=np.int64)
    try:
        widths = np.broadcast_to(widths.reshape(widths.shape or (1,)) if widths.ndim < 2
                                 else widths, (av.ndim, 2))
    except ValueError:
        raise ShapeError(f"spmd.numpy.pad: pad_width {pad_width} does not fit an array of "
                         f"{av.ndim} dimensions (give an int, a (before, after) pair or one "
                         "pair per axis)") from None
    if (widths < 0).any():
        raise ArgumentError(f"spmd.numpy.pad: pad_width must be >= 0, got {pad_width}")
    if np.ndim(constant_values) != 0:
        raise NotImplementedError("spmd.numpy.pad: only a scalar constant_values is supported")
    value = to_array(constant_values)
    value = convert(value, av.dtype, av.weak_type)
    return sm.pad(x, value, tuple((int(lo), int(hi), 0) for lo, hi in widths))
