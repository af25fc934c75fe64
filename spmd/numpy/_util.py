"""Shared helpers of the numpy front end: conversion, promotion, broadcasting, axes."""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import is_device_array, to_device
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.ops.elementwise import convert
from spmd.compiler.ops.structural import broadcast_in_dim
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError, ConcretizationError, DTypeError, ShapeError


def is_traced_or_array(x) -> bool:
    return isinstance(x, (Tracer, Array))


def to_array(x, dtype=None, fname: str = "spmd.numpy"):
    """Turn any array-like (nested lists too) into an Array or tracer.

    Python scalars keep their weak type; numpy values are canonicalised.
    """
    if isinstance(x, (Tracer, Array)):
        return x if dtype is None else convert(x, dtypes.canonicalize(dtype, fname))
    if isinstance(x, (bool, int, float, complex)) and dtype is None:
        aval = get_aval(x)
        return Array(np.asarray(x, dtype=aval.dtype), aval)
    if isinstance(x, (list, tuple)) and any(is_traced_or_array(e) for e in _flat(x)):
        from spmd.numpy._shape import stack  # here: spmd.numpy._shape imports this module

        return stack([to_array(e, dtype, fname) for e in x])
    if isinstance(x, type):  # snp.float32 itself (numpy would make an object array)
        raise DTypeError(f"{fname}: got the type {x!r} where a value is expected; a scalar "
                         "type is not an array: call it on a value (snp.float32(x)) or pass "
                         "it as dtype=")
    if is_device_array(x):  # a GPU (cupy) array: it stays on (this process's) GPU
        target = dtypes.canonicalize(x.dtype if dtype is None else dtype, fname)
        check_keeps_imag(x.dtype, target, fname)
        return Array(to_device(x, target), ShapedArray(x.shape, target, False))
    arr = np.asarray(x)
    if arr.dtype == object or arr.dtype.kind in "USVc":
        dtypes.check_dtype(arr.dtype, fname)
    if dtype is not None:
        target = dtypes.canonicalize(dtype, fname)
    elif arr.dtype == np.float64 and not isinstance(x, np.ndarray) and not isinstance(x, np.generic):
        target = dtypes.default_float()  # Python floats in lists are float32 by default
    else:
        target = dtypes.canonicalize(arr.dtype, fname)
    check_keeps_imag(arr.dtype, target, fname)
    arr = np.asarray(arr, dtype=target)
    return Array(arr, ShapedArray(arr.shape, target, False))


def check_keeps_imag(src, target, fname: str) -> None:
    """Refuse a complex -> real conversion: it would drop the imaginary part."""
    if dtypes.is_complex(src) and not dtypes.is_complex(target):
        raise DTypeError(f"{fname}: converting complex values ({np.dtype(src)}) to {target} "
                         "would drop the imaginary part; take snp.real, snp.imag or snp.abs "
                         "first")


def _flat(x):
    for e in x:
        if isinstance(e, (list, tuple)):
            yield from _flat(e)
        else:
            yield e


def check_arraylike(fname: str, *args) -> None:
    """Raise ``TypeError`` for a list or tuple operand, as JAX does: an operand must be
    an array or a scalar (``spmd.numpy.asarray`` converts a sequence explicitly, so
    that a large Python list is never converted silently on every call)."""
    for i, a in enumerate(args):
        if isinstance(a, (list, tuple)):
            raise TypeError(f"{fname} requires ndarray or scalar arguments, got "
                            f"{type(a).__name__} at position {i}; convert it with "
                            f"spmd.numpy.asarray(...) first (as JAX requires)")


def checked_array(a, fname: str):
    """``a`` as an Array or tracer, after :func:`check_arraylike` (never a list).

    >>> checked_array(2.0, "spmd.numpy.diag").shape
    ()
    """
    check_arraylike(fname, a)
    return to_array(a, fname=fname)


def promote_dtypes(*args, fname: str = "spmd.numpy"):
    """Convert ``args`` to their common dtype (weak types follow JEP 9407); list and
    tuple operands raise ``TypeError`` (:func:`check_arraylike`)."""
    check_arraylike(fname, *args)
    arrs = [to_array(a, fname=fname) for a in args]
    avals = [get_aval(a) for a in arrs]
    dtype, weak = dtypes.result_type(*[(a.dtype, a.weak_type) for a in avals])
    return [convert(a, dtype, weak) if (av.dtype != dtype or av.weak_type != weak) else a
            for a, av in zip(arrs, avals)]


