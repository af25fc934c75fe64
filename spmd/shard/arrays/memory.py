"""Memory per device: the bytes of live Arrays' blocks each device holds, and the peak.

What the numbers mean (``Device.memory_stats()``, and the ``memory`` counters of a
trace): each device of this process counts its own blocks of every live Array --

- an Array never placed (the compiler's ``Array``): its whole value, on this
  process's first device (its default device);
- a placed Array (:class:`~spmd.shard.arrays.sharded.ShardedArray`): for each of its
  sharding's devices in this process, the bytes of that device's block (its shard
  shape times the item size); a replicated array counts whole on each device it is
  on, an array split over 4 devices a quarter on each -- whatever buffers this
  process really holds for it (simulated devices share the host's memory);
- ``bytes_in_use``: the sum over the live Arrays; an Array stops counting when it
  is deleted (``.delete()``, donation to a jitted call) or collected;
- ``peak_bytes_in_use``: the largest ``bytes_in_use`` since counting began.

Not counted: numpy arrays, the temporaries of a running program, compiled programs'
constants, buffers no Array holds.

Counting begins at the first :meth:`spmd.Device.memory_stats` call or at a trace's
start (:func:`spmd.profiler.start_trace`, or the first program call while the launcher
records one): :func:`start` scans the live objects once (``gc.get_objects()``) for the
Arrays that exist, whose total is the first peak; from then on every Array made adds
its blocks and every one deleted or collected subtracts them.  Counting that
``memory_stats()`` began lasts for the rest of the process; counting a trace began
ends with the trace (:func:`release`), so that after it making an Array costs what
it cost before (the next ``memory_stats()`` or trace counts afresh: its peak is
from then).  While nothing counts, making an Array costs nothing more: the counting
constructors are installed by :func:`start` (the Array classes' ``__init__`` and
``delete`` wrapped), not tested on every creation.  Counters are updated without a lock: Arrays made concurrently by
several threads may be counted approximately.

>>> from spmd.shard.arrays import memory
>>> memory.stats(0)["bytes_in_use"] >= 0
True
"""

from __future__ import annotations

import gc
import weakref

import numpy as np

from spmd.compiler.core.array import Array
from spmd.mesh.devices import local_devices, process_index
from spmd.shard.arrays.sharded import ShardedArray, ordered_devices

COUNTING = False  # whether counting is on (read by the trace's hooks)
_reasons: set = set()  # who asked for the counting: "memory_stats", "trace"
IN_USE: dict = {}  # device id -> bytes of live Arrays' blocks
PEAK: dict = {}  # device id -> the most bytes_in_use since counting began
_charges: dict = {}  # id(array) -> (((device id, bytes), ...) it adds, weak reference to it)
_per_kind: dict = {}  # placement token or aval -> its charges (the same for every array)
_originals: dict = {}  # class -> its own (__init__, delete), while counting


def stats(device_id: int) -> dict:
    """``{"bytes_in_use": int, "peak_bytes_in_use": int}`` of this process's device
    ``device_id`` (JAX's keys; see the module docstring), counting from now if it
    had not begun."""
    if "memory_stats" not in _reasons:
        start("memory_stats")
    return {"bytes_in_use": IN_USE.get(device_id, 0),
            "peak_bytes_in_use": PEAK.get(device_id, 0)}


def start(reason: str = "trace") -> None:
    """Begin counting for ``reason`` (``"trace"`` or ``"memory_stats"``; if counting
    already, only note the reason): scan the live Arrays, then count each one made,
    deleted or collected."""
    global COUNTING
    _reasons.add(reason)
    if COUNTING:
        return
    for cls in (Array, ShardedArray):
        _originals[cls] = (cls.__dict__["__init__"], cls.__dict__.get("delete"))
    Array.__init__ = _counting_init(_originals[Array][0])
    ShardedArray.__init__ = _counting_init(_originals[ShardedArray][0])
    Array.delete = _counting_delete(_originals[Array][1])  # (ShardedArray's calls it)
    COUNTING = True
    for obj in gc.get_objects():
        if isinstance(obj, Array) and not obj._deleted:
            track(obj)
    PEAK.update(IN_USE)


def release(reason: str = "trace") -> None:
    """``reason`` no longer needs counting: stop when nothing else does (a trace's end)."""
    _reasons.discard(reason)
    if not _reasons and COUNTING:
        stop()


def stop() -> None:
    """Stop counting and forget the numbers (whoever asked: tests begin afresh)."""
    global COUNTING
    _reasons.clear()
    for cls, (init, delete) in _originals.items():
        cls.__init__ = init
        if cls.__dict__.get("delete") is not delete:
            cls.delete = delete
    _originals.clear()
    COUNTING = False
    IN_USE.clear(), PEAK.clear(), _charges.clear(), _per_kind.clear()


def _counting_init(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        track(self)

    return __init__


def _counting_delete(delete):
    def delete_counted(self) -> None:
        delete(self)
        forget(id(self))

    delete_counted.__name__ = "delete"
    return delete_counted


def track(a: Array) -> None:
    """Add ``a``'s blocks to its devices (until it is deleted or collected)."""
    key = id(a)
    if key in _charges:
        return
    kind = a._token if isinstance(a, ShardedArray) else a.aval
    charges = _per_kind.get(kind)
    if charges is None:
        charges = _per_kind[kind] = _blocks_of(a)
    # (A weak reference with a callback, kept with the charges: cheaper than a
    # weakref.finalize, and gone with them.)
    _charges[key] = (charges, weakref.ref(a, lambda _, k=key: forget(k)))
    for d, n in charges:
        now = IN_USE[d] = IN_USE.get(d, 0) + n
        if now > PEAK.get(d, 0):
            PEAK[d] = now


def forget(key: int) -> None:
    """Subtract the blocks of the Array whose ``id`` was ``key`` (once)."""
    held = _charges.pop(key, None)
    if held is not None:
        for d, n in held[0]:
            IN_USE[d] -= n


def _blocks_of(a: Array) -> tuple:
    """``((device id, bytes), ...)``: the block each of this process's devices holds of ``a``."""
    itemsize = np.dtype(a.aval.dtype).itemsize
    sharding = getattr(a, "_sharding", None)
    if sharding is None:  # never placed: whole, on the default device
        return ((local_devices()[0].id, int(np.prod(a.aval.shape, dtype=np.int64)) * itemsize),)
    block = int(np.prod(sharding.shard_shape(a.aval.shape), dtype=np.int64)) * itemsize
    me = process_index()
    return tuple((d.id, block) for d in ordered_devices(sharding) if d.process_index == me)
