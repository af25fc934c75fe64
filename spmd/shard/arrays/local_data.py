"""Arrays built from each process's own part:
:func:`make_array_from_process_local_data` (kept apart from
:mod:`spmd.shard.arrays.multiprocess`, which :mod:`spmd.shard.arrays.placing` builds on, since it
builds on both).

>>> mesh = spmd.make_mesh((4,), ("data",))                 # 4 ranks, 1 device each
>>> x = spmd.make_array_from_process_local_data(
...     NamedSharding(mesh, P("data")), np.full((2, 3), spmd.process_index()))
>>> x.shape, spmd.process_allgather(x)[:, 0]               # doctest: +SKIP
((8, 3), array([0, 0, 1, 1, 2, 2, 3, 3]))
"""

from __future__ import annotations

import hashlib

import numpy as np

from spmd.compiler.core import array_module, dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import to_host
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.trace import Tracer
from spmd.collectives import mpi
from spmd.collectives.mpi import control as mpi_control
from spmd.errors import ArgumentError, ShapeError, SpmdError
from spmd.mesh.devices import process_count, process_index
from spmd.shard.arrays.placing import _as_sharding, _leaf_array
from spmd.shard.arrays.multiprocess import check_full_value
from spmd.shard.arrays.sharded import (SingleDeviceSharding, from_blocks, from_whole,
                                holds_full_value, my_devices, placed, processes)
from spmd.shard.arrays.spec import NamedSharding, block_coord, check_spec
from spmd.mesh import Mesh


# ------------------------------------------- make_array_from_process_local_data

def _local_layout(sharding: NamedSharding, ndim: int):
    """Per dimension: the number of blocks, and the sorted distinct block numbers this
    process's devices hold along it."""
    me = process_index()
    flat = list(sharding.mesh.devices.flat)
    coords = [block_coord(sharding, d) for d in flat if d.process_index == me]
    nblocks, mine = [], []
    for dim in range(ndim):
        axes = sharding.spec.axes_of(dim)
        nblocks.append(sharding.mesh.axis_size(axes) if axes else 1)
        mine.append(sorted({c[dim] for c in coords}) if dim < len(sharding.spec) else [0])
    return nblocks, mine


def make_array_from_process_local_data(sharding, local_data, global_shape=None) -> Array:
    """An Array placed by ``sharding`` from the part of it that this process's devices
    hold.

    ``local_data`` holds this process's blocks as one array: along each dimension, the
    distinct blocks its devices hold, in order (for contiguous blocks, their bounding
    box).  E.g. a batch sharded over ``'data'`` with one device per rank: rank ``r``
    gives rows ``[r*b, (r+1)*b)``.  ``global_shape`` is inferred when not given (per
    dimension: the local size times the number of blocks over the number of distinct
    blocks held here).  A ``local_data`` of the global shape is read as the global value.

    >>> mesh = spmd.make_mesh((spmd.device_count(),), ("data",))
    >>> b = 2
    >>> x = spmd.make_array_from_process_local_data(
    ...     NamedSharding(mesh, P("data")), rows[spmd.process_index() * b:][:b])
    """
    fname = "make_array_from_process_local_data"
    sharding = _as_sharding(sharding, f"{fname}: sharding")
    if sharding is None:
        raise ArgumentError(f"{fname}: sharding is None; pass a NamedSharding")
    if isinstance(local_data, Tracer):
        raise ArgumentError(f"{fname}: local_data is a traced value; pass a concrete array")
    if isinstance(local_data, Array):
        check_full_value(local_data, f"{fname}: local_data")
    local = _local_value(local_data, f"{fname}: local_data")
    value = to_host(local.value)
    if isinstance(sharding, SingleDeviceSharding):
        sharding = NamedSharding(_one_device_mesh(sharding.device), ())
    gshape, read_global = _agreed_shape(sharding, value.shape, local.dtype, global_shape,
                                        fname)
    aval = ShapedArray(gshape, local.dtype, local.weak_type)
    if holds_full_value(sharding):  # this process holds every block: local is global
        return from_whole(_on_devices(np.array(value, copy=True)), aval, sharding)
    if read_global:
        return placed(Array(_on_devices(value), aval), sharding)  # (cuts fresh blocks)
    nblocks, mine = _local_layout(sharding, len(gshape))
    block = tuple(g // n for g, n in zip(gshape, nblocks))
    devs = my_devices(sharding)
    # Only this process's blocks are allocated: one per device, in mesh order.
    out = np.empty((len(devs),) + block, local.dtype)
    for i, d in enumerate(devs):
        coord = block_coord(sharding, d) + (0,) * (len(gshape) - len(sharding.spec))
        src = tuple(slice(mine[k].index(coord[k]) * block[k], (mine[k].index(coord[k]) + 1)
                          * block[k]) for k in range(len(gshape)))
        out[i] = value[src]
    return from_blocks(_on_devices(out), aval, sharding)


def _agreed_shape(sharding, local_shape, dtype, global_shape, fname):
    """``(global shape, whether local_data is the whole global value)``, the same on
    every process of the mesh, or :class:`ShapeError` on all of them.

    Each process infers the global shape from its own ``local_data``: ranks that give
    different local shapes (a last batch shorter on one rank) would each build an array
    of another global shape, and the mismatch would surface later, at some ``jit``, as a
    :class:`ProgramMismatchError`.  So the processes agree here, on one small exchange
    of the global shape and dtype (a hash, over the control communicator); a process
    whose own arguments fail a check takes part too, with its error as its answer, so
    that every process raises and none is left waiting in the exchange."""
    def resolve():
        shape = None if global_shape is None else _shape_arg(global_shape, len(local_shape),
                                                             fname)
        out, read_global = _resolve_shape(sharding, local_shape, shape, fname)
        check_spec(sharding.spec, sharding.mesh, out, f"{fname}: sharding")
        return out, read_global

    ranks = processes(sharding)
    if process_count() < 2 or len(ranks) < 2 or process_index() not in ranks:
        # (One process: nothing to agree with (a mesh may name pretend processes' devices
        # in a test); this one not in the mesh: it raises.)
        return resolve()
    try:
        result, failure = resolve(), None
        key = f"global shape {result[0]} {np.dtype(dtype).name}"
    except SpmdError as e:
        result, failure, key = None, e, f"error: {e}"
    _agree(key, f"local_data {tuple(local_shape)} {np.dtype(dtype).name}", ranks, fname,
           failure)
    if failure is not None:  # (the same on every process: each raises its own)
        raise failure
    return result


def _agree(key: str, local: str, ranks: tuple, fname: str, cause) -> None:
    """Raise :class:`ShapeError` (from ``cause``, this process's own error if any) on
    every one of ``ranks`` unless all give the same ``key``; the message names each
    rank's ``local`` arguments and ``key``."""
    digest = np.frombuffer(hashlib.blake2b(key.encode(), digest_size=16).digest(), np.uint8)
    # Control traffic: it never pairs with a data collective.
    rows = mpi.allgather(digest, ranks, what=f"the {fname} shape check", control=True)
    if all((r == rows[0]).all() for r in rows):
        return
    texts = mpi_control.control(ranks).allgather(f"{local} -> {key}")  # (the error path)
    groups: dict = {}
    for r, t in zip(ranks, texts):
        groups.setdefault(t, []).append(r)
    detail = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {t}"
                       for t, rs in groups.items())
    raise ShapeError(
        f"{fname}: the processes of the mesh would build arrays of different global shapes "
        f"or dtypes from their local_data ({detail}). Every process must give its own "
        "blocks of one global array: local_data of the same shape and dtype on every "
        "process that holds as many blocks (e.g. drop or pad a short last batch on every "
        "rank alike), or pass the same global_shape= everywhere") from cause


