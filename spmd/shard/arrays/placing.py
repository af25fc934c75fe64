"""Placing values: ``device_put``, ``make_array_from_callback``, ``visualize_array_sharding``.

Every producer here allocates only what this process holds: the whole value when
its devices hold every block, else one block per device of this process (see
:mod:`spmd.shard.arrays.sharded`, which defines the placed Array type and the
shardings).

>>> mesh = spmd.make_mesh((4, 2), ("i", "j"))
>>> x = spmd.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("i", "j")))
>>> x.addressable_shards[1].index
(slice(0, 2, None), slice(1, 2, None))
"""

from __future__ import annotations

import io
from typing import Any, Callable, Sequence

import numpy as np
import optree

from spmd import tree_util
from spmd.compiler.core import dtypes
from spmd.compiler.core import array_module
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.tracer import Tracer, is_array_like
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.mesh.devices import Device, process_index
from spmd.shard.arrays import multiprocess
from spmd.shard.arrays.sharded import (Shard, ShardedArray, SingleDeviceSharding,  # noqa: F401
                                default_sharding, from_blocks, from_whole, holds_full_value,
                                index_key, my_devices, ordered_devices, placed)
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec, ShardingError, check_spec

_SHARDINGS = (NamedSharding, SingleDeviceSharding)
_default_sharding = default_sharding
_index_key = index_key
_ordered_devices = ordered_devices


# ---------------------------------------------------------------- device_put

def _describe(x) -> str:
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of length {len(x)}"
    if isinstance(x, dict):
        return f"a dict with keys {sorted(x, key=repr)}"
    if x is None:
        return "None"
    return f"a {type(x).__name__}"


def _as_sharding(s, where: str):
    if s is None or isinstance(s, _SHARDINGS):
        return s
    if isinstance(s, Device):
        return SingleDeviceSharding(s)
    if isinstance(s, PartitionSpec):
        raise ShardingError(f"{where}: got the PartitionSpec {s!r} without a mesh; pass "
                            f"NamedSharding(mesh, {s!r})")
    raise ShardingError(f"{where}: expected a NamedSharding, a Device or None, got {s!r}")


def _is_sharding_leaf(s) -> bool:
    return s is None or isinstance(s, _SHARDINGS + (Device, PartitionSpec))


def _broadcast_shardings(sharding, tree, fname: str) -> list:
    """``(path, sharding)`` per leaf of ``tree``, from a pytree prefix ``sharding``."""
    out: list = []

    def walk(s, t, path):
        s_kids, _, s_keys, _ = (None,) * 4 if _is_sharding_leaf(s) else _one_level(s)
        if s_kids is None:  # a leaf of the prefix: it must be a sharding
            s = _as_sharding(s, f"{fname}: sharding for x{path}")
            for p, _ in tree_util.tree_flatten_with_path(t)[0]:
                out.append((path + tree_util.keystr(p), s))
            return
        t_kids, _, t_keys, _ = _one_level(t)
        if (t_kids is None or type(s) is not type(t)
                or list(s_keys) != list(t_keys)):
            raise ShardingError(
                f"{fname}: sharding is not a pytree prefix of x: at x{path} the sharding is "
                f"{_describe(s)} but the value is {_describe(t)}; give one sharding per "
                "subtree, or a single sharding for all of x")
        for k, sc, tc in zip(t_keys, s_kids, t_kids):
            walk(sc, tc, path + f"[{k!r}]")

    walk(sharding, tree, "")
    return out


def _one_level(t):
    """``optree``'s one-level flattening, or ``(None, ...)`` for a leaf."""
    if t is None or tree_util.treedef_is_leaf(tree_util.tree_structure(t)):
        return None, None, None, None
    return optree.tree_flatten_one_level(t, none_is_leaf=False, namespace=tree_util.NAMESPACE)


def _leaf_array(x, where: str) -> Array:
    """A fresh Array of ``x`` in its canonical dtype (numpy inputs are copied, as a
    transfer to a device copies them)."""
    if isinstance(x, Array):
        return x
    if not is_array_like(x):
        raise DTypeError(f"{where} is {_describe(x)} ({x!r:.60}), not an array; pass numpy "
                         "arrays, spmd Arrays or Python scalars")
    if isinstance(x, (bool, int, float, complex)):  # Python scalars stay weakly typed
        dtype = dtypes.python_scalar_dtype(x)
        return Array(np.array(x, dtype=dtype), ShapedArray((), dtype, True))
    if array_module.is_device_array(x):  # a GPU (cupy) array: copied on (this process's) GPU
        dtype = dtypes.canonicalize(x.dtype, where)
        value = array_module.to_device(x).astype(dtype)
        return Array(value, ShapedArray(value.shape, dtype, False))
    dtype = dtypes.canonicalize(np.asarray(x).dtype, where)
    value = np.array(x, dtype=dtype, copy=True)
    return Array(value, ShapedArray(value.shape, dtype, False))


