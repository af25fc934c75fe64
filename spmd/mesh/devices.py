"""Devices: the global list, this process's part, and their identities."""

from __future__ import annotations

import functools

# DeviceError lives in spmd.errors (the launch layer raises it too); importable here.
from spmd.errors import DeviceError  # noqa: F401
from spmd.launch import platform, process


class Device:
    """One device: a global ``id``, the ``process_index`` that owns it, its
    ``local_id`` within that process and its ``platform`` (``'cpu'`` or ``'gpu'``)."""

    __slots__ = ("id", "process_index", "local_id", "platform")

    def __init__(self, id: int, process_index: int, local_id: int, platform: str = "cpu"):
        self.id = id
        self.process_index = process_index
        self.local_id = local_id
        self.platform = platform

    @property
    def device_kind(self) -> str:
        return "simulated cpu" if self.platform == "cpu" else "gpu"

    def __repr__(self):
        return f"{self.platform.upper()}Device(id={self.id}" + (
            f", process={self.process_index})" if self.process_index else ")")

    def __eq__(self, other):
        return isinstance(other, Device) and (self.id, self.platform) == (other.id, other.platform)

    def __hash__(self):
        return hash((self.id, self.platform))

    def __lt__(self, other):
        return self.id < other.id

    def memory_stats(self) -> dict:
        """``{"bytes_in_use": int, "peak_bytes_in_use": int}`` (JAX's keys): the bytes of
        live Arrays' blocks this device holds, and their peak since counting began
        (at the first call of this method or the first trace: see
        :mod:`spmd.shard.arrays.memory` for exactly what is counted).  Only this
        process's devices can be asked.

        >>> spmd.devices()[0].memory_stats()["bytes_in_use"] >= 0   # doctest: +SKIP
        True
        """
        if self.process_index != process_index():
            raise DeviceError(
                f"{self!r}.memory_stats(): this device belongs to process "
                f"{self.process_index}, and this is process {process_index()}; only a "
                "process's own devices can be asked (call it there, on "
                "spmd.local_devices())")
        if MEMORY_STATS[0] is None:
            raise DeviceError(f"{self!r}.memory_stats(): the arrays' accounting is not "
                              "loaded; import spmd (not only spmd.mesh) first")
        return MEMORY_STATS[0](self.id)


# The arrays' layer answers memory_stats (spmd.shard.arrays.memory.stats, installed by
# spmd.shard.register): this layer knows devices, not arrays.
MEMORY_STATS: list = [None]


@functools.lru_cache(maxsize=None)
def _runtime():
    """(process_index, process_count, local device count, platform), decided once."""
    return process.describe()


def process_index() -> int:
    """This process's rank (0 without MPI)."""
    return _runtime()[0]


def process_count() -> int:
    return _runtime()[1]


@functools.lru_cache(maxsize=None)
def devices() -> list[Device]:
    """All devices of the job, ordered by process, then local id (the same on every rank)."""
    _, nproc, nlocal, platform = _runtime()
    return [Device(p * nlocal + i, p, i, platform) for p in range(nproc) for i in range(nlocal)]


def local_devices() -> list[Device]:
    """This process's devices."""
    me = process_index()
    return [d for d in devices() if d.process_index == me]


def device_count() -> int:
    return len(devices())


def local_device_count() -> int:
    return len(local_devices())


def reset_for_tests() -> None:
    """Forget the cached device configuration (tests change the environment)."""
    _runtime.cache_clear()
    devices.cache_clear()
    platform.reset()  # the platform and its array module are decided again
