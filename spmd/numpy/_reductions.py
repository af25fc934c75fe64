"""Reductions: sum, mean, max, min (more are added beside these)."""

from __future__ import annotations

import numpy as np

from spmd.compiler import dtypes
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import reduce as red
from spmd.compiler.ops.structural import reshape
from spmd.compiler.trace import get_aval
from spmd.numpy._util import canonicalize_axes, to_array


def _keep(out, in_shape, axes, keepdims):
    if not keepdims:
        return out
    return reshape(out, tuple(1 if i in axes else s for i, s in enumerate(in_shape)))


def sum(a, axis=None, dtype=None, keepdims: bool = False):
    """Sum over ``axis`` (None: all); bools and small ints sum in the default int."""
    x = to_array(a)
    av = get_aval(x)
    if dtype is not None:
        x = ew.convert(x, dtypes.canonicalize(dtype, "spmd.numpy.sum"))
    elif dtypes.is_bool(av.dtype) or (dtypes.is_int(av.dtype) and av.dtype.itemsize < 4):
        x = ew.convert(x, dtypes.default_int() if av.dtype.kind != "u" else
                       (dtypes.uint64 if dtypes.x64_enabled() else dtypes.uint32))
    axes = canonicalize_axes(axis, av.ndim, "spmd.numpy.sum")
    return _keep(red.reduce_sum(x, axes), av.shape, axes, keepdims)


def mean(a, axis=None, dtype=None, keepdims: bool = False):
    x = to_array(a)
    av = get_aval(x)
    axes = canonicalize_axes(axis, av.ndim, "spmd.numpy.mean")
    n = int(np.prod([av.shape[i] for i in axes], dtype=np.int64))
    out_dtype = dtypes.canonicalize(dtype, "spmd.numpy.mean") if dtype is not None else (
        av.dtype if dtypes.is_float(av.dtype) else dtypes.default_float())
    s = sum(ew.convert(x, out_dtype, av.weak_type), axis=axes, keepdims=keepdims)
    return ew.div(s, np.array(n, out_dtype)[()])


def _minmax(red_fn, name):
    def f(a, axis=None, keepdims: bool = False, initial=None, where=None):
        if where is not None:
            raise NotImplementedError(f"spmd.numpy.{name}: where= is not supported")
        x = to_array(a)
        av = get_aval(x)
        axes = canonicalize_axes(axis, av.ndim, f"spmd.numpy.{name}")
        if any(av.shape[i] == 0 for i in axes) and initial is None:
            raise ValueError(f"spmd.numpy.{name}: zero-size reduction without an initial value")
        out = _keep(red_fn(x, axes), av.shape, axes, keepdims)
        if initial is not None:
            from spmd.numpy._elementwise import maximum, minimum
            out = (maximum if name == "max" else minimum)(out, initial)
        return out

    f.__name__ = name
    return f


max = amax = _minmax(red.reduce_max, "max")
min = amin = _minmax(red.reduce_min, "min")
