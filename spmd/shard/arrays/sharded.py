"""The sharding layer's Array: an array placed by a sharding, holding only what this
process holds.

A :class:`ShardedArray` is an :class:`spmd.compiler.core.array.Array` (so it passes
anywhere an Array does) with a sharding and one of two representations:

- **whole**: ``_value`` is the global value.  Used when this process's devices
  hold every block (a mesh of this process's devices, or a value replicated over
  the processes), where the whole value is what this process holds anyway;
- **blocks**: ``_blocks`` stacks the blocks of this process's devices along a new
  leading axis, one per device in mesh order (the layout in which the local
  backend runs a ``shard_map`` over them, so executables read and write them
  without copies).  No buffer of the global shape exists in this process.

Reading the whole value (``np.asarray``, ``repr``'s digits, ``.value``) of a
blocks array whose blocks are not all here raises
:class:`~spmd.errors.NotFullyAddressableError` naming ``process_allgather``.
Eager operations on sharded arrays are evaluated by :mod:`spmd.shard.call.dispatch`
(the compiler hands them over through its extension point ``EAGER_EVAL``).

>>> mesh = spmd.make_mesh((4, 2), ("i", "j"))
>>> x = spmd.device_put(np.arange(16.0).reshape(8, 2), NamedSharding(mesh, P("i", "j")))
>>> x.addressable_shards[1].index
(slice(0, 2, None), slice(1, 2, None))
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any


from spmd.compiler.core import array_module
from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.dlpack import DLPackError, device_of
from spmd.errors import NotFullyAddressableError
from spmd.mesh.devices import Device, local_devices, process_index
from spmd.shard.arrays.spec import NamedSharding, ShardingError, block_coord


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


def default_sharding() -> SingleDeviceSharding:
    """The placement of an Array never placed: one whole copy on this process's
    first device (device 0 in a single process)."""
    return SingleDeviceSharding(local_devices()[0])


def is_addressable(sharding) -> bool:
    me = process_index()
    return all(d.process_index == me for d in sharding.device_set)


def ordered_devices(sharding) -> list[Device]:
    """The sharding's devices in its own order (mesh order for a NamedSharding)."""
    if isinstance(sharding, NamedSharding):
        return list(sharding.mesh.devices.flat)
    return sorted(sharding.device_set)


def my_devices(sharding) -> list[Device]:
    """This process's devices of ``sharding``, in its order: the order of a blocks
    array's leading axis."""
    me = process_index()
    return [d for d in ordered_devices(sharding) if d.process_index == me]