def _put_leaf(x, sharding, where: str) -> Array:
    if isinstance(x, Tracer):
        if sharding is None:
            return x
        raise ShardingError(f"{where} is a traced value: device_put with a sharding works on "
                            "concrete arrays only; inside jit use "
                            "lax.with_sharding_constraint, or jit(..., out_shardings=...)")
    arr = _leaf_array(x, where)
    if sharding is None:
        return _on_devices(arr)
    if isinstance(sharding, NamedSharding):
        check_spec(sharding.spec, sharding.mesh, arr.shape, where)
    if isinstance(arr, ShardedArray) and arr._value is None:
        # Spread over processes: exchange blocks where the new placement needs it.
        out = multiprocess.reshard(arr, sharding, where)
    else:
        # The whole value is here: keep what this process's devices hold.
        out = placed(arr, sharding)
    if array_module.current() is not np:  # GPU devices: the buffers go to GPU memory
        out = _to_device(out)
    return out


def _to_device(x: ShardedArray) -> ShardedArray:
    value = None if x._value is None else array_module.to_device(x._value)
    blocks = None if x._blocks is None else array_module.to_device(x._blocks)
    return ShardedArray(value, x.aval, x.sharding, blocks)


def _on_devices(arr: Array) -> Array:
    """``arr``, with its buffer in GPU memory when the devices are GPUs."""
    if array_module.current() is np:
        return arr
    if isinstance(arr, ShardedArray):
        return _to_device(arr)
    v = arr.value
    return arr if array_module.is_device_array(v) else Array(array_module.to_device(v),
                                                             arr.aval)


def device_put(x, sharding=None):
    """Place ``x`` (an array, a scalar or a pytree of them) with ``sharding``.

    ``sharding`` is a :class:`NamedSharding`, a ``Device``, ``None`` (keep Arrays as
    they are, put numpy values on this process's first device), or a pytree prefix
    of those.  The result holds the same global value.

    >>> mesh = spmd.make_mesh((4, 2), ("i", "j"))
    >>> x = spmd.device_put(np.ones((8, 4)), NamedSharding(mesh, P("i", "j")))
    >>> x.sharding.shard_shape(x.shape)
    (2, 2)
    """
    leaves, treedef = tree_util.tree_flatten(x)
    placed = _broadcast_shardings(sharding, x, "device_put")
    assert len(placed) == len(leaves)
    out = [_put_leaf(leaf, s, f"device_put: x{path}" if path else "device_put: x")
           for leaf, (path, s) in zip(leaves, placed)]
    return tree_util.tree_unflatten(treedef, out)


# -------------------------------------------------- make_array_from_callback

