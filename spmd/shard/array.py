"""The array side of the sharding layer: placements, shards, ``device_put``.

An :class:`~spmd.compiler.array.Array` holds one global-shaped numpy buffer in
this process whatever its sharding; the sharding says which device holds which
block.  On a mesh of this process's devices the buffer is the whole value; on a
mesh spread over processes only this process's devices' blocks are filled (see
:mod:`spmd.shard.multiprocess`), and reading the whole value (``np.asarray``,
``repr``, eager operations) raises :class:`~spmd.errors.NotFullyAddressableError`
unless this process holds every block (e.g. a replicated array).  This module
installs ``.sharding``, ``.addressable_shards``, ``.is_fully_addressable`` and
``.is_fully_replicated`` on ``Array`` (the compiler layer does not import the
sharding layer), and defines ``device_put``, ``make_array_from_callback`` and
``visualize_array_sharding``.

>>> mesh = spmd.make_mesh((4, 2), ("i", "j"))
>>> x = spmd.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("i", "j")))
>>> x.addressable_shards[1].index
(slice(0, 2, None), slice(1, 2, None))
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any, Callable, Sequence

import numpy as np
import optree

from spmd import tree_util
from spmd.compiler import dtypes
from spmd.compiler import array_module
from spmd.compiler.array import Array
from spmd.compiler.avals import ShapedArray
from spmd.compiler.trace import Tracer, is_array_like
from spmd.errors import ArgumentError, DTypeError, NotFullyAddressableError, ShapeError
from spmd.mesh.devices import Device, local_devices, process_index
from spmd.shard import multiprocess
from spmd.shard.multiprocess import check_full_value, fill_local, holds_full_value
from spmd.shard.spec import NamedSharding, PartitionSpec, ShardingError, check_spec


# ----------------------------------------------------------------- shardings

class SingleDeviceSharding:
    """The whole array on one device (the placement of an Array never given a sharding).

    >>> SingleDeviceSharding(spmd.devices()[0]).shard_shape((3, 4))
    (3, 4)
    """

    def __init__(self, device: Device):
        if not isinstance(device, Device):
            raise ShardingError(f"SingleDeviceSharding: expected an spmd Device (from "
                                f"spmd.devices()), got {device!r}")
        self.device = device

    @property
    def device_set(self) -> set:
        return {self.device}

    def is_fully_replicated(self) -> bool:
        return True  # one copy on its only device

    @property
    def is_fully_addressable(self) -> bool:
        return self.device.process_index == process_index()

    def shard_shape(self, shape) -> tuple[int, ...]:
        return tuple(shape)

    def device_index(self, device: Device, shape) -> tuple[slice, ...]:
        if device != self.device:
            raise ShardingError(f"SingleDeviceSharding: {device!r} holds no block of this "
                                f"array (it lives on {self.device!r})")
        return tuple(slice(None) for _ in shape)

    def devices_indices_map(self, shape) -> dict:
        return {self.device: self.device_index(self.device, shape)}

    def __eq__(self, other):
        return isinstance(other, SingleDeviceSharding) and self.device == other.device

    def __hash__(self):
        return hash(("SingleDeviceSharding", self.device))

    def __repr__(self):
        return f"SingleDeviceSharding(device={self.device!r})"


_SHARDINGS = (NamedSharding, SingleDeviceSharding)


def _default_sharding() -> SingleDeviceSharding:
    # An Array never placed is one whole copy in this process: its first local device
    # (device 0 in a single process).
    return SingleDeviceSharding(local_devices()[0])


def _is_addressable(sharding) -> bool:
    me = process_index()
    return all(d.process_index == me for d in sharding.device_set)


def _index_key(index: tuple[slice, ...], shape) -> tuple:
    """A hashable form of a block index (slices are unhashable before Python 3.12)."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _ordered_devices(sharding) -> list[Device]:
    """The sharding's devices in its own order (mesh order for a NamedSharding)."""
    if isinstance(sharding, NamedSharding):
        return list(sharding.mesh.devices.flat)
    return sorted(sharding.device_set)


# -------------------------------------------------------------------- shards

@dataclasses.dataclass(frozen=True, eq=False)
class Shard:
    """One device's block of an Array: ``data`` is ``x[index]`` as an Array.

    ``replica_id`` numbers the devices holding the same block (0 for the first in
    the sharding's device order), as in JAX.
    """

    device: Device
    index: tuple
    replica_id: int
    data: Array

    def __repr__(self):
        return (f"Shard(device={self.device!r}, index={self.index}, "
                f"replica_id={self.replica_id}, data={self.data!r})")


def _sharding(self) -> Any:
    """The placement of this array: a NamedSharding, or a SingleDeviceSharding when
    it was never placed."""
    s = self._sharding
    return _default_sharding() if s is None else s


def _shards(x: Array, devices_filter) -> list[Shard]:
    sharding = x.sharding
    shape = x.shape
    value = x.value
    seen: dict = {}
    out = []
    imap = sharding.devices_indices_map(shape)
    for d in _ordered_devices(sharding):
        index = imap[d]
        key = _index_key(index, shape)
        replica = seen.get(key, 0)
        seen[key] = replica + 1
        if not devices_filter(d):
            continue
        block = value[index]
        aval = ShapedArray(block.shape, x.dtype, x.weak_type)
        out.append(Shard(d, index, replica, Array(block, aval, SingleDeviceSharding(d))))
    return out


