"""Where a job keeps checkpoints in memory, and their removal when the job ends.

The fast tier of :mod:`spmd.checkpointing.memory` lives in each node's
``/dev/shm/spmd-tier-<job>/``.  ``<job>`` is ``$SPMD_JOB_ID``, which ``spmd-run``
sets once per run and keeps through its restarts, so the next attempt finds what
the previous one kept; ``spmd-run`` removes the directory on every host the job
used once the job has ended, however it ended.  This module is the launch
layer's part: the name, the variable and the removal (the launcher loads no
checkpointing code).

>>> job_dir("3f2a9c0d1e7b4a55")
'/dev/shm/spmd-tier-3f2a9c0d1e7b4a55'
"""

from __future__ import annotations

import os
import re
import shutil
import uuid

JOB_ENV = "SPMD_JOB_ID"
PREFIX = "spmd-tier-"
SHM = "/dev/shm"
MARK = "memory-tier"  # in the attempt's launch directory: some rank kept a step in memory

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class MemoryTierError(ValueError):
    """``$SPMD_JOB_ID`` is unusable as a directory name."""


def new_job_id() -> str:
    """A fresh job id (``spmd-run`` makes one per run)."""
    return uuid.uuid4().hex[:16]


def job_id(environ=None) -> str | None:
    """``$SPMD_JOB_ID`` checked (None when unset or empty).

    >>> job_id({"SPMD_JOB_ID": "run-7"})
    'run-7'
    """
    raw = (os.environ if environ is None else environ).get(JOB_ENV, "")
    if not raw:
        return None
    if not _ID.match(raw) or raw in (".", ".."):
        raise MemoryTierError(
            f"{JOB_ENV}={raw!r} cannot name a directory; use 1-64 letters, digits, '.', "
            "'_' or '-' (spmd-run sets it for you)")
    return raw


def attempt(environ=None) -> int:
    """This run's restart attempt, as ``spmd-run`` numbers them (0 outside it): the
    in-memory steps of attempts before it are told apart by it.

    >>> attempt({"SPMD_RESTART_ATTEMPT": "2"})
    2
    """
    return int((os.environ if environ is None else environ).get("SPMD_RESTART_ATTEMPT", "0")
               or 0)


def job_dir(job: str, root: str = SHM) -> str:
    """The job's directory of in-memory checkpoints on this node."""
    return os.path.join(root, PREFIX + job)


def remove(job: str, root: str = SHM) -> bool:
    """Remove the job's in-memory checkpoints on this node; whether there were any.

    >>> remove("3f2a9c0d1e7b4a55")                               # doctest: +SKIP
    True
    """
    path = job_dir(job, root)
    if not os.path.lexists(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def note_used(environ=None) -> None:
    """Tell ``spmd-run`` that this job keeps steps in memory (a mark in the attempt's
    launch directory, ``$SPMD_LAUNCH_DIR``, which every host shares): only then does it
    run the removal pass on the hosts at the end.  Nothing without the directory."""
    launch_dir = (os.environ if environ is None else environ).get("SPMD_LAUNCH_DIR")
    if launch_dir and os.path.isdir(launch_dir):
        try:
            open(os.path.join(launch_dir, MARK), "a").close()
        except OSError:
            pass  # (the pass then runs anyway: see used())


def used(launch_dir: str) -> bool:
    """Whether a rank of the attempt run in ``launch_dir`` kept a step in memory."""
    return os.path.exists(os.path.join(launch_dir, MARK))
