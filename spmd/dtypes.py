"""Dtypes as ``jax.dtypes`` names them: ``float0``, the dtype of the cotangent of an
integer or bool value (``grad(..., allow_int=True)``), which holds no data.

>>> spmd.grad(lambda x, n: x * n, argnums=1, allow_int=True)(2.0, 3).dtype == float0
True
"""

from __future__ import annotations

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.compiler.core import dtypes as _dtypes
from spmd.compiler.core.dtypes import bfloat16, float0


def canonicalize_dtype(dtype) -> np.dtype:
    """The dtype spmd computes in for ``dtype`` (64-bit types become 32-bit ones unless
    64-bit mode is on, as in JAX).

    >>> canonicalize_dtype(np.float64)
    dtype('float32')
    """
    return _dtypes.canonicalize(np.dtype(dtype))


def issubdtype(a, b) -> bool:
    """``numpy.issubdtype`` (``jax.dtypes.issubdtype``; ``float0`` is a subtype of no
    number type; bfloat16 and the 8-bit floats are ``floating``)."""
    return _dtypes.issubdtype(a, b)


__all__ = ["bfloat16", "float0", "canonicalize_dtype", "issubdtype"]
