"""Reductions, scans and sorting: sum, mean, prod, max, min, argmax, argmin, var,
std, any, all, ptp, cumsum, cumprod, sort, argsort (numpy signatures, JAX dtypes).

Result dtypes follow JAX: sums and products of bools and small integers are in
the default int (int32), means/variances of integers in the default float
(float32), ``any``/``all`` are bool, ``argmax``/``argsort`` give the default int.
"""

from __future__ import annotations

import functools

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.ops import complex as cx
from spmd.compiler.ops import cumulative as cm
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import reduce as red
from spmd.compiler.ops import sort as _sort
from spmd.compiler.ops.slicing import rev
from spmd.compiler.ops.structural import broadcast_in_dim as _bid
from spmd.compiler.ops.structural import reshape
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError as _ArgumentError
from spmd.numpy._util import canonicalize_axes, canonicalize_axis, check_arraylike, to_array

__all__ = ["sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "var",
           "std", "any", "all", "ptp", "cumsum", "cumprod", "sort", "argsort"]


def _keep(out, in_shape, axes, keepdims):
    if not keepdims:
        return out
    return reshape(out, tuple(1 if i in axes else s for i, s in enumerate(in_shape)))


def _no_out(out, fname):
    if out is not None:
        raise _ArgumentError(f"{fname}: out= is not supported (arrays are immutable); use the "
                             "returned value")


def _sum_dtype(x, dtype, fname):
    """``x`` converted to the dtype a sum/product accumulates in (JAX's rules)."""
    av = get_aval(x)
    if dtype is not None:
        return ew.convert(x, dtypes.canonicalize(dtype, fname))
    if dtypes.is_bool(av.dtype) or (dtypes.is_int(av.dtype) and av.dtype.itemsize < 4):
        return ew.convert(x, dtypes.default_int() if av.dtype.kind != "u" else
                          (dtypes.uint64 if dtypes.x64_enabled() else dtypes.uint32))
    return x


def sum(a, axis=None, dtype=None, out=None, keepdims: bool = False):
    """Sum over ``axis`` (None: all); bools and small ints sum in the default int.

    >>> sum(np.ones((2, 3)), axis=0)  # doctest: +SKIP
    Array([2., 2., 2.], dtype=float32)
    """
    _no_out(out, "spmd.numpy.sum")
    x = to_array(a)
    av = get_aval(x)
    axes = canonicalize_axes(axis, av.ndim, "spmd.numpy.sum")
    x = _sum_dtype(x, dtype, "spmd.numpy.sum")
    return _keep(red.reduce_sum(x, axes), av.shape, axes, keepdims)


def prod(a, axis=None, dtype=None, out=None, keepdims: bool = False):
    """Product over ``axis`` (None: all); dtypes as :func:`sum`.

    >>> prod(np.array([1, 2, 3]))  # doctest: +SKIP
    Array(6, dtype=int32)
    """
    _no_out(out, "spmd.numpy.prod")
    x = to_array(a)
    av = get_aval(x)
    axes = canonicalize_axes(axis, av.ndim, "spmd.numpy.prod")
    x = _sum_dtype(x, dtype, "spmd.numpy.prod")
    return _keep(cm.reduce_prod(x, axes), av.shape, axes, keepdims)


def _count(shape, axes) -> int:
    return int(np.prod([shape[i] for i in axes], dtype=np.int64))


def _float_dtype(av, dtype, fname):
    if dtype is not None:
        return dtypes.canonicalize(dtype, fname)
    return av.dtype if dtypes.is_inexact(av.dtype) else dtypes.default_float()


def mean(a, axis=None, dtype=None, out=None, keepdims: bool = False):
    """Arithmetic mean over ``axis``; integers and bools average in the default float.

    >>> mean(np.array([1, 2]))  # doctest: +SKIP
    Array(1.5, dtype=float32)
    """
    _no_out(out, "spmd.numpy.mean")
    x = to_array(a)
    av = get_aval(x)
    axes = canonicalize_axes(axis, av.ndim, "spmd.numpy.mean")
    out_dtype = _float_dtype(av, dtype, "spmd.numpy.mean")
    cdt = dtypes.compute_dtype(out_dtype)  # bfloat16: in float32, rounded once (as JAX)
    s = sum(ew.convert(x, cdt, av.weak_type), axis=axes, keepdims=keepdims)
    m = ew.div(s, np.array(_count(av.shape, axes), cdt)[()])
    return m if cdt == out_dtype else ew.convert(m, out_dtype, av.weak_type)


