"""How the devices of a batch level that stands for mesh axes lie over processes.

A level of the compiler's batching (``NamedAxes``) carries one of these, opaque to
the compiler, when only some of the mesh's devices are stacked in this process; the
collectives read it to build the group that moves blocks between processes
(:class:`spmd.collectives.process_group.ProcessGroup`).

>>> ProcessLayout(local=(0, 1), procs=(0, 0, 1, 1), me=0).local
(0, 1)
"""

from __future__ import annotations

from typing import NamedTuple


class ProcessLayout(NamedTuple):
    """``local``: the flat mesh positions stacked in this process, in order;
    ``procs``: the process of every flat position; ``me``: this process."""

    local: tuple
    procs: tuple
    me: int
