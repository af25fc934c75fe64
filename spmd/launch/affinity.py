"""Each rank on cores of its own: the placement ``spmd-run`` gives its ranks.

A rank left to the scheduler moves between cores: every move costs it its
caches, and a rank that busy-waits in a collective takes a core that another
rank's compute wanted.  Measured on a 13-core machine (weak scaling of the
transformer example, ``benchmarks/bench_scaling.py``, one call, same machine):
2 ranks made 5.3-5.6k tokens/s per rank unbound and 7.5-7.6k bound; 12 ranks
3.4k unbound and 4.7k bound.

So each rank of ``spmd-run`` binds itself, as it starts, to ``t`` cores of its
own (``t``: its engine and BLAS threads, ``OMP_NUM_THREADS``, which ``spmd-run``
sets to the node's cores over its ranks): local rank ``i`` of its node takes the
``i``-th group of ``t`` cores among those it may use (a Slurm or cgroup cpuset
is respected: the groups come from the process's own affinity mask).  It does
not bind when its node's ranks need more cores than the mask holds (binding
would then pin two ranks to one core, where the scheduler could still spread
them), nor when ``SPMD_BIND=none``.  Cores left over (13 cores, 8 ranks) take the
ranks' background threads, such as a checkpoint's writer (:func:`to_spare_cores`).

The rank's index on its node comes from the launcher (Hydra's
``MPI_LOCALRANKID``, Open MPI's, Slurm's ...); a launcher that sets none
(MPICH's ``gforker``, which runs every rank on one machine) leaves the world
rank, used only when the whole job fits the mask, so that distinct ranks still
get distinct cores.

>>> plan(local=1, local_size=4, threads=2, cores=list(range(8)))
[2, 3]
>>> plan(local=1, local_size=4, threads=2, cores=list(range(6))) is None  # too few
True
"""

from __future__ import annotations

import os

from spmd.errors import ArgumentError

ENV = "SPMD_BIND"
_CHOICES = ("cores", "none")

# The launchers' variables for a rank's index on its node and their count:
# one list, spmd.launch.nodes's.
from spmd.launch.nodes import LOCAL_RANK_VARS, LOCAL_SIZE_VARS  # noqa: E402
from spmd.launch import runtime  # noqa: E402


def plan(local: int, local_size: int, threads: int, cores: list[int]) -> list[int] | None:
    """The cores of local rank ``local`` of ``local_size`` ranks with ``threads``
    threads each, out of ``cores``; None when they do not all fit.

    >>> plan(0, 2, 1, [4, 5, 6])
    [4]
    """
    if threads < 1 or local_size < 1 or local_size * threads > len(cores) or local >= local_size:
        return None
    return sorted(cores)[local * threads:(local + 1) * threads]


def _int(environ, names) -> int | None:
    for name in names:
        raw = environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def setting(environ=os.environ) -> str:
    """``SPMD_BIND``'s value: ``cores`` (the default) or ``none``.

    >>> setting({}), setting({"SPMD_BIND": "none"})
    ('cores', 'none')
    """
    raw = environ.get(ENV, "").strip().lower() or "cores"
    if raw not in _CHOICES:
        raise ArgumentError(f"{ENV}={environ.get(ENV)!r} is not a binding; set it to 'cores' "
                            "(each rank on cores of its own, the default) or 'none' (leave "
                            "the ranks to the scheduler)")
    return raw


def bind_from_env(environ=os.environ) -> list[int] | None:
    """:func:`bind_this_rank` with the rank and job size the launcher announced
    (unbound outside a launched job).

    >>> bind_from_env({"SPMD_BIND": "none"}) is None
    True
    """

    rank, size = _int(environ, runtime._RANK_VARS), _int(environ, runtime._SIZE_VARS)
    if rank is None or size is None:
        return None
    return bind_this_rank(rank, size, environ)


def bind_this_rank(rank: int, size: int, environ=os.environ) -> list[int] | None:
    """Bind this process to its cores as the module docstring says; returns them, or
    None when it stays unbound.  Called by ``spmd.launch._rank`` as a rank starts.

    >>> bind_this_rank(0, 1, {"SPMD_BIND": "none"}) is None
    True
    """
    if setting(environ) == "none" or not hasattr(os, "sched_setaffinity"):
        return None
    local, local_size = _int(environ, LOCAL_RANK_VARS), _int(environ, LOCAL_SIZE_VARS)
    if local is None:
        local, local_size = rank, size  # every rank may be here: distinct cores anyway
    elif local_size is None:
        local_size = size
    threads = _int(environ, ("SPMD_NUM_THREADS", "OMP_NUM_THREADS")) or 1
    cores = sorted(os.sched_getaffinity(0))
    chosen = plan(local, local_size, threads, cores)
    if chosen is not None:
        os.sched_setaffinity(0, chosen)
        _spare[:] = cores[local_size * threads:]
    return chosen


_spare: list[int] = []  # the mask's cores that no rank of this node is bound to


def on_spare_cores() -> bool:
    """Whether the calling thread runs on the spare cores only (:func:`to_spare_cores`
    put it there), where it may spin without taking a rank's core.

    >>> on_spare_cores()          # the main thread of a rank                # doctest: +SKIP
    False
    """
    return bool(_spare) and os.sched_getaffinity(0) == set(_spare)


def to_spare_cores() -> list[int] | None:
    """Move the calling thread onto the cores that no rank of this node is bound to,
    where there are some; returns them, or None (it stays on its rank's cores).  For a
    background thread (a checkpoint's writer): on its rank's cores it takes their
    time from training (on 13 cores, 8 ranks leave 5 that nothing uses).

    >>> threading.Thread(target=lambda: (to_spare_cores(), write())).start()  # doctest: +SKIP
    """
    if not _spare:
        return None
    try:
        os.sched_setaffinity(0, _spare)  # (0: the calling thread only, on Linux)
    except OSError:
        return None
    return list(_spare)
