"""Saving, in the calling thread or in the background: one save in flight at a time,
so checkpoints commit in the order they were asked for, and a failed background save
is never lost unnoticed.

>>> from spmd import checkpointing
>>> checkpointing.save("ckpt", {"params": params}, step=10, keep=2)
'ckpt/step_10'
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import warnings

from spmd.launch.timeline import recorder as _timeline
from spmd.profiler import host_span
from spmd.checkpointing import memory, writing
from spmd.checkpointing.coordination import CheckpointError
from spmd.launch import affinity
from spmd.launch.mpi_init import threads_may_call_mpi
from spmd.mesh import process_count


def save(directory: str, tree, *, step: int, keep: int | None = None,
         local: bool = False) -> str:
    """Save ``tree`` as ``<directory>/step_<step>``; every process must call it.

    Each process writes only the blocks its devices hold (replicated blocks
    once).  ``keep``: then delete all but the newest ``keep`` checkpoints.
    Returns the checkpoint's directory.  Waits for a pending :func:`save_async`
    first, so checkpoints commit in the order they were asked for.

    ``local=True`` keeps the step in memory instead, the fast tier of
    :mod:`spmd.checkpointing.memory`: each process's blocks in its node's
    ``/dev/shm`` and a copy on the next node's (``keep``: steps kept, default 1);
    :func:`restore` of ``directory`` reads it while it is newer than the steps on
    disk.  Returns the step's directory in this node's memory.

    >>> save("ckpt", {"params": params}, step=10, keep=2)
    'ckpt/step_10'
    >>> save("ckpt", {"params": params}, step=11, local=True)     # doctest: +SKIP
    '/dev/shm/spmd-tier-3f2a9c0d1e7b4a55/5be1c0a2d9e8f734/step_11.a0.s3'
    """
    with host_span("checkpoint save", "checkpoint", path=str(directory), step=step,
                   local=bool(local)):
        wait_pending()  # one save at a time uses the checkpoint communicator
        if local:
            return memory.write(memory.plan(directory, tree, step, keep))
        return writing.write(writing.plan(directory, tree, step, keep, copy=False))


class PendingSave:
    """A checkpoint being written by a background thread (see :func:`save_async`)."""

    def __init__(self, plan, background: bool = True, write=writing.write):
        self.path, self._write = plan.final, write
        self._error: BaseException | None = None
        self._reported = False  # whether its error reached the caller
        self._thread = threading.Thread(target=self._run, args=(plan,),
                                        name=f"spmd-checkpoint-{plan.step}", daemon=True)
        self._thread.start()
        if not background:
            self._thread.join()

    def _run(self, plan):
        t0 = time.monotonic()
        affinity.to_spare_cores()  # (none: it shares its rank's cores with training)
        try:
            self._write(plan)
        except BaseException as e:  # re-raised by wait() in the caller's thread
            self._error = e
        r = _timeline.ACTIVE
        if r is not None:  # (the background part: from its start to its commit)
            r.span("checkpoint save (background write)", "checkpoint", t0, time.monotonic(),
                   _timeline.HOST, {"path": self.path, "step": plan.step,
                                    "failed": self._error is not None})

    def done(self) -> bool:
        """True once the checkpoint is committed (or its save failed)."""
        return not self._thread.is_alive()

    def wait(self) -> str:
        """Block until the checkpoint is committed; return its directory, or raise the
        save's error."""
        self._thread.join()
        if self._error is not None:
            self._reported = True
            raise self._error
        return self.path


_pending: list[PendingSave] = []
_pending_lock = threading.Lock()


def save_async(directory: str, tree, *, step: int, keep: int | None = None,
               local: bool = False) -> PendingSave:
    """Start saving ``tree`` as ``<directory>/step_<step>`` in a background thread and
    return at once; every process must call it.

    The arguments are checked, and the blocks this process writes are copied,
    before it returns, so training may go on and change its arrays.  A second
    save (async or not) first waits for a pending one, so checkpoints commit in
    order and at most one is in flight; ``wait()`` on the
    returned handle re-raises a failed save's error.  The program waits for a
    pending save at exit.  ``local=True``: into memory, as :func:`save`'s.

    >>> pending = save_async("ckpt", state, step=200, keep=3)
    >>> ...                                   # more training steps
    >>> pending.wait()
    'ckpt/step_200'
    """
    # (The span: the part the caller waits for; the write has its own, _run's.)
    with _pending_lock, host_span("checkpoint save", "checkpoint", path=str(directory),
                                  step=step, asynchronous=True, local=bool(local)):
        # The plan's checks are collectives on the checkpoint communicator, which a
        # pending save's thread may still be using: one save at a time.
        wait_pending()
        plan = (memory.plan(directory, tree, step, keep) if local else
                writing.plan(directory, tree, step, keep, copy=True))
        if not _exit_hook:
            # Registered now, after MPI is up (the plan made the communicator), so that
            # it runs before MPI finalises at exit (atexit runs last-in, first-out).
            atexit.register(_wait_at_exit)
            _exit_hook.append(True)
        handle = PendingSave(plan, background=_threads_may_call_mpi(),
                             write=memory.write if local else writing.write)
        _pending.append(handle)
    return handle


def _threads_may_call_mpi() -> bool:
    """Whether a background thread may run the save's MPI calls while the main thread
    runs the program's collectives (MPI_THREAD_MULTIPLE; mpi4py asks for it)."""
    if process_count() == 1 or threads_may_call_mpi():
        return True
    warnings.warn("spmd.checkpointing.save_async: this MPI library was initialised without "
                  "MPI_THREAD_MULTIPLE, so the save runs in the calling thread",
                  RuntimeWarning, stacklevel=3)
    return False


def wait_pending() -> None:
    """Wait for every checkpoint started by :func:`save_async` to commit.  A failed
    save whose handle's ``wait()`` was never called raises here (a checkpoint must
    never go missing unnoticed); the others raise from ``wait()``."""
    failed = []
    while _pending:
        handle = _pending.pop(0)
        handle._thread.join()
        if handle._error is not None and not handle._reported:
            handle._reported = True
            failed.append(handle)
    if failed:
        raise CheckpointError(
            f"the asynchronous save of {failed[0].path} failed (its wait() was never "
            f"called): {failed[0]._error}") from failed[0]._error


_exit_hook: list = []


def _wait_at_exit() -> None:
    """At exit: let pending saves commit; say so loudly if one failed unnoticed."""
    try:
        wait_pending()
    except CheckpointError as e:
        print(f"spmd.checkpointing: {e}", file=sys.stderr, flush=True)

