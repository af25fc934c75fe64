"""The five array operations the transformations build, supplied by the op library.

The transformations sit below the op library (``spmd.compiler.ops``): the ops' rules
are written with them (:mod:`ad_util`'s ``Zero``, :mod:`batching`'s helpers), so they
do not import it.  Yet vmap moves and materialises batch axes (``transpose``,
``broadcast_in_dim``), autodiff materialises zero tangents and sums cotangents
(``zeros``, ``add``), and a custom rule's cotangent is converted to its primal's dtype
(``convert``).  Those five functions are the fields of :data:`OPS`, which the op
library fills once, at the end of ``spmd/compiler/ops/__init__.py`` (importing any op
module runs that first); until then each field raises instead of answering.

>>> import spmd.compiler.ops
>>> OPS.transpose.__module__
'spmd.compiler.ops.structural'
"""

from __future__ import annotations

from typing import Callable


class ArrayOps:
    """The op library's functions that the transformations call (see the module)."""

    __slots__ = ("transpose", "broadcast_in_dim", "zeros", "add", "convert")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, _missing(name))

    def install(self, *, transpose: Callable, broadcast_in_dim: Callable,
                zeros: Callable, add: Callable, convert: Callable) -> None:
        """Fill every field (``spmd/compiler/ops/__init__.py`` does, once)."""
        self.transpose, self.broadcast_in_dim = transpose, broadcast_in_dim
        self.zeros, self.add, self.convert = zeros, add, convert


def _missing(name: str) -> Callable:
    def missing(*args, **kwargs):
        raise RuntimeError(f"the transformations need the op library's {name}, and "
                           "spmd.compiler.ops is not imported yet: import it first")

    missing.__name__ = name
    return missing


OPS = ArrayOps()
