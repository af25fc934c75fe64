"""Array creation: array, asarray, zeros, ones, full, arange (more beside these)."""

from __future__ import annotations

import numpy as np

from spmd.collectives.api import pvary
from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import is_device_array, to_host
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import structural as st
from spmd.compiler.ops.elementwise import convert
from spmd.compiler.ops.slicing import concatenate, slice_in_dim
from spmd.compiler.core.trace import get_aval
from spmd.errors import ArgumentError
from spmd.shard.explicit.modes import with_out_sharding
from spmd.numpy._elementwise import add, multiply, subtract
from spmd.numpy._shape import expand_dims
from spmd.numpy._util import (broadcast_shapes, broadcast_to_shape, check_keeps_imag,
                              is_traced_or_array, promote_to_float, require_static, static_int,
                              static_shape, to_array)

__all__ = ["array", "asarray", "full", "zeros", "ones", "arange", "astype", "empty",
           "zeros_like", "ones_like", "full_like", "empty_like", "linspace", "eye",
           "identity", "tri", "copy"]


def array(object, dtype=None, copy: bool = True):
    """A new array from array-like data (nested lists, numpy arrays, scalars)."""
    out = to_array(object, dtype, "spmd.numpy.array")
    if is_traced_or_array(object) and out is object and dtype is None:
        return out
    return out


def asarray(a, dtype=None):
    return to_array(a, dtype, "spmd.numpy.asarray")


def _shape(shape, fname):
    return static_shape(shape, f"spmd.numpy.{fname}")


def _dtype(dtype, default):
    return dtypes.canonicalize(dtype, "spmd.numpy") if dtype is not None else default


def _placed(x, out_sharding, where):
    """``x`` with the sharding ``out_sharding`` (None: as it is)."""
    if out_sharding is None:
        return x
    return with_out_sharding(lambda: x, (), out_sharding, where)


def full(shape, fill_value, dtype=None, *, out_sharding=None):
    fv = to_array(fill_value)
    dt = _dtype(get_aval(fv).dtype if dtype is None else dtype, dtypes.default_float())
    check_keeps_imag(get_aval(fv).dtype, dt, "spmd.numpy.full")
    return _placed(st.full(_shape(shape, "full"), fill_value, dt), out_sharding,
                   "spmd.numpy.full")


def zeros(shape, dtype=None, *, out_sharding=None):
    """Zeros; ``out_sharding``: the result's sharding (a PartitionSpec on the current
    mesh, or a NamedSharding)."""
    return _placed(st.full(_shape(shape, "zeros"), 0, _dtype(dtype, dtypes.default_float())),
                   out_sharding, "spmd.numpy.zeros")


def ones(shape, dtype=None, *, out_sharding=None):
    return _placed(st.full(_shape(shape, "ones"), 1, _dtype(dtype, dtypes.default_float())),
                   out_sharding, "spmd.numpy.ones")


def arange(start, stop=None, step=None, dtype=None, *, out_sharding=None):
    """Evenly spaced values; the bounds must be concrete (they decide the shape).
    ``out_sharding``: the result's sharding, as for :func:`zeros`.

    >>> arange(4, dtype="float32").tolist()
    [0.0, 1.0, 2.0, 3.0]"""
    return _placed(_arange(start, stop, step, dtype), out_sharding, "spmd.numpy.arange")


def _arange(start, stop, step, dtype):
    for v, argname in ((start, "start"), (stop, "stop"), (step, "step")):
        require_static(v, "spmd.numpy.arange", argname, "number")
    # CuPy scalars (0-d device arrays) to host values: numpy cannot read them.
    start, stop, step = (to_host(v)[()] if is_device_array(v) else v
                         for v in (start, stop, step))
    ref = np.arange(start, stop, step) if stop is not None or step is not None else np.arange(start)
    if dtype is None:
        dtype = dtypes.default_int() if ref.dtype.kind in "iu" else dtypes.default_float()
    dtype = dtypes.canonicalize(dtype, "spmd.numpy.arange")
    if ref.dtype.kind in "iu" and step in (None, 1) and (start == 0 or stop is None):
        return st.iota(dtype, ref.shape[0])
    return to_array(ref.astype(dtype))


def astype(x, dtype):
    """``x`` converted to ``dtype`` (64-bit types narrowed unless x64 is on)."""
    return convert(to_array(x), dtypes.canonicalize(dtype, "spmd.numpy.astype"))


def copy(a, order=None):
    """A copy of ``a`` (a new buffer for concrete arrays; traced values are values)."""
    if order not in (None, "K", "C", "A"):
        raise ArgumentError(f"spmd.numpy.copy: order={order!r} is not supported; arrays are "
                            "C-ordered")
    x = to_array(a, fname="spmd.numpy.copy")
    if isinstance(x, Array) and x is a:
        return x.copy()
    return x


def empty(shape, dtype=None, *, out_sharding=None):
    """Like :func:`zeros` (arrays are immutable, so there is nothing to leave uninitialised)."""
    return zeros(shape, dtype, out_sharding=out_sharding)


def _like(fname, a, fill_value, dtype, shape):
    """An array filled with ``fill_value``, taking dtype (and weak type) and shape from ``a``."""
    av = get_aval(to_array(a, fname=fname))
    weak = dtype is None and av.weak_type
    dt = _dtype(dtype, av.dtype)
    shape = av.shape if shape is None else _shape(shape, fname.rsplit(".", 1)[-1])
    out = st.full(shape, fill_value, dt, weak_type=weak)
    if av.vma:
        # Inside shard_map the result varies as ``a`` does (as JAX's full_like): a
        # zeros_like(x) in a custom rule is then of x's type, not an invariant value.
        out = pvary(out, tuple(sorted(av.vma)))
    return out


