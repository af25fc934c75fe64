"""The Kronecker and cross products (``kron``, ``cross``), built from the other
``spmd.numpy`` functions.

>>> import spmd.numpy as snp
>>> snp.cross(snp.array([1.0, 0.0, 0.0]), snp.array([0.0, 1.0, 0.0]))
Array([0., 0., 1.], dtype=float32)
"""

from __future__ import annotations

from spmd.errors import ShapeError
from spmd.numpy._shape import moveaxis, stack
from spmd.numpy._util import canonicalize_axis, promote_dtypes

__all__ = ["cross", "kron"]


def kron(a, b):
    """The Kronecker product (block ``a[i, j] * b``), as ``numpy.kron``."""
    x, y = promote_dtypes(a, b, fname="spmd.numpy.kron")
    nd = max(x.ndim, y.ndim)
    x = x.reshape((1,) * (nd - x.ndim) + x.shape)
    y = y.reshape((1,) * (nd - y.ndim) + y.shape)
    xe = x.reshape(tuple(s for d in x.shape for s in (d, 1)))
    ye = y.reshape(tuple(s for d in y.shape for s in (1, d)))
    return (xe * ye).reshape(tuple(p * q for p, q in zip(x.shape, y.shape)))


def cross(a, b, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis=None):
    """The cross product of 3-vectors (2-vectors give the z component), as numpy."""
    x, y = promote_dtypes(a, b, fname="spmd.numpy.cross")
    if axis is not None:
        axisa = axisb = axisc = axis
    x = moveaxis(x, canonicalize_axis(axisa, x.ndim, "spmd.numpy.cross", "axisa"), -1)
    y = moveaxis(y, canonicalize_axis(axisb, y.ndim, "spmd.numpy.cross", "axisb"), -1)
    if x.shape[-1] not in (2, 3) or y.shape[-1] not in (2, 3):
        raise ShapeError(f"spmd.numpy.cross: the vector axes must have 2 or 3 components, got "
                         f"{x.shape[-1]} and {y.shape[-1]}")
    a0, a1 = x[..., 0], x[..., 1]
    b0, b1 = y[..., 0], y[..., 1]
    a2 = x[..., 2] if x.shape[-1] == 3 else None
    b2 = y[..., 2] if y.shape[-1] == 3 else None
    if a2 is None and b2 is None:
        return a0 * b1 - a1 * b0
    a2 = 0 if a2 is None else a2
    b2 = 0 if b2 is None else b2
    out = stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)
    return moveaxis(out, -1, canonicalize_axis(axisc, out.ndim, "spmd.numpy.cross", "axisc"))
