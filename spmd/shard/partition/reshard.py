"""Changing a value's placement inside a per-device program: the collectives.

| from -> to                      | inserted                          |
| ------------------------------- | --------------------------------- |
| partial -> replicated           | ``psum``                          |
| partial -> split on dim d       | ``psum_scatter`` (tiled, dim d)   |
| split on d -> replicated        | ``all_gather`` (tiled, dim d)     |
| split on d -> split on e        | ``all_to_all`` (split e, concat d)|
| replicated -> split on d        | a local slice at ``axis_index``   |
| replicated -> partial           | a local mask (device 0 keeps it)  |

A conversion is first planned (:func:`plan`: a list of steps, each with the bytes a
device sends), then executed (:func:`reshard`).  Rules use the plan alone to compare
the cost of their choices (:func:`cost`).  Each inserted collective is recorded with
the reason (the equation and source line that needed it) and the bytes each device
sends, for ``as_text`` and ``Lowered.bytes_sent``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmd.collectives import api as coll
from spmd.compiler.ops.elementwise import convert, eq, mul
from spmd.compiler.ops.indexing import dynamic_slice
from spmd.compiler.core.trace import get_aval
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


class Step(NamedTuple):
    """One move of a plan: ``kind`` over mesh ``axes`` on local dimension ``dim``
    (``target``: the dimension an all_to_all splits); ``bytes_sent`` per device;
    ``out_bytes``: the local size after the step."""

    kind: str  # psum | psum_scatter | all_gather | all_to_all | slice | mask
    axes: tuple
    dim: int
    target: int
    bytes_sent: int
    out_bytes: int


class Context:
    """What resharding needs: the mesh, the notes taken so far, the gather limit."""

    def __init__(self, mesh, forbid_gather_bytes=None):
        self.mesh = mesh
        self.notes: list[Note] = []
        self.forbid_gather_bytes = forbid_gather_bytes
        self.reason = ""

    def note(self, collective, value, nbytes):
        self.notes.append(Note(collective, value, self.reason, int(nbytes)))


def _prefix(a: tuple, b: tuple) -> tuple:
    """The longest common prefix of two axis tuples."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return tuple(a[:n])


def plan(src: Placement, dst: Placement, local_shape, itemsize: int, mesh) -> list[Step]:
    """The steps turning a block of ``local_shape`` placed as ``src`` into ``dst``."""
    if src == dst:
        return []
    shape = list(local_shape)
    dims = [tuple(a) for a in src.dims]
    steps: list[Step] = []

    def size() -> int:
        return int(np.prod(shape, dtype=np.int64)) * itemsize

    # 1. Pending sums: reduce-scatter into a dimension dst splits further (right after
    #    its current axes), all-reduce the rest.
    pending = [a for a in mesh.axis_names if a in src.partial and a not in dst.partial]
    if pending:
        for d, want in enumerate(dst.dims):
            have = dims[d]
            if tuple(want[:len(have)]) != have:
                continue
            scatter = []
            for a in want[len(have):]:
                if a not in pending:
                    break
                scatter.append(a)
            scatter = tuple(scatter)
            if not scatter:
                continue
            n = mesh.axis_size(scatter)
            if shape[d] % n:
                continue
            before = size()
            shape[d] //= n
            steps.append(Step("psum_scatter", scatter, d, -1, before * (n - 1) // n, size()))
            dims[d] = have + scatter
            pending = [a for a in pending if a not in scatter]
        if pending:
            n = mesh.axis_size(tuple(pending))
            steps.append(Step("psum", tuple(pending), -1, -1, 2 * size() * (n - 1) // n, size()))
    # 2. Axes leaving a dimension (all but the common prefix with dst): all_to_all when
    #    the same axes are wanted next on a dimension not split yet, else all_gather.
    for d in range(len(dims)):
        keep = _prefix(dims[d], tuple(dst.dims[d]))
        extra = dims[d][len(keep):]
        if not extra:
            continue
        n = mesh.axis_size(extra)
        target = next((e for e in range(len(dims)) if e != d and not dims[e]
                       and tuple(dst.dims[e][:len(extra)]) == extra and shape[e] % n == 0),
                      None)
        before = size()
        if target is not None:
            shape[target] //= n
            shape[d] *= n
            steps.append(Step("all_to_all", extra, d, target, before * (n - 1) // n, size()))
            dims[target], dims[d] = extra, keep
            continue
        shape[d] *= n
        steps.append(Step("all_gather", extra, d, -1, size() * (n - 1) // n, size()))
        dims[d] = keep
    # 3. Axes joining a dimension: each device keeps its slice (no communication).
    for d in range(len(dims)):
        new = tuple(dst.dims[d][len(dims[d]):])
        if not new:
            continue
        assert dims[d] == tuple(dst.dims[d][:len(dims[d])]), (src, dst)
        shape[d] //= mesh.axis_size(new)
        steps.append(Step("slice", new, d, -1, 0, size()))
        dims[d] = dims[d] + new
    # 4. Pending sums joining: device 0 along those axes keeps the value, others zero.
    added = tuple(a for a in mesh.axis_names if a in dst.partial and a not in src.partial)
    if added:
        steps.append(Step("mask", added, -1, -1, 0, size()))
    return steps


def cost(shape, itemsize: int, src: Placement, dst: Placement, mesh) -> int:
    """Bytes each device sends to convert a value of global ``shape`` from ``src`` to ``dst``."""
    return sum(s.bytes_sent for s in plan(src, dst, src.local_shape(shape, mesh), itemsize,
                                          mesh))


def reshard(x, src: Placement, dst: Placement, ctx: Context, what: str = "value"):
    """Per-device ``x`` with placement ``src`` converted to placement ``dst``."""
    if src == dst:
        return x
    aval = get_aval(x)
    for s in plan(src, dst, aval.shape, aval.dtype.itemsize, ctx.mesh):
        x = _execute(x, s, ctx, what)
    return x


def _execute(x, s: Step, ctx: Context, what: str):
    if s.kind == "psum_scatter":
        x = coll.psum_scatter(x, s.axes, scatter_dimension=s.dim, tiled=True)
    elif s.kind == "psum":
        x = coll.psum(x, s.axes)
    elif s.kind == "all_to_all":
        x = coll.all_to_all(x, s.axes, split_axis=s.target, concat_axis=s.dim, tiled=True)
    elif s.kind == "all_gather":
        limit = ctx.forbid_gather_bytes
        if limit is not None and s.out_bytes > limit:
            shape = list(np.shape(x))
            shape[s.dim] *= ctx.mesh.axis_size(s.axes)
            raise GatherTooLargeError(
                f"the partitioner needs an all_gather over {s.axes} of {what} "
                f"({s.out_bytes} bytes per device, gathered block shape {tuple(shape)}) for "
                f"{ctx.reason}, more than forbid_gather_bytes={limit}; shard the consumer "
                "differently, add a with_sharding_constraint, or raise the limit")
        x = coll.all_gather(x, s.axes, axis=s.dim, tiled=True)
    elif s.kind == "slice":
        n = ctx.mesh.axis_size(s.axes)
        size = np.shape(x)[s.dim] // n
        starts = [np.int32(0)] * np.ndim(x)
        starts[s.dim] = mul(coll.axis_index(s.axes), np.int32(size))
        sizes = list(np.shape(x))
        sizes[s.dim] = size
        return dynamic_slice(x, starts, tuple(sizes))
    else:  # mask
        keep = convert(eq(coll.axis_index(s.axes), np.int32(0)), get_aval(x).dtype)
        return mul(x, keep)
    ctx.note(s.kind, x, s.bytes_sent)
    return x