def var(a, axis=None, dtype=None, out=None, ddof: int = 0, keepdims: bool = False):
    """Variance over ``axis`` with ``ddof`` delta degrees of freedom.

    Two passes (the mean, then the mean of squared deviations), so a large
    common offset does not cancel the result away.

    >>> var(np.array([1.0, 2.0, 3.0, 4.0]))  # doctest: +SKIP
    Array(1.25, dtype=float32)
    """
    _no_out(out, "spmd.numpy.var")
    x = to_array(a)
    av = get_aval(x)
    axes = canonicalize_axes(axis, av.ndim, "spmd.numpy.var")
    out_dt = _float_dtype(av, dtype, "spmd.numpy.var")
    dt = dtypes.compute_dtype(out_dt)  # bfloat16: in float32, rounded once (as JAX)
    x = ew.convert(x, dt, av.weak_type)
    n = _count(av.shape, axes)
    kept = tuple(i for i in range(av.ndim) if i not in axes)
    m = ew.div(red.reduce_sum(x, axes), np.array(n, dt)[()])
    centered = ew.sub(x, _bid(m, av.shape, kept))
    if dtypes.is_complex(dt):  # |x - m|^2, real (as numpy's var of complex)
        re, im = cx.real(centered), cx.imag(centered)
        dt = dtypes.real_dtype(dt)
        ss = red.reduce_sum(ew.add(ew.mul(re, re), ew.mul(im, im)), axes)
    else:
        ss = red.reduce_sum(ew.mul(centered, centered), axes)
    # numpy's divisor: never negative, so ddof >= n gives inf/nan, not a sign flip.
    if isinstance(ddof, Tracer):  # a traced ddof is fine (as in JAX): it is only data
        zero = np.array(0, dt)[()]
        divisor = ew.max(ew.sub(np.array(n, dt)[()], ew.convert(ddof, dt)), zero)
    else:
        divisor = np.array(n - ddof if n > ddof else 0, dt)[()]
    v = ew.div(ss, divisor)
    if dtypes.is_narrow_float(out_dt):  # (computed in float32: round once)
        v = ew.convert(v, out_dt, av.weak_type)
    return _keep(v, av.shape, axes, keepdims)


def std(a, axis=None, dtype=None, out=None, ddof: int = 0, keepdims: bool = False):
    """Standard deviation: ``sqrt(var(a, axis, ddof=ddof))``.

    >>> std(np.array([1.0, 3.0]))  # doctest: +SKIP
    Array(1., dtype=float32)
    """
    _no_out(out, "spmd.numpy.std")
    return ew.sqrt(var(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims))


def _as_bool(x):
    av = get_aval(x)
    if dtypes.is_bool(av.dtype):
        return x
    return ew.ne(x, np.array(0, av.dtype)[()])


def _logical(red_fn, name):
    def f(a, axis=None, out=None, keepdims: bool = False):
        _no_out(out, f"spmd.numpy.{name}")
        x = to_array(a)
        av = get_aval(x)
        axes = canonicalize_axes(axis, av.ndim, f"spmd.numpy.{name}")
        return _keep(red_fn(_as_bool(x), axes), av.shape, axes, keepdims)

    f.__name__ = name
    f.__doc__ = (f"Whether {'any' if name == 'any' else 'every'} element along ``axis`` is "
                 f"non-zero (a bool array).\n\n    >>> {name}(np.array([0, 1]))  # doctest: +SKIP")
    return f


any = _logical(red.reduce_or, "any")
all = _logical(red.reduce_and, "all")


def _minmax(red_fn, name):
    def f(a, axis=None, out=None, keepdims: bool = False, initial=None, where=None):
        _no_out(out, f"spmd.numpy.{name}")
        if where is not None:
            raise NotImplementedError(f"spmd.numpy.{name}: where= is not supported")
        x = to_array(a)
        av = get_aval(x)
        axes = canonicalize_axes(axis, av.ndim, f"spmd.numpy.{name}")
        init = None if initial is None else _initial(initial, av, f"spmd.numpy.{name}")
        if _any_empty(av.shape, axes):
            if init is None:
                raise _ArgumentError(f"spmd.numpy.{name}: zero-size reduction along "
                                     f"axis={axis} of an array of shape {av.shape} has no "
                                     "identity; pass initial=")
            # Nothing to reduce: every result element is `initial`.
            kept = tuple(s for i, s in enumerate(av.shape) if i not in axes)
            return _keep(_bid(init, kept, ()), av.shape, axes, keepdims)
        res = _keep(red_fn(x, axes), av.shape, axes, keepdims)
        if init is not None:
            combine = {("max", True): ew.bitwise_or, ("min", True): ew.bitwise_and,
                       ("max", False): ew.max, ("min", False): ew.min}
            res = combine[name, dtypes.is_bool(av.dtype)](res, init)
        return res

    f.__name__ = name
    f.__doc__ = f"The {name}imum over ``axis`` (None: all).\n\n    >>> {name}(np.array([1, 3]))"
    f.__doc__ += "  # doctest: +SKIP"
    return f


def _initial(initial, av, fname):
    """``initial`` as a scalar of the reduced array's dtype (JAX converts it so)."""
    init = to_array(initial, fname=fname)
    if get_aval(init).shape != ():
        raise _ArgumentError(f"{fname}: initial must be a scalar, got an array of shape "
                             f"{get_aval(init).shape}")
    return ew.convert(init, av.dtype, av.weak_type)


def _any_empty(shape, axes) -> bool:
    return bool([i for i in axes if shape[i] == 0])


max = amax = _minmax(red.reduce_max, "max")
min = amin = _minmax(red.reduce_min, "min")


