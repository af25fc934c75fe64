"""Questions about dtypes and shapes that need no computation: ``finfo``, ``iinfo``,
``issubdtype``, ``can_cast``, ``result_type``, ``promote_types``, ``ndim``, ``shape``,
``size``.

>>> import spmd.numpy as snp
>>> snp.result_type(snp.float32, 2.0), snp.shape(snp.ones((2, 3)))
(dtype('float32'), (2, 3))
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.trace import get_aval
from spmd.numpy._util import to_array

__all__ = ["can_cast", "finfo", "iinfo", "issubdtype", "ndim", "promote_types", "result_type",
           "shape", "size"]


def _dtype_of(x):
    """A dtype, a scalar type, a dtype name, or an array's dtype."""
    if isinstance(x, (type, np.dtype, str)):
        return np.dtype(x)
    return np.dtype(x.dtype)


def finfo(dtype):
    """Machine limits of a float dtype or array (``numpy.finfo``; ml_dtypes' for
    bfloat16 and the 8-bit floats): ``finfo(snp.bfloat16).eps`` is 2**-7."""
    return dtypes.finfo(_dtype_of(dtype))


def iinfo(dtype):
    """Machine limits of an integer dtype or array (``numpy.iinfo``)."""
    return np.iinfo(_dtype_of(dtype))


def issubdtype(arg1, arg2) -> bool:
    """``numpy.issubdtype`` (bfloat16 and the 8-bit floats are ``floating``, as in JAX)."""
    return dtypes.issubdtype(arg1, arg2)


def can_cast(from_, to, casting: str = "safe") -> bool:
    """``numpy.can_cast`` on dtypes."""
    return bool(np.can_cast(_dtype_of(from_), to, casting))


def result_type(*args):
    """The dtype the arguments promote to, with JAX's rules (weak Python scalars)."""
    typed = []
    for a in args:
        if isinstance(a, (type, np.dtype, str)):
            typed.append((dtypes.canonicalize(a), False))
        else:
            av = get_aval(to_array(a, fname="spmd.numpy.result_type"))
            typed.append((av.dtype, av.weak_type))
    return dtypes.result_type(*typed)[0]


def promote_types(type1, type2):
    """The dtype two dtypes promote to (JAX's table)."""
    return result_type(np.dtype(type1), np.dtype(type2))


def ndim(a) -> int:
    """The number of dimensions (traced values too)."""
    return len(shape(a))


def shape(a) -> tuple:
    """The shape (traced values too)."""
    s = getattr(a, "shape", None)
    return tuple(s) if s is not None else tuple(np.shape(a))


def size(a, axis=None) -> int:
    """The number of elements (along ``axis`` when given)."""
    s = shape(a)
    return int(np.prod(s)) if axis is None else s[axis]
