"""Products: dot, matmul (more are added beside these)."""

from __future__ import annotations

import numpy as np

from spmd.compiler.ops.linalg import dot_general
from spmd.compiler.trace import get_aval
from spmd.errors import ShapeError
from spmd.numpy._util import broadcast_shapes, broadcast_to_shape, promote_dtypes


def matmul(a, b, /):
    """Matrix product with numpy's rules for 1-d operands and batch broadcasting."""
    x, y = promote_dtypes(a, b, fname="spmd.numpy.matmul")
    xs, ys = get_aval(x).shape, get_aval(y).shape
    if not xs or not ys:
        raise ShapeError(f"spmd.numpy.matmul: operands must be at least 1-d, got shapes {xs} "
                         f"and {ys}; use * for scalars")
    if xs[-1] != (ys[0] if len(ys) == 1 else ys[-2]):
        raise ShapeError(f"spmd.numpy.matmul: shapes {xs} and {ys} do not align "
                         f"({xs[-1]} != {ys[0] if len(ys) == 1 else ys[-2]})")
    if len(xs) <= 2 and len(ys) <= 2:
        return dot_general(x, y, (((len(xs) - 1,), (0,)), ((), ())))
    # Batched: broadcast the batch dims, then one dot_general with batch dims.
    xb, yb = xs[:-2] if len(xs) > 1 else (), ys[:-2] if len(ys) > 1 else ()
    batch = broadcast_shapes(xb, yb, fname="spmd.numpy.matmul")
    if len(xs) > 1:
        x = broadcast_to_shape(x, batch + xs[-2:])
    if len(ys) > 1:
        y = broadcast_to_shape(y, batch + ys[-2:])
    nb = len(batch)
    bd = tuple(range(nb))
    if len(xs) == 1:
        return dot_general(y, x, (((nb,), (0,)), ((), ())))
    if len(ys) == 1:
        return dot_general(x, y, (((nb + 1,), (0,)), ((), ())))
    return dot_general(x, y, (((nb + 1,), (nb,)), (bd, bd)))


def dot(a, b, /):
    """numpy.dot: matmul for 1-d/2-d, scalar product for 0-d, sum over the last/second-last axes otherwise."""
    x, y = promote_dtypes(a, b, fname="spmd.numpy.dot")
    xs, ys = get_aval(x).shape, get_aval(y).shape
    if not xs or not ys:
        from spmd.numpy._elementwise import multiply
        return multiply(x, y)
    yc = 0 if len(ys) == 1 else len(ys) - 2
    if xs[-1] != ys[yc]:
        raise ShapeError(f"spmd.numpy.dot: shapes {xs} and {ys} not aligned: {xs[-1]} (dim "
                         f"{len(xs) - 1}) != {ys[yc]} (dim {yc})")
    return dot_general(x, y, (((len(xs) - 1,), (yc,)), ((), ())))
