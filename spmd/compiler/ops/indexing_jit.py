"""A scatter-add of rows as a compiled loop (numba): an embedding's gradient.

numpy has no fast way to add many rows into a small table by index: ``np.add.at``
visits one element at a time (1.2 ms for the small example's 2048 rows of 64 into
96), and the sorted sums that
:func:`spmd.compiler.ops.indexing_kernels._scatter_add_sorted` make instead (a stable
sort, a gather of the rows, ``np.add.reduceat``) took 0.17 ms alone and 0.32 ms in the
step.  This loop adds each update's row into its
target in order: 17 us.

Used for ``scatter(..., mode="add")`` over leading axes (a simulated mesh's device
axis and the token's) whose indices are all in bounds, float32 or float64, from a call site's
:data:`~spmd.compiler.engine.loops.SWITCH_AT`-th call (:class:`spmd.compiler.engine.loops.Tier`);
until then, and otherwise, numpy.  Its sums add a target's rows in the updates'
order; the sorted ones pair them otherwise: the results differ by float rounding.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.engine import loops

_SOURCE = '''\
# spmd scatter loops
import numba as nb

SIGS = [nb.void(nb.types.Array(t, 2, "C"), nb.types.Array(i, 1, "C", readonly=True),
                nb.types.Array(t, 2, "C", readonly=True))
        for t in (nb.float32, nb.float64) for i in (nb.int32, nb.int64)]


@nb.njit(SIGS, nogil=True, cache=True, error_model="numpy")
def rows_add(out, ids, upd):
    """out[ids[i]] += upd[i] for each i, in order."""
    for i in range(ids.shape[0]):
        row = out[ids[i]]
        x = upd[i]
        for j in range(x.shape[0]):
            row[j] += x[j]
'''


def compile_async():
    """The Future of the compiled module (None if it could not be compiled)."""
    return loops.compile_async(_SOURCE, "scatter")


class Runner(loops.Site):
    """One scatter equation's implementation: the compiled loop from its
    :data:`~spmd.compiler.engine.loops.SWITCH_AT`-th call on the scatters it serves, numpy
    otherwise."""

    __slots__ = ()
    compile = staticmethod(compile_async)

    def __call__(self, x, updates, *idx):
        k = len(idx)
        if self.params["mode"] != "add" or self.params["axes"] != tuple(range(k)) or \
                x.ndim < k or x.dtype not in (np.float32, np.float64) or \
                updates.dtype != x.dtype or any(i.dtype not in (np.int32, np.int64)
                                                for i in idx):
            return self.impl(np, x, updates, *idx, **self.params)
        if any(i.size and (i.min() < 0 or i.max() >= n) for i, n in zip(idx, x.shape)):
            return self.impl(np, x, updates, *idx, **self.params)  # (numpy drops those)
        jit = self.tier.ready()
        if jit is None:
            return self.impl(np, x, updates, *idx, **self.params)
        # The indexed leading axes as one (a simulated mesh's device and the token).
        ids = np.ravel_multi_index(idx, x.shape[:k]).reshape(-1) if k > 1 else \
            idx[0].reshape(-1)
        out = np.array(x, order="C")  # (inputs are never modified)
        targets = int(np.prod(x.shape[:k]))
        width = out.size // targets if targets else 0
        jit.rows_add(out.reshape(targets, width), np.ascontiguousarray(ids),
                     np.ascontiguousarray(updates).reshape(ids.size, width))
        return out
