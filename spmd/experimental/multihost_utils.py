"""``spmd.experimental.multihost_utils``: exchanges between the processes of a job,
on host values, as ``jax.experimental.multihost_utils`` has them.  Every process of
the job must call each of them, in the same order (they are collectives over all
processes); in a single process they return at once.

>>> from spmd.experimental import multihost_utils
>>> multihost_utils.sync_global_devices("before saving")
>>> seed = multihost_utils.broadcast_one_to_all(np.int32(seed))   # process 0's seed
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.errors import ArgumentError, ProgramMismatchError
from spmd.mesh import process_count, process_index
from spmd.shard.arrays.multiprocess import process_allgather

__all__ = ["broadcast_one_to_all", "process_allgather", "sync_global_devices"]


def broadcast_one_to_all(in_tree: Any, is_source: bool | None = None) -> Any:
    """The source process's values of ``in_tree`` (a pytree of arrays or scalars), as
    numpy arrays, on every process.  The source is process 0 unless ``is_source`` says
    (True on exactly one process).  Each leaf must have the same shape and dtype on
    every process.  JAX sums the values of several sources (its broadcast is a psum
    of zeros elsewhere); spmd raises, on every process, unless exactly one is.

    >>> step = broadcast_one_to_all(np.int32(step))   # process 0's step everywhere
    """
    if is_source is None:
        is_source = process_index() == 0
    if not isinstance(is_source, (bool, np.bool_)):
        raise ArgumentError(f"broadcast_one_to_all: is_source must be True or False (or "
                            f"None: process 0), got {is_source!r}")
    flags = process_allgather(np.int32(bool(is_source)))
    sources = [int(p) for p in np.flatnonzero(flags)]
    if len(sources) != 1:
        raise ArgumentError(f"broadcast_one_to_all: exactly one process must be the source "
                            f"(is_source=True), got processes {sources}; pass is_source=True "
                            "on one process only, or None everywhere for process 0")
    for leaf in tree_util.tree_leaves(in_tree):
        if not getattr(leaf, "is_fully_addressable", True):
            raise ArgumentError(f"broadcast_one_to_all: got an Array spread over processes "
                                f"({leaf.sharding!r}); its value is one global value already: "
                                "pass process-local values (numpy, or Arrays of this "
                                "process's devices)")
    src = sources[0]
    # One allgather per leaf (the values of every process, stacked); the source's row.
    return tree_util.tree_map(lambda x: np.asarray(process_allgather(x)[src]), in_tree)


def sync_global_devices(name: str) -> None:
    """Wait until every process of the job has reached this call, and check that they
    all called it with the same ``name`` (raised on every process otherwise, naming
    each process's name: they are at different points of the program).

    >>> sync_global_devices("checkpoint written")
    """
    if not isinstance(name, str):
        raise ArgumentError(f"sync_global_devices: name must be a str naming this point "
                            f"of the program, got {name!r}")
    if process_count() == 1:
        return
    digest = np.frombuffer(hashlib.blake2b(name.encode(), digest_size=16).digest(), np.uint8)
    rows = process_allgather(digest)  # the barrier: no process leaves before all came
    if not all((r == rows[0]).all() for r in rows):
        names = process_allgather(np.frombuffer(name.encode().ljust(64, b"\0")[:64], np.uint8))
        seen = {p: bytes(r).rstrip(b"\0").decode(errors="replace") for p, r in
                enumerate(names)}
        raise ProgramMismatchError(f"sync_global_devices: the processes reached different "
                                   f"points: names by process {seen}; each must call it "
                                   "with the same names in the same order")