def make_array_from_callback(shape: Sequence[int], sharding,
                             data_callback: Callable[[tuple], Any]) -> Array:
    """An Array of global ``shape`` whose blocks come from ``data_callback(index)``.

    The callback gets the global index of a block (a tuple of slices) and returns
    that block (a numpy array or Array of the sharding's block shape).  It is called
    once per distinct block held by this process's devices, and only for those: on a
    mesh spread over processes each process gives the blocks of its own devices.

    >>> data = np.arange(32.0).reshape(8, 4)
    >>> x = spmd.make_array_from_callback((8, 4), NamedSharding(mesh, P("i")),
    ...                                   lambda idx: data[idx])
    """
    fname = "make_array_from_callback"
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ArgumentError(f"{fname}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ArgumentError(f"{fname}: shape {shape} has a negative dimension")
    sharding = _as_sharding(sharding, f"{fname}: sharding")
    if sharding is None:
        raise ShardingError(f"{fname}: sharding is None; pass a NamedSharding or a Device")
    if isinstance(sharding, NamedSharding):
        check_spec(sharding.spec, sharding.mesh, shape, f"{fname}: sharding")
    want = sharding.shard_shape(shape)
    imap = sharding.devices_indices_map(shape)
    me = process_index()
    blocks: dict = {}  # index key -> (index, block), one callback per distinct block
    for d in _ordered_devices(sharding):
        if d.process_index != me:
            continue
        index = imap[d]
        key = _index_key(index, shape)
        if key not in blocks:
            blocks[key] = (index, _callback_block(data_callback, index, want, fname))
    dtype = _common_dtype(blocks.values(), fname)
    aval = ShapedArray(shape, dtype, False)
    if holds_full_value(sharding):  # every block is here: the whole value
        out = np.empty(shape, dtype=dtype)
        for index, block in blocks.values():
            out[index] = block
        arr = from_whole(out, aval, sharding)
    else:  # one block per device of this process: nothing of the global shape
        devs = my_devices(sharding)
        out = np.empty((len(devs),) + tuple(want), dtype=dtype)
        for k, d in enumerate(devs):
            out[k] = blocks[_index_key(imap[d], shape)][1]
        arr = from_blocks(out, aval, sharding)
    if array_module.current() is not np:  # GPU devices: the buffers go to GPU memory
        arr = _to_device(arr)
    return arr


def _callback_block(data_callback, index, want, fname):
    block = data_callback(index)
    if isinstance(block, Tracer):
        raise ArgumentError(f"{fname}: data_callback({index}) returned a traced value; "
                            "return a concrete numpy array")
    # (np.asarray of an Array checks that its value is whole; cupy blocks are copied.)
    block = np.asarray(block) if isinstance(block, Array) else array_module.to_host(block)
    if block.dtype == object or (block.dtype.kind in "USVc"
                                 and not dtypes.is_narrow_float(block.dtype)):
        raise DTypeError(f"{fname}: data_callback({index}) returned an array of dtype "
                         f"{block.dtype}; return numeric or bool arrays")
    if block.shape != want:
        raise ShapeError(f"{fname}: data_callback({index}) returned a block of shape "
                         f"{block.shape}, but this sharding's blocks have shape {want}; return "
                         "the global array's values at that index")
    return block


def _common_dtype(blocks, fname):
    found = {}
    for index, block in blocks:
        found.setdefault(block.dtype, index)
    if len(found) > 1:
        detail = ", ".join(f"{dt} at {idx}" for dt, idx in found.items())
        raise DTypeError(f"{fname}: data_callback returned blocks of different dtypes "
                         f"({detail}); every block must have the same dtype")
    (dtype,) = found or [np.dtype(np.float32)]
    return dtypes.canonicalize(dtype, fname)


# ---------------------------------------------------------------- visualize

def _label(devs: list[Device]) -> str:
    devs = sorted(devs)
    return f"{devs[0].platform.upper()} " + ",".join(str(d.id) for d in devs)


def _grid(x) -> list[list[str]]:
    """Rows of cell labels: which devices hold each block of a 0-, 1- or 2-d array."""
    shape = tuple(np.shape(x))
    if len(shape) > 2:
        raise ShapeError(f"visualize_array_sharding: only 0-, 1- and 2-d arrays can be "
                         f"drawn, got shape {shape}; visualize a 2-d reshape or slice instead")
    sharding = x.sharding if isinstance(x, Array) else _default_sharding()
    shape2 = (1,) * (2 - len(shape)) + shape  # a 1-d array is one row of blocks
    cells: dict = {}
    for d, index in sharding.devices_indices_map(shape).items():
        key = _index_key((slice(None),) * (2 - len(shape)) + tuple(index), shape2)
        cells.setdefault(key, []).append(d)
    rows = sorted({k[0] for k in cells})
    cols = sorted({k[1] for k in cells})
    return [[_label(cells[(r, c)]) for c in cols] for r in rows]


def _plain_table(grid: list[list[str]]) -> str:
    width = max(len(c) for row in grid for c in row) + 2
    rule = "+" + "+".join("-" * width for _ in grid[0]) + "+"
    lines = [rule]
    for row in grid:
        lines.append("|" + "|".join(c.center(width) for c in row) + "|")
        lines.append(rule)
    return "\n".join(lines)


def _rich_table(grid: list[list[str]], use_color: bool) -> tuple[str, Any]:
    import rich.box
    import rich.console
    import rich.table

    table = rich.table.Table(show_header=False, show_lines=True, box=rich.box.SQUARE,
                             padding=(0, 1))
    for _ in grid[0]:
        table.add_column(justify="center")
    colors = ["red", "green", "blue", "magenta", "cyan", "yellow"]
    for r, row in enumerate(grid):
        styled = [f"[{colors[(r * len(row) + c) % len(colors)]}]{cell}[/]" if use_color else cell
                  for c, cell in enumerate(row)]
        table.add_row(*styled)
    buf = rich.console.Console(file=io.StringIO(), width=200, color_system=None)
    buf.print(table)
    return buf.file.getvalue().rstrip("\n"), table


def visualize_array_sharding(x, *, use_color: bool = False) -> str:
    """Print (and return) a grid showing which devices hold each block of ``x``.

    >>> mesh = spmd.make_mesh((2, 2), ("i", "j"))
    >>> _ = spmd.visualize_array_sharding(
    ...     spmd.device_put(np.zeros((4, 4)), NamedSharding(mesh, P("i", "j"))))
    +-------+-------+
    | CPU 0 | CPU 1 |
    +-------+-------+
    | CPU 2 | CPU 3 |
    +-------+-------+

    Uses ``rich`` (box drawing, colours with ``use_color=True``) when it is
    installed; the returned string never holds colour codes.
    """
    grid = _grid(x)
    try:
        import rich  # noqa: F401
    except ImportError:
        text = _plain_table(grid)
        print(text)
        return text
    text, table = _rich_table(grid, use_color)
    import rich.console

    rich.console.Console(color_system="auto" if use_color else None).print(table)
    return text
