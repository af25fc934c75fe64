"""Which node each rank is on: the one answer every node-aware choice reads.

A *node* is a set of ranks that share a machine: its memory (the MPI backend's
shared-memory window, :mod:`spmd.collectives.mpi.shm`), its GPUs (each rank takes
the GPU of its index on the node, :mod:`spmd.launch.platform`; NCCL's check that
no two ranks share a GPU compares node names and PCI bus ids,
:mod:`spmd.collectives.nccl`) and its cores (``spmd-run``'s thread counts).

Real nodes come from MPI (``Split_type(COMM_TYPE_SHARED)``) and the launcher's
variables (``MPI_LOCALRANKID``, ``OMPI_COMM_WORLD_LOCAL_RANK``, ``SLURM_LOCALID``,
...).  ``SPMD_SIMULATE_NODES=K`` (a test setting) makes an MPI job's ranks see ``K``
nodes so that the multi-node branches run on one machine: node ``k`` holds a
contiguous block of world ranks, the first ``n % K`` nodes one rank more than the
others (``n`` ranks).  A simulated node only ever splits a real node further: a
rank's node is the pair (real node, simulated node), so two ranks share a node when
they share both.

>>> [list(r) for r in blocks(5, 2)]       # 5 ranks on 2 nodes: 3 + 2
[[0, 1, 2], [3, 4]]
>>> node_of(3, 5, 2), node_of(2, 5, 2)
(1, 0)

Outside an MPI job (one process, one node) the setting is not read.  ``K`` must be
a whole number from 1 to the job's size; anything else is an ArgumentError on
every rank alike, and members of a communicator that read different values are
stopped (:func:`check_agreed`) before they would choose differently.
"""

from __future__ import annotations

import os
import socket
import sys

from spmd.errors import ArgumentError
from spmd.launch import mpi_init as mpi, runtime

ENV = "SPMD_SIMULATE_NODES"

# Launchers' variables for a rank's index among the ranks of its node, and their count.
LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                   "SLURM_LOCALID", "PMI_LOCAL_RANK")
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


# ----------------------------------------------------------------- the mapping

def blocks(size: int, k: int) -> list[range]:
    """The world ranks of each of ``k`` simulated nodes of a job of ``size`` ranks:
    contiguous blocks, the first ``size % k`` one rank longer.

    >>> [list(r) for r in blocks(4, 2)]
    [[0, 1], [2, 3]]
    """
    base, extra = divmod(size, k)
    starts = [i * base + min(i, extra) for i in range(k + 1)]
    return [range(starts[i], starts[i + 1]) for i in range(k)]


def node_of(rank: int, size: int, k: int) -> int:
    """The simulated node of world rank ``rank`` (of ``size``) among ``k`` nodes.

    >>> [node_of(r, 4, 2) for r in range(4)]
    [0, 0, 1, 1]
    """
    base, extra = divmod(size, k)
    long = extra * (base + 1)  # ranks on the first `extra` nodes, one longer
    return rank // (base + 1) if rank < long else extra + (rank - long) // base


def parse(raw: str | None, size: int) -> int | None:
    """``K`` from the text of ``SPMD_SIMULATE_NODES`` in a job of ``size`` ranks (None:
    unset or empty); ArgumentError naming the variable, the value and the fix.

    >>> parse("2", 4), parse(None, 4), parse(" ", 4)
    (2, None, None)
    """
    text = (raw or "").strip()
    if not text:
        return None
    fix = (f"set it to a number of nodes from 1 to the job's {size} ranks (e.g. {ENV}=2 "
           "splits the ranks into two contiguous halves), or unset it to use the real nodes")
    try:
        k = int(text)
    except ValueError:
        raise ArgumentError(f"{ENV}={raw!r} is not a whole number; {fix}") from None
    if not 1 <= k <= size:
        raise ArgumentError(f"{ENV}={raw!r}: a job of {size} ranks cannot be split into "
                            f"{k} nodes; {fix}")
    return k


# ------------------------------------------------------------ this process

def world_rank_size() -> tuple[int, int]:
    """This process's ``(rank, size)`` in the job; ``(0, 1)`` outside MPI.  From
    ``COMM_WORLD`` once MPI has started; before (the GPU is picked before MPI
    starts, and must not start it) from the launcher's variables when it set them.

    >>> world_rank_size()[1] >= 1
    True
    """
    if not runtime.launched_by_mpi():
        return 0, 1
    if not _mpi_started():
        rank = _env_int(runtime._RANK_VARS)
        size = _env_int(runtime._SIZE_VARS)
        if rank is not None and size is not None and size > 1:
            return rank, size
    comm = mpi.world()
    return comm.Get_rank(), comm.Get_size()


def _mpi_started() -> bool:
    """Whether this process has started MPI (mpi4py imported and initialised)."""
    started = sys.modules.get("mpi4py.MPI")
    return started is not None and bool(started.Is_initialized())


def simulated() -> int | None:
    """``K`` of ``SPMD_SIMULATE_NODES`` for this job (None: unset, or not an MPI job);
    read each time (tests change it), ArgumentError when invalid.

    >>> simulated() is None or simulated() >= 1
    True
    """
    raw = os.environ.get(ENV)
    if raw is None or not raw.strip():
        return None
    rank, size = world_rank_size()
    if size == 1:
        return None  # one process is one node, whatever the setting says
    return parse(raw, size)


