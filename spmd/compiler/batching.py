"""vmap: the batching trace and the helpers batching rules are written with.

A batching rule ``rule(args, dims, **params) -> (out, out_dim)`` receives each
argument with its batch axis (``None`` when the argument is not batched).
"""

from __future__ import annotations

import numpy as np

not_mapped = None


def bdim_size(args, dims) -> int:
    """The batch size, read off the first batched argument."""
    for a, d in zip(args, dims):
        if d is not None:
            return np.shape(a)[d]
    raise ValueError("bdim_size: no batched argument")


def move_to_front(x, d):
    """Move batch axis ``d`` of ``x`` to position 0 (no-op when already there)."""
    from spmd.compiler.ops.structural import transpose

    if d == 0:
        return x
    nd = len(np.shape(x))
    perm = (d,) + tuple(i for i in range(nd) if i != d)
    return transpose(x, perm)


def move_axis(x, src, dst):
    """Move axis ``src`` of ``x`` to position ``dst``."""
    from spmd.compiler.ops.structural import transpose

    if src == dst:
        return x
    nd = len(np.shape(x))
    order = [i for i in range(nd) if i != src]
    order.insert(dst, src)
    return transpose(x, tuple(order))


def broadcast_batch(x, d, size):
    """``x`` with its batch axis at 0, materialising it when ``d`` is None."""
    from spmd.compiler.ops.structural import broadcast_in_dim

    if d is None:
        shape = tuple(np.shape(x))
        return broadcast_in_dim(x, (size,) + shape, tuple(range(1, len(shape) + 1)))
    return move_to_front(x, d)
