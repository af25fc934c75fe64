"""The scalar types ``spmd.numpy`` exports (``float32``, ``int8``, ``bool_``, ...).

As in ``jax.numpy`` each name is both a dtype and a constructor: calling it
converts any array-like (Python scalars, lists, numpy values, ``Array``s and
tracers under ``jit``/``grad``/``vmap``/``shard_map``) to an ``Array`` of that
dtype, like ``asarray(x, dtype)``; 64-bit types are narrowed to 32 bits unless
x64 mode is on.  Wherever a dtype is expected (``np.dtype(snp.float32)``,
``x.astype(snp.float32)``, ``snp.zeros(3, snp.float32)``, ``issubdtype``,
``x.dtype == snp.float32``) the type stands for its numpy dtype, through the
``dtype`` attribute numpy reads and an equality/hash equal to numpy's type.

numpy's own scalar classes cannot be used for this: calling ``np.float32(x)``
on a tracer asks numpy for the tracer's value, which does not exist.

>>> import spmd.numpy as snp
>>> snp.float32([1, 2])
Array([1., 2.], dtype=float32)
>>> snp.dtype(snp.int8)
dtype('int8')
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spmd.compiler.core import dtypes
from spmd.numpy._util import to_array


class _ScalarMeta(type):
    """The metaclass of the scalar types: the class itself converts and compares."""

    dtype: np.dtype

    def __hash__(cls) -> int:
        return hash(cls.dtype.type)  # a dict keyed by np.float32 finds snp.float32

    def __eq__(cls, other: Any) -> bool:
        return cls is other or cls.dtype.type == other

    def __ne__(cls, other: Any) -> bool:
        return not cls == other

    def __call__(cls, x: Any):
        """``x`` converted to this dtype (an ``Array``; a tracer when traced)."""
        return to_array(x, cls.dtype, f"spmd.numpy.{cls.__name__}")

    def __instancecheck__(cls, instance: Any) -> bool:
        # numpy scalars of the type are instances (JAX's rule); Arrays are not.
        return isinstance(instance, cls.dtype.type)

    def __repr__(cls) -> str:
        return f"<class 'spmd.numpy.{cls.__name__}'>"


def _make(np_type: type, name: str | None = None) -> _ScalarMeta:
    name = name or np_type.__name__
    doc = (f"The ``{name}`` scalar type: a dtype, and a constructor: ``{name}(x)`` is "
           f"``asarray(x, {name})`` (any array-like, traced values too).")
    return _ScalarMeta(name, (object,), {"dtype": np.dtype(np_type), "__doc__": doc,
                                         "__module__": "spmd.numpy"})


bool_ = _make(np.bool_, "bool_")
int8, int16, int32, int64 = (_make(t) for t in (np.int8, np.int16, np.int32, np.int64))
uint8, uint16, uint32, uint64 = (_make(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
float16, float32, float64 = (_make(t) for t in (np.float16, np.float32, np.float64))
complex64, complex128 = _make(np.complex64), _make(np.complex128)
# The narrow floats come with ml_dtypes; they compute in float32 and round each result.
bfloat16 = None if dtypes.bfloat16 is None else _make(dtypes.bfloat16.type, "bfloat16")
float8_e4m3fn = None if dtypes.float8_e4m3fn is None else \
    _make(dtypes.float8_e4m3fn.type, "float8_e4m3fn")
float8_e5m2 = None if dtypes.float8_e5m2 is None else _make(dtypes.float8_e5m2.type, "float8_e5m2")

__all__ = ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"]
__all__ += [n for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2") if globals()[n] is not None]