def zeros_like(a, dtype=None, shape=None):
    """Zeros with ``a``'s shape and dtype (its values are not read).

    >>> zeros_like(ones((2, 3), dtype=int32)).dtype
    dtype('int32')
    """
    return _like("spmd.numpy.zeros_like", a, 0, dtype, shape)


def ones_like(a, dtype=None, shape=None):
    """Ones with ``a``'s shape and dtype."""
    return _like("spmd.numpy.ones_like", a, 1, dtype, shape)


def full_like(a, fill_value, dtype=None, shape=None):
    """``fill_value`` (cast to ``a``'s dtype unless ``dtype`` is given) with ``a``'s shape."""
    return _like("spmd.numpy.full_like", a, fill_value, dtype, shape)


def empty_like(prototype, dtype=None, shape=None):
    """Like :func:`zeros_like`."""
    return zeros_like(prototype, dtype, shape)


def linspace(start, stop, num: int = 50, endpoint: bool = True, retstep: bool = False,
             dtype=None, axis: int = 0):
    """``num`` evenly spaced values from ``start`` to ``stop`` (float32 by default).

    >>> linspace(0, 1, 5)
    Array([0.  , 0.25, 0.5 , 0.75, 1.  ], dtype=float32)
    """
    num = _static_count(num, "spmd.numpy.linspace", "num")
    dt = _dtype(dtype, None)
    if _is_concrete(start) and _is_concrete(stop):
        # Concrete bounds: numpy computes in float64, then one rounding to the dtype.
        lo, hi = np.asarray(_value(start)), np.asarray(_value(stop))
        out_dtype = dt or dtypes.default_float()
        vals, step = np.linspace(lo, hi, num, endpoint=endpoint, retstep=True,
                                 dtype=out_dtype, axis=axis)
        out = to_array(vals, out_dtype)
        return (out, step) if retstep else out
    return _traced_linspace(start, stop, num, endpoint, retstep, dt, axis)


def _is_concrete(x):
    return not is_traced_or_array(x) or isinstance(x, Array)


def _value(x):
    return to_host(x.value if isinstance(x, Array) else x)


def _traced_linspace(start, stop, num, endpoint, retstep, dt, axis):
    """linspace of traced bounds: ``start * (1 - t) + stop * t`` with ``t = i / div``."""
    lo, hi = promote_to_float(start, stop, fname="spmd.numpy.linspace")
    shape = broadcast_shapes(get_aval(lo).shape, get_aval(hi).shape, fname="spmd.numpy.linspace")
    lo, hi = broadcast_to_shape(lo, shape), broadcast_to_shape(hi, shape)
    fdt = get_aval(lo).dtype
    div = (num - 1) if endpoint else num
    t = st.iota(fdt, num)
    if div > 0:
        t = multiply(t, np.array(1.0 / div, fdt)[()]) if num > 1 else t
    ax = axis % (len(shape) + 1)
    out_shape = shape[:ax] + (num,) + shape[ax:]
    t = st.broadcast_in_dim(t, out_shape, (ax,))
    lo_b, hi_b = (st.broadcast_in_dim(expand_dims(v, ax), out_shape, tuple(range(len(out_shape))))
                  for v in (lo, hi))
    out = add(lo_b, multiply(subtract(hi_b, lo_b), t))
    if endpoint and num > 1:
        # The last sample is exactly `stop`, as in numpy.
        out = concatenate([slice_in_dim(out, 0, num - 1, 1, ax), expand_dims(hi, ax)], ax)
    if dt is not None:
        out = convert(out, dt)
    step = multiply(subtract(hi, lo), np.array(1.0 / div, fdt)[()]) if div > 0 else \
        np.array(np.nan, fdt)[()]
    return (out, step) if retstep else out


def _static_count(n, fname, argname):
    n = static_int(n, fname, argname)
    if n < 0:
        raise ValueError(f"{fname}: {argname}={n} must be non-negative")
    return n


def eye(N: int, M: int | None = None, k: int = 0, dtype=None):
    """A 2-d array with ones on the ``k``-th diagonal and zeros elsewhere.

    >>> eye(2)
    Array([[1., 0.],
           [0., 1.]], dtype=float32)
    """
    N = _static_count(N, "spmd.numpy.eye", "N")
    M = N if M is None else _static_count(M, "spmd.numpy.eye", "M")
    return _diagonal_mask(N, M, static_int(k, "spmd.numpy.eye", "k"), "eq", _dtype(dtype, dtypes.default_float()))


def identity(n: int, dtype=None):
    """The ``n`` x ``n`` identity matrix."""
    return eye(n, dtype=dtype)


def tri(N: int, M: int | None = None, k: int = 0, dtype=None):
    """Ones at and below the ``k``-th diagonal, zeros above."""
    N = _static_count(N, "spmd.numpy.tri", "N")
    M = N if M is None else _static_count(M, "spmd.numpy.tri", "M")
    return _diagonal_mask(N, M, static_int(k, "spmd.numpy.tri", "k"), "ge", _dtype(dtype, dtypes.default_float()))


def _diagonal_mask(N, M, k, cmp, dtype):
    """``row + k (cmp) col`` as ``dtype``, computed from iotas (no constant is captured)."""
    idt = dtypes.default_int()
    rows = st.iota(idt, (N, M), 0)
    cols = st.iota(idt, (N, M), 1)
    if k:
        rows = ew.add(rows, np.array(k, idt)[()])
    return convert(getattr(ew, cmp)(rows, cols), dtype)
