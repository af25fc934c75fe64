"""The fast tier's snapshot of a tree (:mod:`spmd.checkpointing.memory`): which blocks
this process keeps, where each lies in one buffer, and their bytes copied there.

A training loop saves the same tree at every step, so its :class:`Layout` (the
leaves' names, the blocks kept and their offsets) is worked out once per tree
structure and placement and kept; a save then only copies bytes.  Working it out
took 5 ms for the example's 134 leaves, of a 6.5 ms save, on the step's critical
path.  The layout is keyed on everything it follows from (the tree's structure and
each leaf's type, shape, dtype and sharding), and each block's size is checked as it
is copied.

>>> layout, leaves = layout_of(state)                                   # doctest: +SKIP
>>> buf = copy(layout, leaves)                                          # doctest: +SKIP
"""

from __future__ import annotations

import functools

import numpy as np

from spmd import tree_util
from spmd.checkpointing import manifest, writing
from spmd.checkpointing.coordination import CheckpointError
from spmd.compiler.core import dtypes
from spmd.mesh import process_count, process_index
from spmd.shard.arrays.sharded import addressable_block


class Layout:
    """Where one tree's kept blocks lie in the buffer: ``metas`` (each leaf's path,
    shape and dtype) and ``entries`` (``[leaf, bounds, offset, nbytes]``), the header's
    parts; ``picks`` (``(leaf, shard position or None, offset, nbytes)``), what to copy."""

    __slots__ = ("key", "metas", "entries", "picks", "total")

    def __init__(self, key, metas, entries, picks, total):
        self.key, self.metas, self.entries, self.picks, self.total = (
            key, metas, entries, picks, total)


_last: list[Layout] = []  # the last tree's: a training loop saves one tree, over and over


def layout_of(tree) -> tuple[Layout, list]:
    """The layout of ``tree``'s kept blocks (worked out again only when the tree's
    structure or a leaf's type, shape, dtype or sharding changed), and its leaves."""
    leaves, treedef = tree_util.tree_flatten(tree)
    key = (treedef, process_index(), process_count(), [(type(x), getattr(x, "shape", None), getattr(x, "dtype", None),
                      getattr(x, "sharding", None)) for x in leaves])
    if _last and _last[0].key == key:
        return _last[0], leaves
    made = _work_out(tree, key)
    _last[:] = [made]
    return made, leaves


def copy(layout: Layout, leaves: list) -> np.ndarray:
    """The kept blocks' bytes, one after another, in this process's reused buffer."""
    buf = buffer("blocks", layout.total)
    for i, k, offset, n in layout.picks:
        b = np.ascontiguousarray(_block(leaves[i], k))
        if b.nbytes != n:  # (the key says it cannot; a wrong size must never be kept)
            raise CheckpointError(f"save(local=True): leaf {layout.metas[i]['path']} has "
                                  f"{b.nbytes} bytes in a block, where its layout says {n}")
        buf[offset:offset + n] = b.reshape(-1).view(np.uint8)
    return buf


def _block(x, k):
    return np.asarray(x) if k is None else np.asarray(addressable_block(x, k))


def _work_out(tree, key) -> Layout:
    paths_leaves, _ = tree_util.tree_flatten_with_path(tree)
    me, load = process_index(), [0] * process_count()
    metas, entries, picks, total = [], [], [], 0
    for i, (path, x) in enumerate(paths_leaves):
        p = tree_util.keystr(path)
        shape, dtype, sh = writing._leaf_info(x, p)
        if not (dtype.kind in "biuf" and dtype.itemsize <= 8 or dtype in dtypes.NARROW_FLOATS):
            raise CheckpointError(f"save(local=True): the leaf at {p} has dtype {dtype}, "
                                  "which checkpoints do not store (bool, integer and "
                                  "floating dtypes, bfloat16 and the float8 types)")
        metas.append({"path": p, "shape": list(shape), "dtype": dtype.name})
        # Leaves not placed on a mesh (numpy arrays, scalars): process 0 keeps them.
        kept = ([(Ellipsis, None)] if me == 0 else []) if sh is None else \
            _blocks_to_keep(x, sh, shape, dtype, me, load)
        for index, k in kept:
            n = int(_block(x, k).nbytes)
            entries.append([i, manifest._bounds(index, shape), total, n])
            picks.append((i, k, total, n))
            total += n
    return Layout(key, metas, entries, picks, total)


def _blocks_to_keep(x, sharding, shape, dtype, me: int, load: list[int]):
    """``(index, position in x.addressable_shards)`` of the blocks this process keeps
    of a placed leaf: each distinct block once, by the process holding a replica of it
    that keeps the fewest bytes so far (``load``, over the leaves in order: every
    process decides alike).  Unlike the disk's choice (replica 0), replicated leaves
    are spread over their holders, so that no process keeps and sends what all hold
    (data parallelism's parameters)."""
    mine = None
    nbytes = int(np.prod(sharding.shard_shape(shape), dtype=np.int64)) * dtype.itemsize
    out = []
    for key, index, holders in _distinct_blocks(sharding, tuple(shape)):
        keeper = min(holders, key=lambda p: (load[p], p))
        load[keeper] += nbytes
        if keeper == me:
            if mine is None:
                mine = {}
                for k, s in enumerate(x.addressable_shards):
                    mine.setdefault(tuple(manifest._bounds(s.index, shape)), k)
            out.append((index, mine[key]))
    return out


@functools.lru_cache(maxsize=1024)
def _distinct_blocks(sharding, shape: tuple) -> list[tuple]:
    """``(bounds, index, processes holding it)`` of each distinct block, in order."""
    found: dict = {}
    for device, index in sharding.devices_indices_map(shape).items():
        key = tuple(manifest._bounds(index, shape))
        found.setdefault(key, (index, set()))[1].add(device.process_index)
    return [(key, index, sorted(procs)) for key, (index, procs) in sorted(found.items())]


_buffers: dict[str, np.ndarray] = {}


def buffer(key: str, size: int) -> np.ndarray:
    """A buffer of ``size`` bytes kept for the next save: a fresh one would cost a
    page fault per 4 KiB each time (a 5 MB copy into new memory took 9 ms, into
    memory touched before 1 ms).  Safe to reuse: a save starts only once the
    previous one has finished (``saving.wait_pending``)."""
    have = _buffers.get(key)
    if have is None or have.size < size:
        have = _buffers[key] = np.empty(size, np.uint8)
    return have[:size]
