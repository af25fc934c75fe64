"""Arrays spread over several processes: reading, gathering and building them.

On a mesh whose devices belong to several processes an :class:`Array` holds a
global-shaped buffer in which this process has filled the blocks of its own
devices (see :mod:`spmd.shard.execute`); the other blocks hold no meaningful
value (zeros, or what an elementwise operation made of them).  This module

- decides whether this process's buffer holds the whole value
  (:func:`holds_full_value`, installed on the shardings as ``_partial_buffer``,
  which the eager evaluator and ``np.asarray`` consult);
- fills the local blocks of a buffer (``device_put``,
  ``make_array_from_callback``);
- gathers values across processes (:func:`process_allgather`) and builds arrays
  from each process's own part (:func:`make_array_from_process_local_data`);
- checks that a ``shard_map`` run eagerly reads only blocks its inputs' owners hold.

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
from spmd.compiler.array import Array
from spmd.compiler.array_module import module_of, to_host
from spmd.compiler.avals import ShapedArray
from spmd.compiler.trace import Tracer
from spmd.errors import ArgumentError, NotFullyAddressableError, ShapeError
from spmd.mesh.devices import process_count, process_index
from spmd.shard.spec import NamedSharding, check_spec

_GATHER_HINT = ("gather it with spmd.process_allgather(x) (every process of its mesh must "
                "call it), read this process's blocks with x.addressable_shards, or compute "
                "on it inside a shard_map or a jitted function")


# ------------------------------------------------------------ block geometry

def _block_coord(sharding: NamedSharding, device) -> tuple[int, ...]:
    """The block ``device`` holds, as a block number per split dimension of the spec."""
    mesh, spec = sharding.mesh, sharding.spec
    coords = dict(zip(mesh.axis_names, mesh.coords(device)))
    out = []
    for d in range(len(spec)):
        k = 0
        for a in spec.axes_of(d):  # major to minor
            k = k * mesh.shape[a] + coords[a]
        out.append(k)
    return tuple(out)


def _processes(sharding) -> tuple[int, ...]:
    """The processes that own a device of ``sharding``, in increasing order."""
    return tuple(sorted({d.process_index for d in sharding.device_set}))


def _holds_full(sharding, proc: int) -> bool:
    if isinstance(sharding, NamedSharding):
        flat = list(sharding.mesh.devices.flat)
        mine = {_block_coord(sharding, d) for d in flat if d.process_index == proc}
        return mine == {_block_coord(sharding, d) for d in flat}
    return all(d.process_index == proc for d in sharding.device_set)


def holds_full_value(sharding) -> bool:
    """True when this process's devices hold every block of an array placed by
    ``sharding`` (a replicated array, or a mesh of this process's devices), so that
    its local buffer is the whole value.  Cached on the sharding object."""
    me = process_index()
    cached = sharding.__dict__.get("_spmd_full_value")
    if cached is None or cached[0] != me:
        cached = sharding.__dict__["_spmd_full_value"] = (me, _holds_full(sharding, me))
    return cached[1]


def _partial_buffer(self) -> bool:
    return not holds_full_value(self)


def check_full_value(x: Array, what: str) -> None:
    """Raise :class:`NotFullyAddressableError` if this process's buffer of ``x`` lacks
    blocks (``what`` names the operation that needed the whole value)."""
    s = x._sharding
    if s is not None and not holds_full_value(s):
        mine = sorted(d.id for d in s.device_set if d.process_index == process_index())
        raise NotFullyAddressableError(
            f"{what}: this Array of shape {x.shape} and dtype {x.dtype} is spread over the "
            f"processes {list(_processes(s))} ({s!r}); process {process_index()} holds only "
            f"the blocks of its devices {mine}, not the whole value. To get the value, "
            + _GATHER_HINT)


def local_indices(sharding, shape) -> list[tuple]:
    """The distinct global indices (tuples of slices) of this process's blocks, in the
    sharding's device order."""
    me = process_index()
    devs = (list(sharding.mesh.devices.flat) if isinstance(sharding, NamedSharding)
            else sorted(sharding.device_set))
    seen, out = set(), []
    for d in devs:
        if d.process_index != me:
            continue
        index = sharding.device_index(d, shape)
        key = _key(index, shape)
        if key not in seen:
            seen.add(key)
            out.append(index)
    return out


def _key(index, shape) -> tuple:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def fill_local(value: np.ndarray, sharding) -> np.ndarray:
    """A fresh buffer of ``value``'s shape holding its blocks at this process's devices
    (zeros elsewhere), or ``value`` itself when this process holds every block."""
    if holds_full_value(sharding):
        return value
    out = module_of(value).zeros(value.shape, value.dtype)  # numpy, or cupy on GPUs
    for index in local_indices(sharding, value.shape):
        out[index] = value[index]
    return out


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


# --------------------------------------------------------- the eager guards

def _shard_map_shardings(args, params):
    """An eager shard_map reads only its devices' blocks of each input: an input spread
    over processes is fine when every process holds the blocks ``in_specs`` asks of it.
    On a mesh spread over processes, its outputs are placed by ``out_specs``."""
    mesh, specs = params["mesh"], params["in_specs"]
    for i, (x, spec) in enumerate(zip(args, specs)):
        if type(x) is not Array or x._sharding is None or holds_full_value(x._sharding):
            continue
        need = NamedSharding(mesh, spec)
        if x._sharding == need:
            continue
        p = first_uncovered_process(x._sharding, need, x.shape)
        if p is not None:
            raise NotFullyAddressableError(
                f"shard_map: input {i} (shape {x.shape}, dtype {x.dtype}) is an Array spread "
                f"over processes with {x._sharding!r}, but in_specs gives it {spec}, which asks "
                f"process {p} for blocks that process does not hold. Pass it with the sharding "
                f"{need!r} (e.g. produce it with out_specs={spec}), or gather it with "
                "spmd.process_allgather and pass the global value")
    if not mesh.is_multi_process:
        return None
    return [NamedSharding(mesh, s) for s in params["out_specs"]]


def _elementwise_shardings(args, params):
    """An elementwise operation computes blockwise: on Arrays spread over processes with
    one sharding (and whole values or scalars beside them) it gives an Array with that
    sharding, right in this process's blocks."""
    placed = [x for x in args if type(x) is Array and x._sharding is not None
              and not holds_full_value(x._sharding)]
    if not placed:
        return None
    s, shape = placed[0]._sharding, placed[0].shape
    for x in args:
        xs = np.shape(x)
        is_placed = any(x is q for q in placed)
        if is_placed:
            ok = x._sharding == s and xs == shape
        else:
            ok = xs == () or xs == shape
        if not ok:
            raise NotFullyAddressableError(
                "an elementwise operation mixes an Array spread over processes "
                f"(shape {shape}, {s!r}) with an operand of shape {xs}"
                + (f" placed as {x._sharding!r}" if is_placed else "")
                + "; operands spread over processes must share one sharding. Compute inside "
                "a shard_map or a jitted function, or gather with spmd.process_allgather")
    return [s]


def _elementwise_primitives() -> set:
    from spmd.compiler.ops import elementwise
    from spmd.compiler.primitives import Primitive

    return {p for p in vars(elementwise).values()
            if isinstance(p, Primitive) and not p.multiple_results}


def install() -> None:
    """Let eager shard_maps, jitted calls and elementwise operations take Arrays spread
    over processes; every other eager primitive refuses them (``spmd.compiler.trace``)."""
    from spmd.compiler.jit import jit_p
    from spmd.shard.array import SingleDeviceSharding
    from spmd.shard.shard_map import shard_map_p

    NamedSharding._partial_buffer = property(_partial_buffer)
    SingleDeviceSharding._partial_buffer = property(_partial_buffer)
    shard_map_p.rules["eager_shardings"] = _shard_map_shardings
    # A jitted program's shard_maps read only this process's blocks of its inputs.
    jit_p.rules["eager_shardings"] = lambda args, params: None
    for p in _elementwise_primitives():
        p.rules["eager_shardings"] = _elementwise_shardings


# ---------------------------------------------------------- process_allgather

def _world_ranks() -> tuple[int, ...]:
    return tuple(range(process_count()))


def _agree_on(desc: str, ranks: tuple, fname: str) -> None:
    """Raise on every rank of ``ranks`` unless all give the same ``desc`` (so that no
    rank enters a data exchange of the wrong size)."""
    from spmd.collectives import mpi, mpi_control

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


def _gather_global(x: Array, fname: str) -> np.ndarray:
    """The whole value of an Array spread over processes: its owners exchange their
    buffers and each block is read from a process that holds it."""
    from spmd.collectives import mpi

    s = x._sharding
    value = x.value
    ranks = _processes(s) if isinstance(s, NamedSharding) else _world_ranks()
    if all(_holds_full(s, p) for p in ranks):  # e.g. replicated: nothing to exchange
        return np.array(to_host(value), copy=True)
    me = process_index()
    if me not in ranks:
        raise NotFullyAddressableError(
            f"{fname}: process {me} holds no device of this Array's mesh ({s!r}); only the "
            f"processes {list(ranks)} that own its blocks can gather it")
    _agree_on(f"array {x.shape} {x.dtype} {s!r}", ranks, fname)
    everyone = mpi.allgather(to_host(value), ranks)  # (P, *shape)
    pos = {p: i for i, p in enumerate(ranks)}
    out = np.empty(x.shape, x.dtype)
    for d in s.device_set:
        index = s.device_index(d, x.shape)
        out[index] = everyone[pos[d.process_index]][index]
    return out


def _gather_local(x, tiled: bool, fname: str) -> np.ndarray:
    """Process-local values stacked (or, ``tiled``, concatenated) over all processes."""
    from spmd.collectives import mpi

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
        if isinstance(x, Array) and x._sharding is not None and \
                not _is_fully_addressable(x._sharding):
            out.append(_gather_global(x, fname))
        else:
            out.append(_gather_local(x, tiled, fname))
    return tree_util.tree_unflatten(treedef, out)


def _is_fully_addressable(sharding) -> bool:
    me = process_index()
    return all(d.process_index == me for d in sharding.device_set)


# ------------------------------------------- make_array_from_process_local_data

def _local_layout(sharding: NamedSharding, ndim: int):
    """Per dimension: the number of blocks, and the sorted distinct block numbers this
    process's devices hold along it."""
    me = process_index()
    flat = list(sharding.mesh.devices.flat)
    coords = [_block_coord(sharding, d) for d in flat if d.process_index == me]
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
    from spmd.shard.array import SingleDeviceSharding, _as_sharding, _leaf_array

    fname = "make_array_from_process_local_data"
    sharding = _as_sharding(sharding, f"{fname}: sharding")
    if sharding is None:
        raise ArgumentError(f"{fname}: sharding is None; pass a NamedSharding")
    if isinstance(local_data, Tracer):
        raise ArgumentError(f"{fname}: local_data is a traced value; pass a concrete array")
    if isinstance(local_data, Array):
        check_full_value(local_data, f"{fname}: local_data")
    local = _leaf_array(local_data, f"{fname}: local_data")
    value = to_host(local.value)
    if isinstance(sharding, SingleDeviceSharding):
        sharding = NamedSharding(_one_device_mesh(sharding.device), ())
    if global_shape is not None:
        global_shape = _shape_arg(global_shape, value.ndim, fname)
    gshape, read_global = _resolve_shape(sharding, value.shape, global_shape, fname)
    check_spec(sharding.spec, sharding.mesh, gshape, f"{fname}: sharding")
    aval = ShapedArray(gshape, local.dtype, local.weak_type)
    if read_global:
        return Array(fill_local(value, sharding), aval, sharding)
    if holds_full_value(sharding):  # this process holds every block: local is global
        return Array(value, aval, sharding)
    nblocks, mine = _local_layout(sharding, len(gshape))
    block = tuple(g // n for g, n in zip(gshape, nblocks))
    out = np.zeros(gshape, local.dtype)
    me = process_index()
    for d in sharding.mesh.devices.flat:
        if d.process_index != me:
            continue
        index = sharding.device_index(d, gshape)
        coord = _block_coord(sharding, d) + (0,) * (len(gshape) - len(sharding.spec))
        src = tuple(slice(mine[k].index(coord[k]) * block[k], (mine[k].index(coord[k]) + 1)
                          * block[k]) for k in range(len(gshape)))
        out[index] = value[src]
    return Array(out, aval, sharding)


def _one_device_mesh(device):
    from spmd.mesh import Mesh

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
