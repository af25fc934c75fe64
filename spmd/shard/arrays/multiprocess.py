"""Arrays spread over several processes: geometry, gathering, building them.

On a mesh whose devices belong to several processes a
:class:`~spmd.shard.arrays.sharded.ShardedArray` holds only the blocks of this
process's devices (see :mod:`spmd.shard.arrays.sharded`).  This module

- answers geometric questions about shardings over processes (which block a
  device holds, which processes hold what another sharding needs);
- gathers values across processes (:func:`process_allgather`: the one path that
  materialises the global value of an array spread over processes) and
  reshards them.

Arrays are built from each process's own part by
:func:`spmd.shard.arrays.local_data.make_array_from_process_local_data`.

>>> mesh = spmd.make_mesh((4,), ("data",))                 # 4 ranks, 1 device each
>>> x = spmd.make_array_from_process_local_data(
...     NamedSharding(mesh, P("data")), np.full((2, 3), spmd.process_index()))
>>> x.shape, spmd.process_allgather(x)[:, 0]               # doctest: +SKIP
((8, 3), array([0, 0, 1, 1, 2, 2, 3, 3]))
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import numpy as np

from spmd import tree_util
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import to_host
from spmd.compiler.core.trace import Tracer
from spmd.errors import ArgumentError, NotFullyAddressableError, ShapeError
from spmd.mesh.devices import process_count, process_index
from spmd.shard.arrays.sharded import (_holds_full, from_blocks as _from_blocks,
                                from_whole as _from_whole, holds_full_value, my_devices,
                                not_here_error, processes, ShardedArray)
from spmd.shard.arrays.spec import NamedSharding
from spmd.collectives import mpi
from spmd.collectives.mpi import control as mpi_control


# ------------------------------------------------------------ block geometry

_processes = processes


def check_full_value(x: Array, what: str) -> None:
    """Raise :class:`NotFullyAddressableError` if this process does not hold the whole
    value of ``x`` (``what`` names the operation that needed it)."""
    if isinstance(x, ShardedArray) and x._value is None and not holds_full_value(x.sharding):
        raise not_here_error(x.shape, x.dtype, x.sharding, what)


def local_indices(sharding, shape) -> list[tuple]:
    """The distinct global indices (tuples of slices) of this process's blocks, in the
    sharding's device order."""
    seen, out = set(), []
    for d in my_devices(sharding):
        index = sharding.device_index(d, shape)
        key = _key(index, shape)
        if key not in seen:
            seen.add(key)
            out.append(index)
    return out


def _key(index, shape) -> tuple:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _covered(needed: list, held: list, shape) -> bool:
    """Whether the union of the ``held`` blocks contains every ``needed`` block (blocks
    as ``(start, stop)`` pairs per dimension), cut into the cells of their boundaries."""
    if not needed:
        return True
    cuts = []
    for d, n in enumerate(shape):
        pts = sorted({0, n} | {b[d][0] for b in needed + held} | {b[d][1] for b in needed + held})
        cuts.append(pts)

    def cells(block):
        per_dim = [[(a, b) for a, b in zip(c[:-1], c[1:]) if lo <= a and b <= hi]
                   for c, (lo, hi) in zip(cuts, block)]
        return set(itertools.product(*per_dim))

    have = set().union(*(cells(b) for b in held)) if held else set()
    return all(cells(b) <= have for b in needed)


def _blocks_of(sharding, proc: int, shape) -> list:
    return [_key(sharding.device_index(d, shape), shape) for d in sharding.device_set
            if d.process_index == proc]


def first_uncovered_process(have, need, shape) -> int | None:
    """The first process that needs (under ``need``) blocks it does not hold (under
    ``have``), or None.  Decided from the shardings alone, so every process agrees."""
    for p in _processes(need):
        if not _covered(_blocks_of(need, p, shape), _blocks_of(have, p, shape), shape):
            return p
    return None


# ---------------------------------------------------------- process_allgather

def _world_ranks() -> tuple[int, ...]:
    return tuple(range(process_count()))


def _agree_on(desc: str, ranks: tuple, fname: str) -> None:
    """Raise on every rank of ``ranks`` unless all give the same ``desc`` (so that no
    rank enters a data exchange of the wrong size)."""
    digest = np.frombuffer(hashlib.blake2b(desc.encode(), digest_size=16).digest(), np.uint8)
    # Control traffic: it never pairs with a data collective.
    rows = mpi.allgather(digest, ranks, what=f"the {fname} shape check", control=True)
    if all((r == rows[0]).all() for r in rows):
        return
    texts = mpi_control.control(ranks).allgather(desc)
    groups: dict = {}
    for r, t in zip(ranks, texts):
        groups.setdefault(t, []).append(r)
    detail = "; ".join(f"ranks {rs}: {t}" for t, rs in groups.items())
    raise ShapeError(f"{fname}: the processes passed different values to gather ({detail}); "
                     "every process must pass the same pytree of arrays of the same shapes "
                     "and dtypes")