def promote_to_float(*args, fname: str = "spmd.numpy"):
    """Promote, then make integers and bools floating (for sqrt, exp, true divide...)."""
    arrs = promote_dtypes(*args, fname=fname)
    av = get_aval(arrs[0])
    if dtypes.is_inexact(av.dtype):
        return arrs
    return [convert(a, dtypes.default_float(), av.weak_type) for a in arrs]


def broadcast_shapes(*shapes, fname: str = "spmd.numpy") -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{fname}: operand shapes {' and '.join(map(str, shapes))} cannot be "
                         "broadcast together (numpy broadcasting rules)") from None


def broadcast_to_shape(x, shape):
    xs = np.shape(x)
    if xs == tuple(shape):
        return x
    nd = len(shape)
    return broadcast_in_dim(x, shape, tuple(range(nd - len(xs), nd)))


def promote_and_broadcast(*args, fname: str, to_float: bool = False):
    """Promote dtypes, then broadcast non-scalars to a common shape.

    Scalars (shape ``()``) stay scalars: the lax primitives broadcast them.
    """
    arrs = (promote_to_float if to_float else promote_dtypes)(*args, fname=fname)
    shapes = [np.shape(a) for a in arrs]
    if all(s == shapes[0] for s in shapes):
        return arrs
    shape = broadcast_shapes(*shapes, fname=fname)
    return [a if np.shape(a) == () else broadcast_to_shape(a, shape) for a in arrs]


def require_static(value, fname: str, argname: str, what: str = "int") -> None:
    """Raise :class:`ConcretizationError` if ``value`` is traced (it must decide a shape).

    >>> require_static(3, "spmd.numpy.zeros", "shape")  # concrete values pass
    """
    if isinstance(value, Tracer):
        raise ConcretizationError(
            f"{fname}: {argname} must be a static {what}, but got a traced value {value.aval}. "
            "It decides the structure of the result (a shape, an axis), which must be known "
            "when the function is traced: pass a Python value, or mark the argument static "
            "with spmd.jit(f, static_argnums=...) (or static_argnames=...)")


def static_int(value, fname: str, argname: str) -> int:
    """``int(value)`` for an argument that decides a shape (traced values raise)."""
    require_static(value, fname, argname)
    return int(value)


def static_shape(shape, fname: str, argname: str = "shape") -> tuple:
    """A shape argument (an int or a sequence of ints) as a tuple of Python ints.

    >>> static_shape(3, "spmd.numpy.zeros")
    (3,)
    """
    require_static(shape, fname, argname, "int or tuple of ints")
    if isinstance(shape, (int, np.integer)) or (isinstance(shape, Array) and shape.ndim == 0):
        return (int(shape),)
    return tuple(static_int(s, fname, f"{argname}[{i}]") for i, s in enumerate(shape))


def canonicalize_axis(axis, ndim: int, fname: str, argname: str = "axis") -> int:
    require_static(axis, fname, argname)
    try:
        a = int(axis)
    except TypeError:
        raise ArgumentError(f"{fname}: {argname} must be an int, got {axis!r}") from None
    if not -ndim <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
        raise ArgumentError(f"{fname}: {argname}={axis} is out of bounds for an array of "
                            f"{ndim} dimension{'s' if ndim != 1 else ''}")
    return a % ndim if ndim else 0


def canonicalize_axes(axis, ndim: int, fname: str) -> tuple:
    """``axis=None`` means all axes; ints and tuples of ints, negative allowed."""
    if axis is None:
        return tuple(range(ndim))
    require_static(axis, fname, "axis", "int or tuple of ints")
    if isinstance(axis, (tuple, list)):
        axes = tuple(canonicalize_axis(a, ndim, fname) for a in axis)
        if len(set(axes)) != len(axes):
            raise ArgumentError(f"{fname}: repeated axis in axis={axis}")
        return axes
    return (canonicalize_axis(axis, ndim, fname),)
