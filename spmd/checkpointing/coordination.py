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
from spmd.launch import affinity
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


# How a background save waits for its MPI requests.  On the cores no rank took
# (:func:`spmd.launch.affinity.to_spare_cores`) it waits in MPI, which spins and so
# moves the transfer on at once; MPI's progress is shared by the threads, so a
# transfer left waiting is done piece by piece inside the training thread's own
# collectives (8 ranks on 13 cores: the write took 114 ms a step that way, 33 ms
# waiting in MPI).  On its rank's cores a spinning wait would take the core from
# training instead (13 ms a step, for the slowest rank's files): there it tests and
# sleeps this long between tests.
PAUSE_S = 2e-4


def settle(requests: list, what: str) -> None:
    """Wait for a background thread's MPI ``requests`` (see ``PAUSE_S``).

    >>> settle([comm.Isend(buf, dest=1, tag=7)], "sending the copy")  # doctest: +SKIP
    """
    if not requests:
        return
    with watched(what):
        if affinity.on_spare_cores():
            for r in requests:
                r.Wait()  # (mpi4py lets go of the GIL while MPI waits)
        else:
            while not all([r.Test() for r in requests]):  # (each tested: each moves on)
                time.sleep(PAUSE_S)


def receive(comm, source: int, tag: int, what: str):
    """A background thread's ``comm.recv(source=source, tag=tag)``, waiting as
    :func:`settle` does."""
    with watched(what):
        if not affinity.on_spare_cores():
            while not comm.Iprobe(source=source, tag=tag):
                time.sleep(PAUSE_S)
        return comm.recv(source=source, tag=tag)


def agree_quietly(error: BaseException | None, what: str) -> None:
    """:func:`all_ok` for a background thread: raise on every process unless ``error``
    is None on all, with the first failing process's words; waits by
    :func:`settle`."""
    comm = communicator()
    if comm is None:
        if error is not None:
            raise error
        return
    flags = np.zeros(comm.Get_size(), np.uint8)
    settle([comm.Iallgather(np.array([error is not None], np.uint8), flags)], what)
    bad = [int(r) for r in np.flatnonzero(flags)]
    if not bad:
        return
    mine = None if error is None else (
        str(error) if isinstance(error, CheckpointError) else f"{type(error).__name__}: {error}")
    with watched(what):  # (every process is here: all saw the same flags)
        texts = comm.allgather(mine)
    raise CheckpointError(f"{what} failed on process(es) {bad}: {texts[bad[0]]}") from error