def _gather_global(x: ShardedArray, fname: str) -> np.ndarray:
    """The whole value of an Array spread over processes: its owners exchange their
    blocks and each block of the result is written from one that holds it."""
    s = x.sharding
    ranks = _processes(s) if isinstance(s, NamedSharding) else _world_ranks()
    if x._value is not None and all(_holds_full(s, p) for p in ranks):
        return np.array(to_host(x._value), copy=True)  # e.g. replicated: nothing to exchange
    me = process_index()
    if me not in ranks:
        raise NotFullyAddressableError(
            f"{fname}: process {me} holds no device of this Array's mesh ({s!r}); only the "
            f"processes {list(ranks)} that own its blocks can gather it")
    _agree_on(f"array {x.shape} {x.dtype} {s!r}", ranks, fname)
    blocks = to_host(x.local_blocks())
    devs = {p: [d for d in s.mesh.devices.flat if d.process_index == p] for p in ranks}
    counts = {len(v) for v in devs.values()}
    out = np.empty(x.shape, x.dtype)
    if len(counts) == 1:
        everyone = mpi.allgather(np.ascontiguousarray(blocks), ranks)  # (P, local, *block)
        rows = {p: everyone[i] for i, p in enumerate(ranks)}
    else:  # processes with different device counts: one exchange per process
        comm = mpi.communicator(ranks, fname)
        rows = {}
        for p in ranks:
            with mpi.Collective(ranks, fname):  # (the deadline watches it)
                rows[p] = comm.bcast(blocks if p == me else None, root=ranks.index(p))
    for p in ranks:
        for k, d in enumerate(devs[p]):
            out[s.device_index(d, x.shape)] = rows[p][k]
    return out


def reshard(x: ShardedArray, sharding, where: str) -> ShardedArray:
    """``x`` (spread over processes) placed by ``sharding`` instead: its own blocks
    when every process already holds what ``sharding`` asks of it, else gathered over
    the processes of ``x``'s mesh and cut (a collective: all of them must call it)."""
    have = x.sharding
    if sharding == have:
        return x
    multi = isinstance(sharding, NamedSharding) and sharding.mesh.is_multi_process
    if not (multi and _processes(sharding) == _processes(have)):
        raise NotFullyAddressableError(
            f"{where} is an Array spread over processes ({have!r}) and this process does not "
            f"hold all the blocks that {sharding!r} places here; gather it first with "
            "spmd.process_allgather(x) (every process of its mesh must call it) and put the "
            "global value")
    if first_uncovered_process(have, sharding, x.shape) is None:
        # Every process holds what it needs: cut the new blocks from its own.
        if holds_full_value(sharding):
            return _from_whole(_assemble_from(x, None), x.aval, sharding)
        return _from_blocks(_assemble_from(x, sharding), x.aval, sharding)
    blocks = _exchange(x, sharding, where)
    if holds_full_value(sharding):
        return _from_whole(blocks[0], x.aval, sharding)
    return _from_blocks(blocks, x.aval, sharding)