def ptp(a, axis=None, out=None, keepdims: bool = False):
    """Peak to peak: ``max - min`` over ``axis``.

    >>> ptp(np.array([3, 1, 4]))  # doctest: +SKIP
    Array(3, dtype=int32)
    """
    _no_out(out, "spmd.numpy.ptp")
    return ew.sub(max(a, axis=axis, keepdims=keepdims), min(a, axis=axis, keepdims=keepdims))


def _arg(red_fn, name):
    def f(a, axis=None, out=None, keepdims: bool = False):
        fname = f"spmd.numpy.{name}"
        _no_out(out, fname)
        x = to_array(a)
        av = get_aval(x)
        if axis is None:  # over the flattened array
            x, ax = reshape(x, (av.size,)), 0
            kept_shape = (1,) * av.ndim
        else:
            ax = canonicalize_axis(axis, av.ndim, fname)
            kept_shape = tuple(1 if i == ax else s for i, s in enumerate(av.shape))
        if np.shape(x)[ax] == 0:
            raise _ArgumentError(f"{fname}: attempt to get {name} of an empty sequence (array "
                                 f"of shape {av.shape}, axis={axis})")
        res = red_fn(x, ax, dtypes.default_int())
        return reshape(res, kept_shape) if keepdims else res

    f.__name__ = name
    f.__doc__ = (f"Index of the first {name[3:]}imum along ``axis`` (None: of the flattened "
                 f"array).\n\n    >>> {name}(np.array([1, 3, 3]))  # doctest: +SKIP")
    return f


argmax = _arg(red.argmax, "argmax")
argmin = _arg(red.argmin, "argmin")


def _cumulative(red_fn, name):
    def f(a, axis=None, dtype=None, out=None):
        fname = f"spmd.numpy.{name}"
        _no_out(out, fname)
        x = to_array(a)
        av = get_aval(x)
        if axis is None:
            x, ax = reshape(x, (av.size,)), 0
        else:
            ax = canonicalize_axis(axis, av.ndim, fname)
            if av.ndim == 0:
                x = reshape(x, (1,))
        return red_fn(_sum_dtype(x, dtype, fname), ax)

    f.__name__ = name
    f.__doc__ = (f"Running {name[3:]} along ``axis`` (None: of the flattened array); dtypes "
                 f"as :func:`{name[3:]}`.\n\n    >>> {name}(np.array([1, 2, 3]))  # doctest: +SKIP")
    return f


cumsum = _cumulative(cm.cumsum, "cumsum")
cumprod = _cumulative(cm.cumprod, "cumprod")


def _sort_args(a, axis, kind, order, fname):
    if order is not None:
        raise _ArgumentError(f"{fname}: order= (structured arrays) is not supported")
    if kind not in (None, "stable", "quicksort", "mergesort", "heapsort"):
        raise _ArgumentError(f"{fname}: kind={kind!r} is not a sort kind; use 'stable'")
    x = to_array(a)
    av = get_aval(x)
    if axis is None:
        return reshape(x, (av.size,)), 0
    if av.ndim == 0:
        raise _ArgumentError(f"{fname}: axis={axis} is out of bounds for a 0-d array; pass "
                             "axis=None to sort it as a 1-element array")
    return x, canonicalize_axis(axis, av.ndim, fname)


def _flip(x, axis):
    return rev(x, (axis,))


def sort(a, axis=-1, kind=None, order=None, *, stable: bool = True, descending: bool = False):
    """A sorted copy of ``a`` along ``axis`` (None: flattened); NaNs sort last.

    >>> sort(np.array([3, 1, 2]))  # doctest: +SKIP
    Array([1, 2, 3], dtype=int32)
    """
    x, ax = _sort_args(a, axis, kind, order, "spmd.numpy.sort")
    res = _sort.sort(x, ax)
    return _flip(res, ax) if descending else res


def argsort(a, axis=-1, kind=None, order=None, *, stable: bool = True, descending: bool = False):
    """Indices that sort ``a`` along ``axis`` (None: flattened), stable: ties keep order.

    >>> argsort(np.array([3, 1, 2]))  # doctest: +SKIP
    Array([1, 2, 0], dtype=int32)
    """
    x, ax = _sort_args(a, axis, kind, order, "spmd.numpy.argsort")
    if not descending:
        return _sort.argsort_along(x, ax)
    # Descending and stable: sort the reversed array ascending, so equal elements
    # come out last-first; reversing that lists them first-first again.
    n = np.shape(x)[ax]
    idt = dtypes.default_int()
    idx = _flip(_sort.argsort_along(_flip(x, ax), ax, idt), ax)
    return ew.sub(np.array(n - 1, idt)[()], idx)


def _arraylike_first(fn):
    """``fn`` with JAX's check that its array operand is not a list or tuple."""
    fname = f"spmd.numpy.{fn.__name__}"

    @functools.wraps(fn)
    def checked(a, *args, **kwargs):
        check_arraylike(fname, a)
        return fn(a, *args, **kwargs)

    return checked


for _name in __all__:
    globals()[_name] = _arraylike_first(globals()[_name])
