"""The checkpoint protocol's exchanges between processes: its own communicator, the
agreement that a step went well everywhere, and the error every process raises.

>>> from spmd.checkpointing import coordination
>>> coordination.all_ok(True, "writing the blocks")   # raises on all unless all are ok
"""

from __future__ import annotations

import time

import numpy as np

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



# Between two tests of a background save's requests: MPI's own waits spin a core, the
# core training runs on where a rank is bound to one (a 13 ms wait for the slowest
# rank's files cost the step 13 ms of its core); a sleep gives it back, and adds at
# most this much to a save that the program does not wait for.
PAUSE_S = 2e-4


def wait_quietly(done, what: str) -> None:
    """Wait until ``done()`` holds, sleeping between tries instead of spinning (for a
    background thread's MPI requests: ``done`` tests them, which also moves them on).

    >>> wait_quietly(lambda: all([r.Test() for r in requests]), "sending the copy")  # doctest: +SKIP
    """
    if done():
        return
    with watched(what):
        while not done():
            time.sleep(PAUSE_S)


def agree_quietly(error: BaseException | None, what: str) -> None:
    """:func:`all_ok` for a background thread: raise on every process unless ``error``
    is None on all, with the first failing process's words; waits by
    :func:`wait_quietly`."""
    comm = communicator()
    if comm is None:
        if error is not None:
            raise error
        return
    flags = np.zeros(comm.Get_size(), np.uint8)
    request = comm.Iallgather(np.array([error is not None], np.uint8), flags)
    wait_quietly(lambda: request.Test(), what)
    bad = [int(r) for r in np.flatnonzero(flags)]
    if not bad:
        return
    mine = None if error is None else (
        str(error) if isinstance(error, CheckpointError) else f"{type(error).__name__}: {error}")
    with watched(what):  # (every process is here: all saw the same flags)
        texts = comm.allgather(mine)
    raise CheckpointError(f"{what} failed on process(es) {bad}: {texts[bad[0]]}") from error
