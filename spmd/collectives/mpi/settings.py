"""The MPI transport's algorithm settings, read from the environment once.

Every member of a communicator must choose a collective's algorithm alike, so
:mod:`spmd.collectives.mpi.communicators` checks, when it makes a communicator, that
its members read the same values (``_agree_settings``); the shared window
(:mod:`~spmd.collectives.mpi.shm`) and the hierarchy across nodes
(:mod:`~spmd.collectives.mpi.hier`) read them here too.  Kept apart from those
modules so that making a communicator needs neither of them.

>>> from spmd.collectives.mpi import settings
>>> settings.size_range() == (settings.SHM_MIN_BYTES, settings.SHM_MAX_BYTES)  # unset
True
"""

from __future__ import annotations

import functools
import os

from spmd.errors import ArgumentError

SHM_MIN_BYTES = 16 * 1024        # below: MPI's all-reduce is faster (barrier cost)
SHM_MAX_BYTES = 2 * 1024 * 1024  # a slot: the largest operand in one piece (see shm._MOST)


def bytes_setting(name: str, default: int, zero: str = "") -> int:
    """A number of bytes >= 0 from environment variable ``name`` (``default`` when it
    is unset or empty); an ArgumentError naming the variable, its value and the fix
    otherwise (``zero``: what 0 does, added to the fix).

    >>> bytes_setting("SPMD_NO_SUCH_SETTING", 16)
    16
    """
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = -1
    if value < 0:
        raise ArgumentError(f"{name}={raw!r} is not a number of bytes >= 0; unset it for "
                            f"the default ({default})" + (f", or 0 {zero}" if zero else ""))
    return value


@functools.lru_cache(maxsize=None)
def size_range() -> tuple[int, int]:
    """``(smallest operand, slot)`` in bytes for the shared-memory collectives (from
    the environment once; slot ``0``: never)."""
    return (bytes_setting("SPMD_MPI_SHM_MIN_BYTES", SHM_MIN_BYTES),
            bytes_setting("SPMD_MPI_SHM_MAX_BYTES", SHM_MAX_BYTES,
                          "to turn the shared-memory path off"))


# Operands (per member) of this many bytes or more go through the hierarchy.
# Measured on 2 emulated nodes x 2 ranks (benchmarks/bench_multinode.py; see
# docs/performance.md, "Several nodes"): below, the hierarchy's three calls cost
# more than the flat call's one.
HIER_MIN_BYTES = 64 * 1024


@functools.lru_cache(maxsize=None)
def min_bytes() -> int:
    """The smallest operand in bytes that takes the hierarchical path, from
    ``SPMD_MPI_HIER_MIN_BYTES`` once (``0``: never; unset: :data:`HIER_MIN_BYTES`).

    >>> min_bytes() > 0
    True
    """
    value = bytes_setting("SPMD_MPI_HIER_MIN_BYTES", HIER_MIN_BYTES,
                          "to keep collectives across nodes flat")
    return value if value > 0 else 1 << 62
