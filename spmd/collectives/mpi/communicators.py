"""The MPI transport's communicators: one per ordered set of world ranks, made by the
first collective over them (collectively over its members), with its control twin
(:mod:`spmd.collectives.mpi.control`), and the algorithm settings its members must
read alike.

>>> from spmd.collectives.mpi import communicators
>>> communicators.communicator((0, 1)).Get_size()  # doctest: +SKIP
2
"""

from __future__ import annotations

import functools
import os

from spmd.collectives.mpi import settings
from spmd.collectives.mpi.control import Collective, Site, checking, register
from spmd.errors import ArgumentError
from spmd.launch import nodes
from spmd.launch.mpi_init import world as _world


def world():
    """The world communicator (mpi4py's, initialising MPI on first use)."""
    return _world()


_comms: dict = {}  # ranks -> the data communicator of that group


def communicator(ranks: tuple, what=None):
    """A communicator over world ``ranks`` in that order (rank i of it is ranks[i]),
    made by the first collective over them (``what``: that collective, for reports)."""
    comm = _comms.get(ranks)
    return comm if comm is not None else _make_communicator(ranks, what)


def _make_communicator(ranks: tuple, what):
    """Make the data and control communicators of ``ranks``, collectively over them.

    Watched like a collective (the deadline and ``spmd-run``'s check for ranks that
    finished): a member that exits or skips its first call would otherwise leave the
    others in ``MPI_Comm_dup`` for ever, with no report."""
    site = what.setting_up() if isinstance(what, Site) else \
        Site(str(what or "a collective"), phase="setting up the communicator of its ranks")
    with Collective(ranks, site, control_traffic=True, checked=False):
        comm = _comms.get(ranks)
        if comm is not None:  # another thread of this process made it meanwhile
            return comm
        comm = world()
        if len(ranks) != comm.Get_size() or ranks != tuple(range(len(ranks))):
            comm = comm.Create_group(comm.Get_group().Incl(list(ranks)))
        ctl = register(ranks, comm)  # its control twin (spmd.collectives.mpi.control)
        _agree_settings(ranks, ctl)
        _comms[ranks] = comm
    return comm


def _settings() -> tuple:
    """The environment settings that choose a collective's algorithm (every member must
    choose alike), or the error reading them gave."""
    try:
        return ("ok", settings.size_range(), split_bytes(), checking(), nodes.simulated(),
                settings.min_bytes())
    except ArgumentError as e:
        return ("error", str(e))


def _agree_settings(ranks: tuple, ctl) -> None:
    """Check, once per communicator, that its members read the same algorithm settings
    (``SPMD_MPI_SHM_MIN_BYTES``, ``SPMD_MPI_SHM_MAX_BYTES``,
    ``SPMD_MPI_ALLREDUCE_SPLIT_BYTES``, ``SPMD_CHECK_COLLECTIVES``,
    ``SPMD_SIMULATE_NODES``, ``SPMD_MPI_HIER_MIN_BYTES``): members choosing
    differently would pair one member's shared-memory barrier, or collective check,
    with another's MPI call.  Every member raises alike."""
    every = ctl.allgather(_settings())
    if all(e == every[0] for e in every) and every[0][0] == "ok":
        return
    lines = "\n".join(f"  rank {r}: " + (f"(min, slot) = {e[1]}, split = {e[2]}, check = {e[3]}, "
                                          f"simulated nodes = {e[4]}, hierarchy from = {e[5]}"
                                          if e[0] == "ok" else e[1])
                      for r, e in zip(ranks, every))
    raise ArgumentError(
        f"the MPI ranks {list(ranks)} read different or invalid collective settings:\n{lines}\n"
        "Give every rank the same SPMD_MPI_SHM_MIN_BYTES, SPMD_MPI_SHM_MAX_BYTES, "
        "SPMD_MPI_ALLREDUCE_SPLIT_BYTES, SPMD_CHECK_COLLECTIVES, SPMD_SIMULATE_NODES and "
        "SPMD_MPI_HIER_MIN_BYTES (or leave them unset)")



# From this many bytes on, an all-reduce that MPI runs (members on several
# nodes, shared memory off, or an all-reduce started without waiting past a
# slot of spmd.collectives.mpi.shm) is a reduce-scatter + all-gather (in place,
# into one buffer).  Measured with the PyPI mpich wheel (5.0) on 2 and
# 4 ranks (benchmarks/results/mpi_n2.json, mpi_n4.json, 2026-12-01, quiet machine):
# Allreduce is 2.1-2.5x slower at 32 MiB (it maps fresh scratch memory on every
# large call) and 1.2-1.3x slower at 4 MiB; the two are even at 256 KiB on 2 ranks
# and Allreduce is faster there on 4.
# SPMD_MPI_ALLREDUCE_SPLIT_BYTES overrides it (0: never split).
ALLREDUCE_SPLIT_BYTES = 2 * 1024 * 1024


@functools.lru_cache(maxsize=None)
def split_bytes() -> int:
    raw = os.environ.get("SPMD_MPI_ALLREDUCE_SPLIT_BYTES", "").strip()
    try:
        value = int(raw) if raw else ALLREDUCE_SPLIT_BYTES
    except ValueError:
        raise ArgumentError(f"SPMD_MPI_ALLREDUCE_SPLIT_BYTES={raw!r} is not a number of "
                            f"bytes; unset it for the default ({ALLREDUCE_SPLIT_BYTES}), or "
                            "0 to never split") from None
    return value if value > 0 else 1 << 62