def _exchange(x: ShardedArray, sharding, where: str) -> np.ndarray:
    """This process's blocks of ``x`` under ``sharding`` (one whole value, stacked,
    when it holds every block), received from the processes that hold them: each
    block of ``x`` is sent by the lowest process holding it, only to the processes
    whose new blocks overlap it.  A collective over the processes of the mesh."""
    shape, have = x.shape, x.sharding
    ranks = _processes(have)
    _agree_on(f"reshard {x.shape} {x.dtype} {have!r} -> {sharding!r}", ranks, where)
    me = process_index()
    owner: dict = {}  # block key of x -> the lowest process holding it
    for d in have.mesh.devices.flat:
        k = _key(have.device_index(d, shape), shape)
        owner[k] = min(owner.get(k, d.process_index), d.process_index)
    mine = {}
    for d, b in zip(my_devices(have), x.local_blocks()):
        k = _key(have.device_index(d, shape), shape)
        if owner[k] == me:
            mine[k] = to_host(b)

    def targets(p):
        if _holds_full(sharding, p):
            return [tuple((0, n) for n in shape)]
        return [_key(sharding.device_index(d, shape), shape)
                for d in sharding.mesh.devices.flat if d.process_index == p]

    sends = []
    for p in ranks:
        pieces = []
        for k, t in enumerate(targets(p)):
            for src, block in mine.items():
                lo = [max(a[0], b[0]) for a, b in zip(t, src)]
                hi = [min(a[1], b[1]) for a, b in zip(t, src)]
                if all(a < b for a, b in zip(lo, hi)):
                    dst = tuple(slice(a - o[0], b - o[0]) for a, b, o in zip(lo, hi, t))
                    part = tuple(slice(a - o[0], b - o[0]) for a, b, o in zip(lo, hi, src))
                    pieces.append((k, dst, np.ascontiguousarray(block[part])))
        sends.append(pieces)
    comm = mpi.communicator(ranks, "reshard")
    with mpi.Collective(ranks, "reshard"):  # (the deadline watches it)
        received = comm.alltoall(sends)
    want = targets(me)
    out = np.empty((len(want),) + tuple(hi - lo for lo, hi in want[0]), x.dtype)
    for pieces in received:
        for k, dst, data in pieces:
            out[k][dst] = data
    return out


def _assemble_from(x: ShardedArray, sharding):
    """The blocks of this process's devices under ``sharding`` (the whole value when
    None), written from the blocks of ``x`` this process holds, which cover them."""
    shape = x.shape
    held = [(_key(x.sharding.device_index(d, shape), shape), to_host(b))
            for d, b in zip(my_devices(x.sharding), x.local_blocks())]
    targets = [tuple((0, n) for n in shape)] if sharding is None else \
        [_key(sharding.device_index(d, shape), shape) for d in my_devices(sharding)]
    out = np.empty((len(targets),) + tuple(hi - lo for lo, hi in targets[0]), x.dtype)
    for k, t in enumerate(targets):
        for src, block in held:
            lo = [max(a[0], b[0]) for a, b in zip(t, src)]
            hi = [min(a[1], b[1]) for a, b in zip(t, src)]
            if all(lo_ < hi_ for lo_, hi_ in zip(lo, hi)) or not shape:
                dst = tuple(slice(a - o[0], b - o[0]) for a, b, o in zip(lo, hi, t))
                part = tuple(slice(a - o[0], b - o[0]) for a, b, o in zip(lo, hi, src))
                out[k][dst] = block[part]
    return out[0] if sharding is None else out


def _gather_local(x, tiled: bool, fname: str) -> np.ndarray:
    """Process-local values stacked (or, ``tiled``, concatenated) over all processes."""
    value = to_host(x)  # a cupy array too (never np.asarray: CuPy refuses it)
    if process_count() == 1:
        return np.array(value, copy=True) if tiled and value.ndim else value[None].copy()
    ranks = _world_ranks()
    _agree_on(f"local {value.shape} {value.dtype}", ranks, fname)
    out = mpi.allgather(value, ranks)  # (P, *shape)
    if tiled and value.ndim:
        out = out.reshape((out.shape[0] * out.shape[1],) + out.shape[2:])
    return out


def process_allgather(in_tree: Any, tiled: bool = False) -> Any:
    """Gather values across processes into numpy arrays on every process (JAX's
    ``multihost_utils.process_allgather``).

    - An Array spread over processes (not fully addressable) gives its whole global
      value; every process of its mesh must call this.
    - Process-local values (numpy arrays, scalars, fully addressable Arrays) are
      gathered from every process: stacked along a new leading axis, or with
      ``tiled=True`` concatenated along axis 0 (scalars are always stacked).  In a
      single process that is ``x[None]``, or ``x`` itself when ``tiled``.

    >>> loss = spmd.process_allgather(x_sharded)      # the global value, as numpy
    >>> ranks = spmd.process_allgather(np.int32(spmd.process_index()))  # [0, 1, 2, 3]
    """
    fname = "process_allgather"
    leaves, treedef = tree_util.tree_flatten(in_tree)
    out = []
    for x in leaves:
        if isinstance(x, Tracer):
            raise ArgumentError(f"{fname}: got a traced value; gather concrete arrays, "
                                "outside jit and other transformations")
        if isinstance(x, ShardedArray) and not _is_fully_addressable(x.sharding):
            out.append(_gather_global(x, fname))
        else:
            out.append(_gather_local(x, tiled, fname))
    return tree_util.tree_unflatten(treedef, out)


def _is_fully_addressable(sharding) -> bool:
    me = process_index()
    return all(d.process_index == me for d in sharding.device_set)