def reading() -> tuple:
    """What this rank read, for :func:`check_agreed`: ``("ok", K or None)`` or
    ``("error", message)`` (never raises: every member must reach the exchange).

    >>> reading()[0] in ("ok", "error")
    True
    """
    try:
        return ("ok", simulated())
    except ArgumentError as e:
        return ("error", str(e))


def check_agreed(readings: list, ranks) -> int | None:
    """``K`` when every member's :func:`reading` (``readings[i]`` of world rank
    ``ranks[i]``) is the same valid one; else ArgumentError listing them -- raised by
    every member alike, since they all hold the same list.

    >>> check_agreed([("ok", 2), ("ok", 2)], (0, 1))
    2
    """
    if all(r == readings[0] for r in readings) and readings[0][0] == "ok":
        return readings[0][1]
    groups: dict = {}
    for rank, r in zip(ranks, readings):
        groups.setdefault(tuple(r), []).append(rank)

    def said(r):
        if r[0] == "error":
            return r[1]
        return f"{ENV}={r[1]}" if r[1] is not None else f"{ENV} unset"

    lines = "\n".join(f"  ranks {who}: {said(r)}" for r, who in groups.items())
    raise ArgumentError(f"the MPI ranks {list(ranks)} read different or invalid simulated "
                        f"nodes:\n{lines}\nGive every rank the same {ENV} (a number of "
                        "nodes from 1 to the job's size), or leave it unset")


def node_index() -> int:
    """This rank's simulated node (0 when nodes are not simulated).

    >>> node_index() >= 0
    True
    """
    k = simulated()
    if k is None:
        return 0
    rank, size = world_rank_size()
    return node_of(rank, size, k)


def node_ranks() -> range:
    """The world ranks of this rank's simulated node (every rank when nodes are not
    simulated; the real node may hold fewer: ask MPI, :func:`split_by_node`).

    >>> 0 in node_ranks()
    True
    """
    rank, size = world_rank_size()
    k = simulated()
    return range(size) if k is None else blocks(size, k)[node_of(rank, size, k)]


def node_name() -> str:
    """This rank's node, as a name: the host, and with simulated nodes its simulated
    node too (``"host/node1"``): ranks share a node when their names are equal.

    >>> node_name().startswith(socket.gethostname())
    True
    """
    k = simulated()
    host = socket.gethostname()
    return host if k is None else f"{host}/node{node_index()}"


def _env_int(names) -> int | None:
    for name in names:
        raw = os.environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def local_rank_size() -> tuple[int, int | None]:
    """``(index of this rank among the ranks of its node, their count or None when
    the launcher does not say)``; ``(0, None)`` outside MPI.

    From the launcher's variables; with simulated nodes, the part of this rank's
    simulated block on its real node, taking the launcher's real node to be a
    contiguous block of world ranks ending ``local size`` after its local rank 0 (the
    default placement of Hydra, Slurm and Open MPI; the collectives' node checks ask
    MPI and do not rely on it).

    >>> local_rank_size()[0] >= 0
    True
    """
    if not runtime.launched_by_mpi():
        return 0, None
    real_rank = _env_int(LOCAL_RANK_VARS) or 0
    real_size = _env_int(LOCAL_SIZE_VARS)
    k = simulated()
    if k is None:
        return real_rank, real_size
    rank, size = world_rank_size()
    block = blocks(size, k)[node_of(rank, size, k)]
    first = rank - real_rank  # the real node's first world rank
    lo = max(block.start, first)
    hi = block.stop if real_size is None else min(block.stop, first + real_size)
    return rank - lo, hi - lo


def split_by_node(comm):
    """A communicator of the members of ``comm`` on this rank's node: MPI's shared-memory
    split (the real node), split again by simulated node.  Collective over ``comm``;
    the caller frees it.  Members must have agreed on the setting first
    (:func:`check_agreed`): one that raised here would leave the others in the split.

    >>> from spmd.launch import mpi_init as mpi  # doctest: +SKIP
    >>> split_by_node(mpi.world()).Get_size()  # doctest: +SKIP
    2
    """
    from mpi4py import MPI

    real = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    k = simulated()
    if k is None:
        return real
    rank, size = world_rank_size()
    both = real.Split(color=node_of(rank, size, k), key=real.Get_rank())
    real.Free()
    return both


# ------------------------------------------------------------ before launch

def ranks_per_node(n: int, environ, simulate: bool = False) -> int:
    """The most ranks one node gets in a job of ``n`` ranks about to be launched, from
    the environment ``environ``: inside a multi-node Slurm allocation Hydra spreads
    the ranks over the nodes, otherwise they all run here.  ``simulate``: count the
    nodes of ``SPMD_SIMULATE_NODES`` too (a node's GPUs are numbered per simulated
    node; its cores are not: they stay the real node's).  An invalid setting counts
    as unset here: the ranks themselves raise the error that names it.

    >>> ranks_per_node(8, {"SLURM_JOB_NUM_NODES": "2"}), ranks_per_node(4, {})
    (4, 4)
    >>> ranks_per_node(4, {ENV: "2"}, simulate=True)
    2
    """
    nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or ""
    nodes = int(nodes) if nodes.isdigit() and int(nodes) > 0 else 1
    per_node = -(-n // nodes)
    k = None
    if simulate and n > 1:
        try:
            k = parse(environ.get(ENV), n)
        except ArgumentError:
            pass
    return per_node if k is None else min(per_node, -(-n // k))
