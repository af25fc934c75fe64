"""Coordinate grids and logarithmic ranges: ``meshgrid``, ``logspace``.

>>> import spmd.numpy as snp
>>> [g.shape for g in snp.meshgrid(snp.arange(3), snp.arange(2))]
[(2, 3), (2, 3)]
"""

from __future__ import annotations

import numpy as np

from spmd.errors import ArgumentError
from spmd.numpy._creation import linspace
from spmd.numpy._shape import broadcast_to
from spmd.numpy._util import checked_array, to_array

__all__ = ["logspace", "meshgrid"]


def meshgrid(*xi, copy: bool = True, sparse: bool = False, indexing: str = "xy"):
    """Coordinate arrays from 1-d coordinate vectors, as ``numpy.meshgrid``."""
    if indexing not in ("xy", "ij"):
        raise ArgumentError(f"spmd.numpy.meshgrid: indexing={indexing!r} must be 'xy' or 'ij'")
    arrs = [checked_array(x, "spmd.numpy.meshgrid").reshape(-1) for x in xi]
    nd = len(arrs)
    out = []
    for i, x in enumerate(arrs):
        shape = [1] * nd
        shape[i] = x.shape[0]
        if indexing == "xy" and nd > 1 and i < 2:
            shape[i] = 1
            shape[1 - i] = x.shape[0]
        out.append(x.reshape(tuple(shape)))
    if sparse:
        return out
    full = tuple(np.broadcast_shapes(*[o.shape for o in out]))
    return [broadcast_to(o, full) for o in out]


def logspace(start, stop, num: int = 50, endpoint: bool = True, base=10.0, dtype=None,
             axis: int = 0):
    """``base ** linspace(start, stop, num)``."""
    out = to_array(base) ** linspace(start, stop, num, endpoint=endpoint, axis=axis)
    return out if dtype is None else out.astype(dtype)
