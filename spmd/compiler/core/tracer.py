"""Tracers and the values primitives take: the aval of any bindable value, the
conversion of concrete values to and from buffers, and abstract evaluation with the
manual-axes types.  Below the traces (:mod:`spmd.compiler.core.trace`), which box
values in tracers and evaluate primitives with these.

>>> get_aval(1.0)
f32[]
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import array_module as _am
from spmd.compiler.core import dtypes
from spmd.compiler.core import manual_types as _mt
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import ShapedArray
from spmd.errors import (ConcretizationError, DTypeError, TracerBoolConversionError,
                         TracerIntegerConversionError)


# ------------------------------------------------------------------- tracers

_TRACED_HINT = ("The value is traced: its data is not known while the function is "
                "transformed (jit, grad, vmap, ...).")


class Tracer:
    """A value boxed by a trace.  Operators are installed by ``spmd.numpy``."""

    __array_priority__ = 1000
    __slots__ = ("_trace",)

    @property
    def aval(self) -> ShapedArray:
        raise NotImplementedError

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)
    size = property(lambda self: self.aval.size)
    weak_type = property(lambda self: self.aval.weak_type)
    mat = property(lambda self: self.aval.mat)  # the manual-axes type (JAX's x.mat)

    def full_lower(self):
        return self

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d traced array")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d traced array")
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self):
        raise TracerBoolConversionError(
            f"bool() of a traced array {self.aval}. {_TRACED_HINT} A Python `if`, `while`, "
            "`and`/`or` or `assert` cannot depend on it: use spmd.lax.cond / lax.switch or "
            "snp.where for a branch, lax.while_loop / lax.fori_loop for a loop, or mark the "
            "argument static with jit(..., static_argnums=...) / static_argnames=...")

    def _concrete_error(self, what):
        raise TracerIntegerConversionError(
            f"{what}() of a traced array {self.aval}. {_TRACED_HINT} Compute with the traced "
            "value (spmd.numpy / spmd.lax), or mark the argument static with "
            "jit(..., static_argnums=...) / static_argnames=... if it decides shapes or "
            "Python control flow; use lax.cond / lax.while_loop for data-dependent branches")

    def __int__(self):
        self._concrete_error("int")

    def __float__(self):
        self._concrete_error("float")

    def __complex__(self):
        self._concrete_error("complex")

    def __index__(self):
        self._concrete_error("__index__ (use as a Python integer, e.g. an index or shape) via int")

    def __array__(self, dtype=None, copy=None):
        raise ConcretizationError(
            f"np.asarray() / numpy function on a traced array {self.aval}. {_TRACED_HINT} "
            "Use spmd.numpy functions instead of numpy ones inside transformed code")

    def tolist(self):
        self._concrete_error("tolist")

    def item(self):
        self._concrete_error("item")

    __hash__ = None

    def __repr__(self):
        return f"Traced<{self.aval}>with<{type(self._trace).__name__}>"


# --------------------------------------------------------- values and avals

_SCALAR_TYPES = (bool, int, float, complex)


def get_aval(x) -> ShapedArray:
    """The aval of any value bindable to a primitive."""
    if isinstance(x, Tracer):
        return x.aval
    if isinstance(x, Array):
        return x.aval
    if isinstance(x, (np.ndarray, np.generic)):
        if x.dtype == dtypes.float0:  # a cotangent of an integer value (no data)
            return ShapedArray(x.shape, dtypes.float0, False)
        if x.dtype.kind == "V" and x.dtype not in dtypes.SUPPORTED:
            # ml_dtypes' types are of kind "V" (bfloat16 and two float8 are supported):
            # check_dtype's error names the dtype, the supported ones and the fix.
            dtypes.check_dtype(x.dtype, "spmd: tracing an array argument")
        if x.dtype == object or x.dtype.kind in "US":
            raise DTypeError(f"spmd: arrays of dtype {x.dtype} are not supported; only numeric "
                             "and bool arrays can be traced")
        return ShapedArray(x.shape, dtypes.canonicalize(x.dtype), False)
    if isinstance(x, _SCALAR_TYPES):
        return ShapedArray((), dtypes.python_scalar_dtype(x), True)
    if _am.is_device_array(x):  # a GPU array (cupy)
        return ShapedArray(x.shape, dtypes.canonicalize(x.dtype), False)
    raise DTypeError(
        f"spmd: a value of type {type(x).__name__} ({_short_repr(x)}) is not an array; pass "
        "numpy arrays, spmd Arrays or Python scalars (mark other arguments static with "
        "static_argnums)")


def typeof(x) -> ShapedArray:
    """The abstract value of ``x`` (``jax.typeof``): shape, dtype, weak type and, inside
    ``shard_map``, ``.vma``, the mesh axes along which it varies.

    >>> shard_map(lambda b: typeof(b).vma, ...)  # doctest: +SKIP
    frozenset({'i'})
    """
    return get_aval(x)


def is_array_like(x) -> bool:
    return isinstance(x, (Tracer, Array, np.ndarray, np.generic) + _SCALAR_TYPES) or \
        _am.is_device_array(x)


def _short_repr(x) -> str:
    r = repr(x)
    return r if len(r) < 60 else r[:57] + "..."


def to_array_value(x, aval: ShapedArray):
    """The raw value of a concrete argument, in its canonical dtype: a numpy array,
    or a device (cupy) array when the devices are GPUs (host values are copied there)."""
    if _am.on_device[0] or (_am._xp[0] is None and _am.current() is not np):
        return _am.to_device(x.value if isinstance(x, Array) else x, aval.dtype)
    if isinstance(x, Array):
        return x.value
    if isinstance(x, np.ndarray) and x.dtype == aval.dtype:
        return x
    return np.asarray(x, dtype=aval.dtype)


def wrap_value(v, aval: ShapedArray) -> Array:
    if not isinstance(v, np.ndarray) or v.dtype != aval.dtype:
        if type(v) in _am.device_types:  # stays in device memory
            return Array(v if v.dtype == aval.dtype else v.astype(aval.dtype), aval)
        v = np.asarray(v, dtype=aval.dtype)
    return Array(v, aval)


def abstract_eval(prim, avals_in, params) -> list[ShapedArray]:
    """Output avals, with the manual-axes rules applied (varying, and the unreduced and
    reduced types of :mod:`spmd.compiler.core.manual_types`)."""
    out = prim.abstract_eval(*avals_in, **params)
    outs = list(out) if prim.multiple_results else [out]
    marked = _mt.has_marks(avals_in)
    if prim.vma is not None:
        vmas = prim.vma(*avals_in, **params)
        if not marked and not prim.rules.manual_types:
            return [a.update(vma=v, unreduced=frozenset(), reduced=frozenset())
                    for a, v in zip(outs, vmas)]
        types = _mt.rule_types(prim, avals_in, params, len(outs))
        return [a.update(vma=frozenset(v) | u, unreduced=u, reduced=r - frozenset(v))
                for a, v, (u, r) in zip(outs, vmas, types)]
    if marked:
        vma, unred, red = _mt.default_types(prim, avals_in, params)
        return [a.update(vma=vma, unreduced=unred, reduced=red) for a in outs]
    vma = frozenset().union(*(a.vma for a in avals_in)) if avals_in else frozenset()
    return [a.update(vma=vma) if a.vma != vma or a.unreduced or a.reduced else a
            for a in outs]
