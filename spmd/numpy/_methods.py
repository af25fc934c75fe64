"""Operators and methods of traced and concrete arrays (``x + y``, ``x.sum()``, ``x.T``).

The compiler's ``Tracer`` and ``Array`` classes know nothing of numpy semantics;
this module installs the methods on both, so they behave identically.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core.array import Array
from spmd.compiler.core.trace import Tracer

# Set once install() has put every method on the classes; the installer
# (spmd/_install.py) counts as done only then, so that no thread is told "done"
# while another is still loading spmd.numpy.
INSTALLED = False


def _swap(f):
    def g(self, other):
        return f(other, self)

    return g


def _index_text(idx) -> str:
    """``idx`` as written between brackets (``0``, ``1:3``, ``..., None``)."""
    def one(e):
        if e is Ellipsis:
            return "..."
        if isinstance(e, slice):
            parts = ["" if v is None else str(v) for v in (e.start, e.stop, e.step)]
            return ":".join(parts[:2] if e.step is None else parts)
        if e is None or isinstance(e, (bool, int, np.integer)):
            return str(e)
        return "idx"
    return ", ".join(one(e) for e in idx) if isinstance(idx, tuple) else one(idx)


def _setitem(self, idx, value):
    """Arrays are immutable: say what to write instead of ``x[idx] = value``."""
    v = repr(value) if isinstance(value, (bool, int, float)) else "value"
    raise TypeError(f"'{type(self).__name__}' object does not support item assignment: spmd "
                    f"arrays are immutable (as in JAX). Instead of x[{_index_text(idx)}] = "
                    f"{v}, write x = x.at[{_index_text(idx)}].set({v}) (or .add, .multiply, "
                    ".min, .max)")


def install() -> None:
    import spmd.numpy as snp  # the package itself, which calls install() once it has loaded

    ops = {
        "__add__": snp.add, "__sub__": snp.subtract, "__mul__": snp.multiply,
        "__truediv__": snp.true_divide, "__floordiv__": snp.floor_divide,
        "__mod__": snp.remainder, "__pow__": snp.power, "__matmul__": snp.matmul,
        "__and__": snp.bitwise_and, "__or__": snp.bitwise_or, "__xor__": snp.bitwise_xor,
        "__lt__": snp.less, "__le__": snp.less_equal, "__gt__": snp.greater,
        "__ge__": snp.greater_equal, "__eq__": snp.equal, "__ne__": snp.not_equal,
    }
    reflected = {"__radd__": snp.add, "__rsub__": snp.subtract, "__rmul__": snp.multiply,
                 "__rtruediv__": snp.true_divide, "__rfloordiv__": snp.floor_divide,
                 "__rmod__": snp.remainder, "__rpow__": snp.power, "__rmatmul__": snp.matmul,
                 "__rand__": snp.bitwise_and, "__ror__": snp.bitwise_or,
                 "__rxor__": snp.bitwise_xor}
    unary = {"__neg__": snp.negative, "__pos__": lambda x: x, "__abs__": snp.abs,
             "__invert__": snp.invert}
    methods = {name: getattr(snp, name) for name in (
        "reshape", "transpose", "sum", "mean", "max", "min", "astype", "squeeze", "ravel",
        "argmax", "argmin", "any", "all", "cumsum", "prod", "var", "std", "clip", "round",
        "swapaxes", "flatten", "dot", "take", "sort", "argsort", "conj", "conjugate")
        if hasattr(snp, name)}
    if "reshape" in methods:
        methods["reshape"] = lambda self, *shape, **kw: snp.reshape(
            self, shape[0] if len(shape) == 1 else shape, **kw)
    if "transpose" in methods:
        methods["transpose"] = lambda self, *axes: snp.transpose(
            self, (axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes)
            or None)
    for cls in (Tracer, Array):
        for name, fn in ops.items():
            setattr(cls, name, fn)
        for name, fn in reflected.items():
            setattr(cls, name, _swap(fn))
        for name, fn in unary.items():
            setattr(cls, name, fn)
        for name, fn in methods.items():
            setattr(cls, name, fn)
        cls.T = property(lambda self: snp.transpose(self))
        cls.mT = property(lambda self: snp.swapaxes(self, -1, -2))
        cls.real = property(lambda self: snp.real(self))
        cls.imag = property(lambda self: snp.imag(self))
        if hasattr(snp, "_getitem"):
            cls.__getitem__ = snp._getitem
        if hasattr(snp, "_IndexUpdateHelper"):
            cls.at = property(lambda self: snp._IndexUpdateHelper(self))
        cls.__setitem__ = _setitem
        # == on arrays is elementwise, so arrays stay unhashable.
        cls.__hash__ = None
    global INSTALLED
    INSTALLED = True