def _on_devices(buf):
    """``buf`` in the devices' memory (GPU memory when they are GPUs; else itself)."""
    return buf if array_module.current() is np else array_module.to_device(buf)


def _local_value(x, where: str) -> Array:
    """``x`` as an Array without a copy where its dtype is canonical already (its
    blocks are copied into the result once, below)."""
    if isinstance(x, np.ndarray) and not array_is_special(x):
        dtype = dtypes.canonicalize(x.dtype, where)
        return Array(np.asarray(x, dtype=dtype), ShapedArray(x.shape, dtype, False))
    return _leaf_array(x, where)


def array_is_special(x: np.ndarray) -> bool:
    return x.dtype == object or x.dtype.kind in "USVc"


def _one_device_mesh(device):
    return Mesh(np.array([device], dtype=object), ("_",))


def _shape_arg(shape, ndim: int, fname: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ArgumentError(f"{fname}: global_shape must be a tuple of ints, got "
                            f"{shape!r}") from None
    if len(shape) != ndim:
        raise ShapeError(f"{fname}: global_shape {shape} has {len(shape)} dimensions but "
                         f"local_data has {ndim}; they must have the same rank")
    if any(s < 0 for s in shape):
        raise ArgumentError(f"{fname}: global_shape {shape} has a negative dimension")
    return shape


def _resolve_shape(sharding, local_shape, global_shape, fname):
    """``(global shape, whether local_data is the whole global value)``."""
    ndim = len(local_shape)
    if len(sharding.spec) > ndim:
        raise ShapeError(f"{fname}: the sharding's spec {sharding.spec} has "
                         f"{len(sharding.spec)} entries but local_data has rank {ndim} "
                         f"(shape {tuple(local_shape)})")
    if not sharding.mesh.local_devices:
        raise ArgumentError(f"{fname}: process {process_index()} owns no device of the "
                            f"mesh {sharding.mesh!r}, so it holds no block to give")
    nblocks, mine = _local_layout(sharding, ndim)
    if global_shape is None:
        out = []
        for d, (n, held) in enumerate(zip(nblocks, mine)):
            if local_shape[d] % len(held):
                raise ShapeError(
                    f"{fname}: dimension {d} of local_data (shape {tuple(local_shape)}) has "
                    f"size {local_shape[d]}, not a multiple of {len(held)}, the number of "
                    f"blocks this process's devices hold along it; pass the blocks of its "
                    "devices, or give global_shape")
            out.append(local_shape[d] // len(held) * n)
        return tuple(out), False
    for d, n in enumerate(nblocks):
        if global_shape[d] % n:
            raise ShapeError(f"{fname}: dimension {d} of global_shape {global_shape} is not "
                             f"divisible by {n}, the number of blocks along it under "
                             f"{sharding.spec}")
    want = tuple(g // n * len(held) for g, n, held in zip(global_shape, nblocks, mine))
    if tuple(local_shape) == want:
        return global_shape, False
    if tuple(local_shape) == global_shape:
        return global_shape, True
    bad = next(d for d in range(ndim) if local_shape[d] != want[d])
    raise ShapeError(
        f"{fname}: local_data has shape {tuple(local_shape)} but process {process_index()}'s "
        f"devices hold {len(mine[bad])} of the {nblocks[bad]} blocks of size "
        f"{global_shape[bad] // nblocks[bad]} along dimension {bad} of the global shape "
        f"{global_shape}, so it must have shape {want} (or be the whole global value, "
        f"shape {global_shape})")
