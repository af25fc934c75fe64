"""Array creation: array, asarray, zeros, ones, full, arange (more beside these)."""

from __future__ import annotations

import numpy as np

from spmd.compiler import dtypes
from spmd.compiler.ops import structural as st
from spmd.compiler.ops.elementwise import convert
from spmd.compiler.trace import get_aval
from spmd.numpy._util import is_traced_or_array, to_array


def array(object, dtype=None, copy: bool = True):
    """A new array from array-like data (nested lists, numpy arrays, scalars)."""
    out = to_array(object, dtype, "spmd.numpy.array")
    if is_traced_or_array(object) and out is object and dtype is None:
        return out
    return out


def asarray(a, dtype=None):
    return to_array(a, dtype, "spmd.numpy.asarray")


def _shape(shape):
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def _dtype(dtype, default):
    return dtypes.canonicalize(dtype, "spmd.numpy") if dtype is not None else default


def full(shape, fill_value, dtype=None):
    if dtype is None:
        fv = to_array(fill_value)
        dtype = get_aval(fv).dtype
    return st.full(_shape(shape), fill_value, _dtype(dtype, dtypes.default_float()))


def zeros(shape, dtype=None):
    return st.full(_shape(shape), 0, _dtype(dtype, dtypes.default_float()))


def ones(shape, dtype=None):
    return st.full(_shape(shape), 1, _dtype(dtype, dtypes.default_float()))


def arange(start, stop=None, step=None, dtype=None):
    """Evenly spaced values; the bounds must be concrete (they decide the shape)."""
    for v in (start, stop, step):
        if v is not None and not isinstance(v, (int, float, np.integer, np.floating)):
            from spmd.compiler.trace import Tracer
            if isinstance(v, Tracer):
                raise TypeError("spmd.numpy.arange: bounds must be concrete Python numbers "
                                "(they decide the output shape); mark them static in jit")
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
