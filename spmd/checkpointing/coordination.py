"""The checkpoint protocol's exchanges between processes: its own communicator, the
agreement that a step went well everywhere, and the error every process raises.

>>> from spmd.checkpointing import coordination
>>> coordination.all_ok(True, "writing the blocks")   # raises on all unless all are ok
"""

from __future__ import annotations

from spmd.collectives.mpi.control import Watched
from spmd.errors import SpmdError
from spmd.launch.mpi_init import world
from spmd.mesh import process_count

class CheckpointError(SpmdError, ValueError):
    """A checkpoint that is missing, incomplete, or does not match its target."""


_comm_cache: list = []


def communicator():
    """A communicator of all processes for the save protocol (None in one process).

    Its own duplicate of the world communicator: the barriers and flags of a save
    can never pair with a data collective of the program."""
    if process_count() == 1:
        return None
    if not _comm_cache:
        with watched("setting up"):
            _comm_cache.append(world().Dup())
    return _comm_cache[0]


def watched(what: str):
    """The protocol's exchanges are collective over every process: watched like a
    collective (the deadline, ``spmd-run``'s check for ranks that finished), so that a
    process that exits or never saves is reported instead of waited for."""
    return Watched(tuple(range(process_count())), f"checkpointing ({what})")


def all_ok(ok: bool, what: str) -> None:
    """Raise on every process unless ``ok`` holds on all of them (naming the ranks)."""
    comm = communicator()
    if comm is None:
        flags = [ok]
    else:
        with watched(what):
            flags = comm.allgather(ok)
    bad = [r for r, f in enumerate(flags) if not f]
    if bad:
        raise CheckpointError(f"{what} failed on process(es) {bad}; see their errors")


def bcast(value):
    """Process 0's ``value``, on every process."""
    comm = communicator()
    if comm is None:
        return value
    with watched("agreeing on a name"):
        return comm.bcast(value, root=0)

