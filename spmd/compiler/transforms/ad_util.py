"""The small vocabulary that jvp and transpose rules are written in.

- :class:`Zero` is a symbolic zero tangent or cotangent: it costs nothing and
  rules must accept it for any tangent/cotangent argument.
- :class:`UndefinedPrimal` marks, in a transpose rule's arguments, the linear
  inputs whose cotangents the rule must return.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.transforms.array_ops import OPS


class Zero:
    """A symbolic zero of type ``aval`` (a tangent or cotangent that is known to be 0)."""

    __slots__ = ("aval",)

    def __init__(self, aval: ShapedArray):
        self.aval = aval

    def __repr__(self):
        return f"Zero({self.aval})"


class UndefinedPrimal:
    """A linear input of a transpose rule: its value is unknown, its type is not."""

    __slots__ = ("aval",)

    def __init__(self, aval: ShapedArray):
        self.aval = aval

    def __repr__(self):
        return f"UndefinedPrimal({self.aval})"


def is_undefined(x) -> bool:
    return isinstance(x, UndefinedPrimal)


def is_zero(x) -> bool:
    return isinstance(x, Zero)


def instantiate(t):
    """A real array for a tangent that may be a symbolic :class:`Zero`."""
    if isinstance(t, Zero):
        if t.aval.dtype == dtypes.float0:  # no data: a numpy array of it (as JAX's)
            return np.zeros(t.aval.shape, t.aval.dtype)
        return OPS.zeros(t.aval.shape, t.aval.dtype)
    return t


def add_tangents(a, b):
    """Sum two tangents, keeping symbolic zeros symbolic."""
    if isinstance(a, Zero):
        return b
    if isinstance(b, Zero):
        return a
    return OPS.add(a, b)