def index_key(index: tuple[slice, ...], shape) -> tuple:
    """A hashable form of a block index (slices are unhashable before Python 3.12)."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def holds_full_value(sharding) -> bool:
    """True when this process's devices hold every block of an array placed by
    ``sharding`` (a replicated array, or a mesh of this process's devices).  Cached
    on the sharding object."""
    me = process_index()
    cached = sharding.__dict__.get("_spmd_full_value")
    if cached is None or cached[0] != me:
        cached = sharding.__dict__["_spmd_full_value"] = (me, _holds_full(sharding, me))
    return cached[1]


def _holds_full(sharding, proc: int) -> bool:
    if isinstance(sharding, NamedSharding):
        flat = list(sharding.mesh.devices.flat)
        mine = {block_coord(sharding, d) for d in flat if d.process_index == proc}
        return mine == {block_coord(sharding, d) for d in flat}
    return all(d.process_index == proc for d in sharding.device_set)


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


_GATHER_HINT = ("gather it with spmd.process_allgather(x) (every process of its mesh must "
                "call it), read this process's blocks with x.addressable_shards, or compute "
                "on it inside a shard_map or a jitted function")


def processes(sharding) -> tuple[int, ...]:
    """The processes that own a device of ``sharding``, in increasing order."""
    return tuple(sorted({d.process_index for d in sharding.device_set}))


def not_here_error(shape, dtype, sharding, what: str, fix: str = "") -> NotFullyAddressableError:
    """``what`` needs the whole value, which this process does not hold; ``fix``: a
    remedy of that operation's own, named before the general ones."""
    mine = sorted(d.id for d in sharding.device_set if d.process_index == process_index())
    return NotFullyAddressableError(
        f"{what}: this Array of shape {shape} and dtype {dtype} is spread over the "
        f"processes {list(processes(sharding))} ({sharding!r}); process {process_index()} "
        f"holds only the blocks of its devices {mine}, not the whole value. {fix}To get the "
        "value, " + _GATHER_HINT)


def not_exportable_error(x) -> NotFullyAddressableError:
    """``__dlpack__`` of an Array spread over processes: DLPack hands over one buffer
    of the whole value, which no process holds."""
    return not_here_error(
        x.shape, x.dtype, x.sharding, "x.__dlpack__()",
        fix="DLPack exports one buffer of the whole value: export this process's blocks "
            "one by one instead, np.from_dlpack(x.addressable_shards[i].data) "
            "(x.addressable_shards[i].index is where each block sits). ")


# ------------------------------------------------------------------- the array

_tokens: dict = {}
_next_token = itertools.count(1)


def placement_token(cls, aval: ShapedArray, sharding, spread: bool) -> int:
    """A number naming an array's type, aval, sharding and representation (``spread``:
    it holds blocks): the key of call plans (:mod:`spmd.shard.call.plan`) holds it, so a
    lookup hashes one int instead of an aval and a sharding.  Equal placements get
    the same number; a number is never given to another placement (the counter
    only grows), so a plan keyed on it always meets the placement it was built for."""
    key = (cls, aval, sharding, spread)
    t = _tokens.get(key)
    if t is None:
        if len(_tokens) >= 1 << 16:  # bounded: a dropped entry only costs a new number
            _tokens.clear()
        t = _tokens[key] = next(_next_token)
    return t


class ShardedArray(Array):
    """An Array placed by a sharding (see the module docstring for its two
    representations).  Build one with :func:`from_whole` or :func:`from_blocks`.
    ``token``: its :func:`placement_token`, where the caller knows it."""

    __slots__ = ("_sharding", "_blocks", "_token")

    def __init__(self, value, aval: ShapedArray, sharding, blocks=None, token=None):
        # (Array.__init__'s three fields set here: this sits on every call's results.)
        self._value = value
        self.aval = aval
        self._deleted = False
        self._sharding = sharding
        self._blocks = blocks
        self._token = token if token is not None else \
            placement_token(type(self), aval, sharding, value is None)

    def __setstate__(self, state) -> None:
        # A token is this process's number: an unpickled array gets its own.
        Array.__setstate__(self, state)
        self._token = placement_token(type(self), self.aval, self._sharding,
                                      self._value is None)

    # ------------------------------------------------------------- placement
    @property
    def sharding(self):
        """The placement of this array (a NamedSharding or a SingleDeviceSharding)."""
        return self._sharding

    @property
    def is_fully_addressable(self) -> bool:
        return is_addressable(self._sharding)

    @property
    def is_fully_replicated(self) -> bool:
        return self._sharding.is_fully_replicated()

    @property
    def addressable_shards(self) -> list[Shard]:
        """The blocks held by this process's devices, in the sharding's device order.

        >>> [s.index for s in spmd.device_put(np.zeros(4), NamedSharding(mesh, P("i"))
        ...                                  ).addressable_shards][:2]   # doctest: +SKIP
        [(slice(0, 1, None),), (slice(1, 2, None),)]
        """
        return shards_of(self, self._sharding)

    def addressable_data(self, index: int) -> Array:
        return self.addressable_shards[index].data

    # ------------------------------------------------------------------ data
    @property
    def value(self):
        """The whole value; raises NotFullyAddressableError when it is not all here."""
        v = Array.value.fget(self)  # raises for a donated array
        if v is None:
            v = self._assemble("the value of this Array")
        return v

    def _assemble(self, what: str):
        """The whole value from the local blocks, when they are all of it."""
        s = self._sharding
        if not holds_full_value(s):
            raise not_here_error(self.shape, self.dtype, s, what)
        blocks = self._blocks
        out = array_module.module_of(blocks).empty(self.shape, blocks.dtype)
        for k, d in enumerate(my_devices(s)):
            out[s.device_index(d, self.shape)] = blocks[k]
        return out

    def local_blocks(self):
        """This process's devices' blocks stacked along a new leading axis (mesh
        order).  A view of nothing global: for a whole array, fresh copies."""
        if self._blocks is not None:
            Array.value.fget(self)  # raises for a donated array
            return self._blocks
        v = self.value
        s = self._sharding
        xp = array_module.module_of(v)
        return xp.stack([v[s.device_index(d, self.shape)] for d in my_devices(s)])

    def block_until_ready(self) -> "ShardedArray":
        """Wait until the buffers this process holds are computed (its blocks; the
        whole value where it holds it): no process waits for another's.

        >>> y = step(x).block_until_ready()   # doctest: +SKIP
        """
        Array.value.fget(self)  # raises for a donated array
        for b in (self._value, self._blocks):
            if b is not None:
                array_module.synchronize(b)
        return self

    @property
    def held_nbytes(self) -> int:
        """Bytes of the buffers this process holds for this array."""
        return sum(b.nbytes for b in (self._value, self._blocks) if b is not None)

    def _holds_value(self) -> bool:
        return self._value is not None or holds_full_value(self._sharding)

    # ---------------------------------------------------------------- DLPack
    def _dlpack_buffer(self, copy):
        """The whole value's buffer for ``__dlpack__``: the one held, the first block
        where each block is the whole value, else the blocks assembled (a copy, which
        ``copy=False`` refuses)."""
        Array.value.fget(self)  # raises for a donated array
        if self._value is not None:
            return self._value, False
        s = self._sharding
        if not holds_full_value(s):
            raise not_exportable_error(self)
        if tuple(s.shard_shape(self.shape)) == tuple(self.shape):
            return self._blocks[0], False  # replicated: every block is the whole value
        if copy is False:
            raise DLPackError(
                f"x.__dlpack__(copy=False): this Array of shape {self.shape} is held as "
                f"{len(self._blocks)} blocks of shape {s.shard_shape(self.shape)}, one per "
                f"device of this process ({s!r}); one buffer of the whole value is a copy "
                "of them: pass copy=None, or export each block without a copy: "
                "np.from_dlpack(x.addressable_shards[i].data)")
        return self._assemble("x.__dlpack__()"), True

    def __dlpack_device__(self) -> tuple[int, int]:
        Array.value.fget(self)  # raises for a donated array
        if self._value is None and not holds_full_value(self._sharding):
            raise not_exportable_error(self)
        return device_of(self._value if self._value is not None else self._blocks)

    def _check(self, what: str):
        if self._value is None and not holds_full_value(self._sharding):
            raise not_here_error(self.shape, self.dtype, self._sharding, what)

    def __array__(self, dtype=None, copy=None):
        self._check("np.asarray(x)")
        return Array.__array__(self, dtype, copy)

    def item(self):
        self._check("x.item()")
        return Array.item(self)

    def tolist(self):
        self._check("x.tolist()")
        return Array.tolist(self)

    def __bool__(self):
        self._check("bool(x)")
        return Array.__bool__(self)

    def __int__(self):
        self._check("int(x)")
        return Array.__int__(self)

    def __float__(self):
        self._check("float(x)")
        return Array.__float__(self)

    def __index__(self):
        self._check("operator.index(x)")
        return Array.__index__(self)

    def __complex__(self):
        self._check("complex(x)")
        return Array.__complex__(self)

    def __str__(self):
        self._check("str(x)")
        return str(array_module.to_host(self.value))

    def __format__(self, spec):
        self._check("format(x)")
        return Array.__format__(self, spec)

    def __repr__(self):
        if self._deleted:
            return "Array(<deleted>)"
        if self._value is None and not holds_full_value(self._sharding):
            # The values are not all here: describe the array instead.
            return f"Array(shape={self.shape}, dtype={self.dtype}, sharding={self._sharding!r})"
        return Array.__repr__(self.as_plain())

    def as_plain(self) -> Array:
        """The whole value as a plain (unplaced) Array."""
        return Array(self.value, self.aval)

    def copy(self) -> "ShardedArray":
        blocks = None if self._blocks is None else self._blocks.copy()
        value = None if self._value is None else self._value.copy()
        return ShardedArray(value, self.aval, self._sharding, blocks)

    def delete(self) -> None:
        super().delete()
        self._blocks = None


def from_whole(value, aval: ShapedArray, sharding) -> ShardedArray:
    """A ShardedArray holding the whole value ``value``."""
    return ShardedArray(value, aval, sharding)


def from_blocks(blocks, aval: ShapedArray, sharding) -> ShardedArray:
    """A ShardedArray holding ``blocks``: this process's devices' blocks stacked in
    mesh order (``blocks.shape == (len(my_devices(sharding)),) + shard shape``)."""
    want = (len(my_devices(sharding)),) + tuple(sharding.shard_shape(aval.shape))
    if tuple(blocks.shape) != want:
        raise AssertionError(f"blocks of shape {blocks.shape}, expected {want}")  # internal
    return ShardedArray(None, aval, sharding, blocks)


def placed(x: Array, sharding) -> ShardedArray:
    """``x`` (holding the whole value) placed by ``sharding``: kept whole when this
    process holds every block, else cut to this process's blocks."""
    v = x.value
    if holds_full_value(sharding):
        return ShardedArray(v, x.aval, sharding)
    return ShardedArray(None, x.aval, sharding, cut_blocks(v, sharding, x.shape))


def addressable_block(x: Array, k: int):
    """``x.addressable_shards[k].data``'s backing array, without building every
    :class:`Shard` (a reader of every leaf at every step, the fast tier of
    checkpoints, spent more time building them than copying the bytes).

    >>> addressable_block(x, 1) is x.local_blocks()[1]                # doctest: +SKIP
    True
    """
    s = x.sharding
    if type(x) is not ShardedArray or getattr(getattr(s, "spec", None), "unreduced", None):
        return x.addressable_shards[k].data  # (unreduced: the shards say which hold zeros)
    if x._blocks is not None:
        return x.local_blocks()[k]
    return x.value[s.device_index(my_devices(s)[k], x.shape)]


def cut_blocks(value, sharding, shape):
    """This process's devices' blocks of the global ``value``, stacked (fresh memory)."""
    xp = array_module.module_of(value)
    devs = my_devices(sharding)
    out = xp.empty((len(devs),) + tuple(sharding.shard_shape(shape)), value.dtype)
    for k, d in enumerate(devs):
        out[k] = value[sharding.device_index(d, shape)]
    return out


def shards_of(x: Array, sharding) -> list[Shard]:
    """The addressable shards of ``x`` under ``sharding``."""
    shape = x.shape
    blocks = x._blocks if isinstance(x, ShardedArray) else None
    value = None if blocks is not None else x.value
    me = process_index()
    seen: dict = {}
    out = []
    k = 0
    imap = sharding.devices_indices_map(shape)
    unreduced = getattr(getattr(sharding, "spec", None), "unreduced", None)
    for d in ordered_devices(sharding):
        index = imap[d]
        key = index_key(index, shape)
        replica = seen.get(key, 0)
        seen[key] = replica + 1
        if d.process_index != me:
            continue
        block = blocks[k] if blocks is not None else value[index]
        k += 1
        if unreduced and not _first_along(sharding.mesh, d, unreduced):
            # An unreduced Array holds its value (their sum): as summands, the first
            # device along the unreduced axes holds it and the others zeros.
            block = array_module.module_of(block).zeros_like(block)
        aval = ShapedArray(tuple(block.shape), x.dtype, x.weak_type)
        out.append(Shard(d, index, replica, ShardedArray(block, aval, SingleDeviceSharding(d))))
    return out


def _first_along(mesh, device, axes) -> bool:
    coords = dict(zip(mesh.axis_names, mesh.coords(device)))
    return all(coords[a] == 0 for a in axes)


# ------------------------------------------------ plain Arrays' placement

def plain_sharding(self) -> Any:
    """An Array never placed: one whole copy on this process's first device."""
    return default_sharding()


def plain_shards(self) -> list[Shard]:
    return shards_of(self, default_sharding())