def _addressable_shards(self) -> list[Shard]:
    """The blocks held by this process's devices, in the sharding's device order.

    >>> [s.index for s in spmd.device_put(np.zeros(4), NamedSharding(mesh, P("i"))
    ...                                  ).addressable_shards][:2]   # doctest: +SKIP
    [(slice(0, 1, None),), (slice(1, 2, None),)]
    """
    me = process_index()
    return _shards(self, lambda d: d.process_index == me)


def _addressable_data(self, index: int) -> Array:
    return self.addressable_shards[index].data


def _is_fully_addressable(self) -> bool:
    return _is_addressable(self.sharding)


def _is_fully_replicated(self) -> bool:
    return self.sharding.is_fully_replicated()


def _needs_full_value(method, what: str):
    """``method`` of Array, refusing an Array whose buffer here lacks blocks."""
    def checked(self, *args, **kwargs):
        if self._sharding is not None:
            check_full_value(self, what)
        return method(self, *args, **kwargs)

    checked.__name__ = method.__name__
    checked.__doc__ = method.__doc__
    return checked


_plain_repr = Array.__repr__


def _repr(self) -> str:
    s = self._sharding
    if s is None or self._deleted or holds_full_value(s):
        return _plain_repr(self)
    # The values are not all here: describe the array instead.
    return f"Array(shape={self.shape}, dtype={self.dtype}, sharding={s!r})"


_VALUE_METHODS = {"__array__": "np.asarray(x)", "item": "x.item()", "tolist": "x.tolist()",
                  "__bool__": "bool(x)", "__int__": "int(x)", "__float__": "float(x)",
                  "__index__": "operator.index(x)", "__complex__": "complex(x)",
                  "__str__": "str(x)", "__format__": "format(x)"}


def install() -> None:
    """Put the sharding properties on ``Array`` and the checks that keep partial
    buffers from being read as values (called once at import)."""
    Array.sharding = property(_sharding)
    Array.addressable_shards = property(_addressable_shards)
    Array.addressable_data = _addressable_data
    Array.is_fully_addressable = property(_is_fully_addressable)
    Array.is_fully_replicated = property(_is_fully_replicated)
    for name, what in _VALUE_METHODS.items():
        setattr(Array, name, _needs_full_value(getattr(Array, name), what))
    Array.__repr__ = _repr
    NamedSharding.is_fully_addressable = property(_is_addressable)
    multiprocess.install()


install()


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
    if isinstance(x, (bool, int, float)):  # Python scalars stay weakly typed
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
    have = arr._sharding
    if have is None or holds_full_value(have):
        # The whole value is here: keep the blocks of this process's devices.
        buf = fill_local(arr.value, sharding)
    else:
        buf = _reshard(arr, sharding, where)
    if array_module.current() is not np:  # GPU devices: the buffer goes to GPU memory
        buf = array_module.to_device(buf)
    return Array(buf, arr.aval, sharding)


def _on_devices(arr: Array) -> Array:
    """``arr``, with its buffer in GPU memory when the devices are GPUs."""
    v = arr.value
    if array_module.current() is np or array_module.is_device_array(v):
        return arr
    return Array(array_module.to_device(v), arr.aval, arr._sharding)


def _reshard(arr: Array, sharding, where: str):
    """The buffer of ``arr`` (spread over processes) for ``sharding``: its own buffer
    when every process already holds the blocks it needs, else gathered over the
    processes of ``arr``'s mesh (a collective: every one of them calls device_put)."""
    have = arr._sharding
    if sharding == have:
        return arr.value
    multi = isinstance(sharding, NamedSharding) and sharding.mesh.is_multi_process
    if multi and multiprocess._processes(sharding) == multiprocess._processes(have):
        if multiprocess.first_uncovered_process(have, sharding, arr.shape) is None:
            return fill_local(arr.value, sharding)
        return fill_local(multiprocess._gather_global(arr, "device_put"), sharding)
    raise NotFullyAddressableError(
        f"{where} is an Array spread over processes ({have!r}) and this process does not "
        f"hold all the blocks that {sharding!r} places here; gather it first with "
        "spmd.process_allgather(x) (every process of its mesh must call it) and put the "
        "global value")


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
    # Blocks of other processes' devices stay zeros (see spmd.shard.multiprocess).
    out = np.empty(shape, dtype=dtype) if holds_full_value(sharding) else \
        np.zeros(shape, dtype=dtype)
    for index, block in blocks.values():
        out[index] = block
    if array_module.current() is not np:  # GPU devices: the buffer goes to GPU memory
        out = array_module.to_device(out)
    return Array(out, ShapedArray(shape, dtype, False), sharding)


def _callback_block(data_callback, index, want, fname):
    block = data_callback(index)
    if isinstance(block, Tracer):
        raise ArgumentError(f"{fname}: data_callback({index}) returned a traced value; "
                            "return a concrete numpy array")
    # (np.asarray of an Array checks that its value is whole; cupy blocks are copied.)
    block = np.asarray(block) if isinstance(block, Array) else array_module.to_host(block)
    if block.dtype == object or block.dtype.kind in "USVc":
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
