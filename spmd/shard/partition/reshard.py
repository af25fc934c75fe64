"""Changing a value's placement inside a per-device program: the collectives.

| from -> to                      | inserted                          |
| ------------------------------- | --------------------------------- |
| partial -> replicated           | ``psum``                          |
| partial -> split on dim d       | ``psum_scatter`` (tiled, dim d)   |
| split on d -> replicated        | ``all_gather`` (tiled, dim d)     |
| split on d -> split on e        | ``all_to_all`` (split e, concat d)|
| replicated -> split on d        | a local slice at ``axis_index``   |

Each inserted collective is recorded with the reason (the equation and source
line that needed it) and the bytes each device sends, for ``as_text`` and
``Lowered.bytes_sent``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmd.collectives import api as coll
from spmd.compiler.ops.elementwise import mul
from spmd.compiler.ops.indexing import dynamic_slice
from spmd.compiler.trace import get_aval
from spmd.errors import SpmdError
from spmd.shard.partition.placement import Placement


class GatherTooLargeError(SpmdError, ValueError):
    """An all_gather the partitioner inserted is larger than ``forbid_gather_bytes``."""


class Note(NamedTuple):
    """Why a collective is in the per-device program."""

    collective: str
    value: object  # the traced result, to find its equation in the program
    reason: str
    bytes_sent: int


class Context:
    """What resharding needs: the mesh, the notes taken so far, the gather limit."""

    def __init__(self, mesh, forbid_gather_bytes=None):
        self.mesh = mesh
        self.notes: list[Note] = []
        self.forbid_gather_bytes = forbid_gather_bytes
        self.reason = ""

    def note(self, collective, value, nbytes):
        self.notes.append(Note(collective, value, self.reason, int(nbytes)))


def _nbytes(x) -> int:
    a = get_aval(x)
    return int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize


def reshard(x, src: Placement, dst: Placement, ctx: Context, what: str = "value"):
    """Per-device ``x`` with placement ``src`` converted to placement ``dst``."""
    if src == dst:
        return x
    mesh = ctx.mesh
    dims = [tuple(a) for a in src.dims]
    # 1. Pending sums: reduce-scatter into a dimension dst splits (where that dim is
    #    not split yet), all-reduce the rest.
    pending = [a for a in mesh.axis_names if a in src.partial and a not in dst.partial]
    if pending:
        for d, want in enumerate(dst.dims):
            scatter = tuple(a for a in want if a in pending)
            if scatter and not dims[d] and tuple(want[:len(scatter)]) == scatter:
                n = mesh.axis_size(scatter)
                if np.shape(x)[d] % n == 0:
                    before = _nbytes(x)
                    x = coll.psum_scatter(x, scatter, scatter_dimension=d, tiled=True)
                    ctx.note("psum_scatter", x, before * (n - 1) // n)
                    dims[d] = scatter
                    pending = [a for a in pending if a not in scatter]
        if pending:
            n = mesh.axis_size(tuple(pending))
            before = _nbytes(x)
            x = coll.psum(x, tuple(pending))
            ctx.note("psum", x, 2 * before * (n - 1) // n)
    if dst.partial - src.partial:
        raise NotImplementedError("partitioner: a rule asked for a pending sum the value "
                                  "does not have")
    # 2. Axes leaving a dimension: all_to_all when the same axes are wanted on a
    #    dimension that is not split yet, else all_gather.
    for d in range(len(dims)):
        extra = tuple(a for a in dims[d] if a not in dst.dims[d])
        if not extra:
            continue
        keep = tuple(a for a in dims[d] if a in dst.dims[d])
        if keep != dims[d][:len(keep)]:  # only minor axes can leave a split: gather all
            extra, keep = dims[d], ()
        target = next((e for e in range(len(dims)) if e != d and not dims[e]
                       and tuple(dst.dims[e][:len(extra)]) == extra), None)
        n = mesh.axis_size(extra)
        if target is not None and np.shape(x)[target] % n == 0:
            before = _nbytes(x)
            x = coll.all_to_all(x, extra, split_axis=target, concat_axis=d, tiled=True)
            ctx.note("all_to_all", x, before * (n - 1) // n)
            dims[target], dims[d] = extra, keep
            continue
        x = coll.all_gather(x, extra, axis=d, tiled=True)
        gathered = _nbytes(x)
        if ctx.forbid_gather_bytes is not None and gathered > ctx.forbid_gather_bytes:
            raise GatherTooLargeError(
                f"the partitioner needs an all_gather of {what} ({gathered} bytes per device, "
                f"shape {tuple(np.shape(x))}) for {ctx.reason}, more than forbid_gather_bytes="
                f"{ctx.forbid_gather_bytes}; shard the consumer differently or add a "
                "with_sharding_constraint")
        ctx.note("all_gather", x, gathered * (n - 1) // n)
        dims[d] = keep
    # 3. Axes joining a dimension: each device keeps its slice (no communication).
    for d in range(len(dims)):
        new = tuple(a for a in dst.dims[d] if a not in dims[d])
        if not new:
            continue
        if dims[d] != tuple(dst.dims[d][:len(dims[d])]):
            raise NotImplementedError(f"partitioner: cannot reshard dim {d} from {src} to "
                                      f"{dst}")
        n = mesh.axis_size(new)
        size = np.shape(x)[d] // n
        idx = coll.axis_index(new)
        starts = [np.int32(0)] * len(dims)
        starts[d] = mul(idx, np.int32(size))
        sizes = list(np.shape(x))
        sizes[d] = size
        x = dynamic_slice(x, starts, tuple(sizes))
        dims[d] = dims[d] + new
    return x
