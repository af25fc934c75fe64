"""The fast tier: checkpoints kept in the nodes' memory, which survive the loss of a node.

``save(directory, tree, step=k, local=True)`` keeps each process's blocks (each
distinct block once, by one of its holders) in its node's ``/dev/shm`` and a copy in
one process's on the next node.  :func:`spmd.checkpointing.restore` reads a step from
here when the live processes hold every saving process's blocks (their own or the
copies) of a step newer than the persistent checkpoint's, on any mesh; otherwise it
reads the persistent checkpoint.

Layout, per node: ``/dev/shm/spmd-tier-<job>/<key>/step_<k>.a<attempt>.s<save>/``
(``<save>``: the process's count of its saves, the same on every process; ``<job>``:
:mod:`spmd.launch.memory_tier`; ``<key>``: a digest of the persistent directory's
path, so two checkpoint series never mix), holding for each process ``r`` whose
blocks process ``w`` of this node keeps (``w == r`` or the copy) ``r<r>.w<w>.bin``
(the blocks' bytes, one after another) and ``r<r>.w<w>.json`` (where each block lies
in the file and in its array, the leaves, the size and the crc32 of the bytes),
written under temporary names and renamed, ``.json`` last; and ``commit.r<p>``,
written by each process ``p`` of the node once every process of the job has written
its files and its copy (an agreement).  A
step with a commit mark on any node was written whole everywhere.  After a commit
each process removes the node's older steps.

Nodes are told apart as :func:`spmd.launch.nodes.node_name` does (the host name,
or ``SPMD_SIMULATE_NODES``'s simulated nodes); on one node there is no copy (a lost process's
node, and its memory, are still there).  Within a step the blocks are disjoint (one
replica of each), so a block is read once, and each region a process restores is
checked to be covered exactly.

>>> checkpointing.save("ckpt", state, step=k, local=True)          # every step
>>> checkpointing.save("ckpt", state, step=k)                      # now and then
>>> state = checkpointing.restore("ckpt", target)                  # the newest of both
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import zlib

import numpy as np

from spmd import tree_util
from spmd.checkpointing import manifest, memory_blocks
from spmd.checkpointing.coordination import (CheckpointError, agree_quietly, communicator,
                                             receive, settle, watched)
from spmd.launch import memory_tier, nodes
from spmd.mesh import process_count, process_index
from spmd.shard.arrays.placing import make_array_from_callback

try:
    import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 names with numpy)
except ImportError:  # pragma: no cover - a dependency of tensorstore
    pass

FORMAT = 1
# step_<k>.a<attempt>.s<save>: a save's own directory, even of a step saved again
# (its files are never written over a committed save's).
_STEP = re.compile(r"^step_(\d+)\.a(\d+)\.s(\d+)$")
_saves = itertools.count()  # this process's saves: the same count on every process
_FILE = re.compile(r"r(\d+)\.w(\d+)\.json")
_SPARES = ".spare"  # dropped steps' block files, to be written over
_TAG_HEADER, _TAG_DATA = 7101, 7102  # the copy's messages on the checkpoint communicator


def tier_dir(directory: str, what: str = "save(local=True)") -> str:
    """This node's directory of in-memory steps of the checkpoints in ``directory``."""
    try:
        job = memory_tier.job_id()
    except memory_tier.MemoryTierError as e:
        raise CheckpointError(f"{what}: {e}") from None
    if job is None:
        raise CheckpointError(
            f"{what}: in-memory checkpoints need a job that outlives its processes, and "
            f"${memory_tier.JOB_ENV} is not set; run under spmd-run (which sets it, keeps "
            "the tier through restarts and removes it at the end), or set it to a name "
            "unique to this job and remove /dev/shm/spmd-tier-<name> after the job")
    key = hashlib.sha1(os.path.realpath(directory).encode()).hexdigest()[:16]
    return os.path.join(memory_tier.job_dir(job), key)


def enabled() -> bool:
    """Whether this job may hold in-memory checkpoints (``$SPMD_JOB_ID`` is set)."""
    try:
        return memory_tier.job_id() is not None
    except memory_tier.MemoryTierError:
        return True  # (tier_dir then names the bad value)


# ------------------------------------------------------------------ the nodes

_hosts_cache: list = []


def _hosts() -> list[str]:
    """Every process's node, by rank (one allgather, once): the host name, or with
    ``SPMD_SIMULATE_NODES`` the simulated node (:func:`spmd.launch.nodes.node_name`)."""
    if not _hosts_cache:
        comm = communicator()
        here = nodes.node_name()
        if comm is None:
            _hosts_cache.append([here])
        else:
            with watched("finding the nodes"):
                _hosts_cache.append(comm.allgather(here))
    return _hosts_cache[0]


def partners(hosts: list[str]) -> list[int | None]:
    """For each rank, the rank on the next node that keeps the copy of its blocks
    (the same position among that node's ranks, wrapped); None on one node.

    >>> partners(["a", "a", "b", "b"])
    [2, 3, 0, 1]
    >>> partners(["a", "a", "b"])
    [2, 2, 0]
    """
    by_node: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_node.setdefault(h, []).append(r)
    order = list(by_node)
    if len(order) == 1:
        return [None] * len(hosts)
    out: list[int | None] = []
    for r, h in enumerate(hosts):
        mine = by_node[h]
        there = by_node[order[(order.index(h) + 1) % len(order)]]
        out.append(there[mine.index(r) % len(there)])
    return out


# ------------------------------------------------------------------ saving

class TierPlan:
    """One process's part of one in-memory save: its blocks copied into one buffer,
    and the header that says where each lies."""

    def __init__(self, directory: str, tier: str, step: int, keep: int, header: dict,
                 buf: np.ndarray, error: Exception | None = None):
        self.directory, self.tier, self.step, self.keep = directory, tier, step, keep
        self.header, self.buf = header, buf
        self.error = error  # this process's failure to make it: write() raises it on all

    @property
    def final(self) -> str:
        """The step's directory on this node."""
        h = self.header
        return os.path.join(self.tier, f"step_{self.step}.a{h['attempt']}.s{h['save']}")


def plan(directory: str, tree, step, keep) -> TierPlan:
    """The plan of an in-memory save of ``tree``: this process's blocks (each distinct
    block once, by one of its holders: :mod:`~spmd.checkpointing.memory_blocks`), their
    bytes copied now so that training may go on and change its arrays."""
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"save(local=True): step must be an integer >= 0, got {step!r}")
    if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 1):
        raise CheckpointError(f"save(local=True): keep must be an integer >= 1 or None, got "
                              f"{keep!r}")
    me = process_index()
    save = next(_saves)  # (every process counts every call: alike everywhere)
    try:
        tier = tier_dir(directory)
        layout, leaves = memory_blocks.layout_of(tree)
        header = {"format": FORMAT, "step": int(step), "world": process_count(), "rank": me,
                  "host": socket.gethostname(), "attempt": memory_tier.attempt(),
                  "leaves": layout.metas, "blocks": layout.entries, "size": layout.total}
        made = TierPlan(directory, tier, int(step), keep or 1, header,
                        memory_blocks.copy(layout, leaves))
    except Exception as e:
        # Not agreed on here, which would cost every step a wait for the slowest
        # process: :func:`write` tells every process, which then all raise.
        made = TierPlan(directory, "", int(step), keep or 1,
                        {"rank": me, "size": 0, "attempt": memory_tier.attempt()},
                        np.empty(0, np.uint8), e)
    made.header["save"] = save
    if save == 0:
        memory_tier.note_used()  # (spmd-run then removes the memory on every host)
    return made


def write(plan: TierPlan) -> str:
    """Keep ``plan``'s blocks in this node's memory and its copy on the partner's; once
    every process has done both, mark the step committed and drop the node's older
    steps.  Returns the step's directory on this node.  It runs beside training: its
    waits are :func:`~spmd.checkpointing.coordination.settle`'s."""
    comm, me = communicator(), process_index()
    header = dict(plan.header, crc32=zlib.crc32(plan.buf))
    dest = partners(_hosts())
    sends = []
    if dest[me] is not None:  # posted first: the partner's receive never waits in vain
        with watched("sending the in-memory copy"):
            sends = [comm.isend(header, dest=dest[me], tag=_TAG_HEADER),
                     comm.Isend(plan.buf, dest=dest[me], tag=_TAG_DATA)]
    # The transfers first, while this thread waits on them (settle): left to go on
    # alone, MPI would do them inside training's collectives.
    copies = []
    for src in (r for r, d in enumerate(dest) if d == me):
        got = receive(comm, src, _TAG_HEADER, "receiving an in-memory copy")
        data = memory_blocks.buffer(f"copy of {src}", got["size"])
        copies.append((got, data, comm.Irecv(data, source=src, tag=_TAG_DATA)))
    settle(sends + [r for _, _, r in copies], "exchanging the in-memory copies")
    error = plan.error
    if error is None:
        try:
            os.makedirs(plan.final, exist_ok=True)
            _write_files(plan.final, header, plan.buf)
        except OSError as e:
            error = e
    for got, data, _ in copies:
        if error is None and "leaves" in got:  # (none: the sender failed, and says so)
            error = _keep_copy(plan.final, got, data)
    agree_quietly(error, f"in-memory save of step {plan.step}" +
                  (f" into {plan.final}" if plan.tier else ""))
    open(os.path.join(plan.final, f"commit.r{me}"), "w").close()
    _prune(plan.tier, plan.keep, (plan.header["attempt"], plan.header["save"]))
    return plan.final


def _keep_copy(path: str, header: dict, data: np.ndarray) -> Exception | None:
    # (Its crc32 is checked when it is read: MPI delivers what was sent.)
    try:
        _write_files(path, header, data)
    except OSError as e:
        return e
    return None


def _spare(path: str) -> str | None:
    """A file this process wrote for a step since dropped, to be written over (its
    memory pages are there already: writing a new 5 MB file into /dev/shm took 3.9 ms,
    over an old one 1.3 ms); None when there is none."""
    spares = os.path.join(os.path.dirname(path), _SPARES)
    try:
        names = [n for n in os.listdir(spares) if n.startswith(f"w{process_index()}.")]
    except OSError:
        return None
    return os.path.join(spares, names[0]) if names else None


def _write_files(path: str, header: dict, data: np.ndarray) -> None:
    """``r<rank>.w<me>.bin`` then its ``.json``, each under a temporary name first: a
    header on file means its bytes are all there."""
    name = os.path.join(path, f"r{header['rank']}.w{process_index()}")
    spare = _spare(path)
    if spare is not None:
        os.replace(spare, name + ".bin.tmp")
    with open(name + ".bin.tmp", "r+b" if spare is not None else "wb") as f:
        f.write(memoryview(data))
        f.truncate()
    os.replace(name + ".bin.tmp", name + ".bin")
    with open(name + ".json.tmp", "w") as f:
        json.dump(header, f)
    os.replace(name + ".json.tmp", name + ".json")


def _prune(tier: str, keep: int, current: tuple[int, int]) -> None:
    """Drop all but the ``keep`` latest committed saves on this node, up to ``current``
    (attempt, save): the older ones, and what failed or dead attempts left.  A later
    save's directory is never touched: another process of the node may be writing it
    already while this one prunes.  The block files this process wrote in what is
    dropped are kept aside, to be written over by its next saves (:func:`_spare`)."""
    steps = [entry for entry in _steps(tier) if entry[1] <= current]
    committed = sorted((order, name) for _, order, name, _, ok in steps if ok)
    kept = {name for _, name in committed[-keep:]}
    spares = os.path.join(tier, _SPARES)
    for _, _, name, _, _ in steps:
        if name in kept:
            continue
        os.makedirs(spares, exist_ok=True)
        mine = f"w{process_index()}"
        try:
            for f in os.listdir(os.path.join(tier, name)):
                if f.split(".")[1:] == [mine, "bin"]:  # (its own: the node's others do theirs)
                    os.replace(os.path.join(tier, name, f),
                               os.path.join(spares, f"w{process_index()}.{name}.{f}"))
        except OSError:
            pass  # (removed meanwhile: nothing to keep)
        shutil.rmtree(os.path.join(tier, name), ignore_errors=True)


def _steps(tier: str) -> list[tuple[int, tuple[int, int], str, dict[int, str], bool]]:
    """(step, (attempt, save), name, {saving rank: its file's stem here}, committed) per
    step directory on this node.  A file's stem ``r<rank>.w<writer>`` names the process
    whose blocks it holds and the one that wrote it (nodes simulated on one machine
    share a /dev/shm: a copy then never has its original's name)."""
    out = []
    for name in sorted(os.listdir(tier)) if os.path.isdir(tier) else []:
        m = _STEP.match(name)
        if not m:
            continue
        try:
            files = os.listdir(os.path.join(tier, name))
        except OSError:  # removed meanwhile by another process of the node
            continue
        ranks = {}
        for f in sorted(files):
            held = _FILE.fullmatch(f)
            if held:
                ranks.setdefault(int(held.group(1)), f[:-5])
        out.append((int(m.group(1)), (int(m.group(2)), int(m.group(3))), name, ranks,
                    any(f.startswith("commit.") for f in files)))
    return out


# ------------------------------------------------------------------ restoring

class TierDamaged(CheckpointError):
    """An in-memory step that turned out damaged as it was read (restore then reads
    the persistent checkpoint)."""


class Found:
    """A step that the live processes' nodes hold whole: for each saving process,
    the live process that reads its blocks and the file's stem (``reader``)."""

    def __init__(self, step: int, name: str, world: int,
                 reader: dict[int, tuple[int, str]]):
        self.step, self.name, self.world, self.reader = step, name, world, reader


def _listing(tier: str) -> list[tuple]:
    """(step, (attempt, save), name, saving processes, {rank: file stem} held here) of
    this node's committed steps."""
    out = []
    for step, order, name, ranks, committed in _steps(tier):
        if committed and ranks:
            try:
                with open(os.path.join(tier, name, next(iter(ranks.values())) + ".json")) as f:
                    world = int(json.load(f)["world"])
            except (OSError, ValueError, KeyError):
                continue  # (damaged: never picked)
            out.append((step, order, name, world, ranks))
    return out


def newest(directory: str, step: int | None = None) -> Found | None:
    """The newest step (or ``step``) that the nodes of the live processes hold whole
    in memory; collective over every process (None: none, or no tier in this job)."""
    def mine():  # (every process takes part, with or without a job id of its own)
        return _listing(tier_dir(directory, "restore")) if enabled() else []

    listings = manifest.agreed(communicator(), mine,
                               "restore (listing the in-memory checkpoints)", CheckpointError,
                               share=True)
    held: dict[tuple, dict[int, tuple[int, str]]] = {}
    for rank, listing in enumerate(listings):
        for s, order, name, world, ranks in listing:
            readers = held.setdefault((s, tuple(order), name, world), {})
            for r, stem in ranks.items():
                readers.setdefault(int(r), (rank, stem))  # (the lowest live rank holding it)
    whole = [key for key, readers in held.items()
             if set(readers) == set(range(key[3])) and (step is None or key[0] == step)]
    if not whole:
        return None
    key = max(whole)
    return Found(key[0], key[2], key[3], held[key])


def read(directory: str, found: Found, check):
    """The tree saved as ``found``, placed by the target: each saving process's blocks
    read (and their crc32 checked) once, by the process ``found.reader`` names, and
    each region sent to the processes whose devices need it.  ``check(meta)``:
    ``(plans, treedef)`` of the target checked against the saved leaves, plans as
    ``(leaf, shape, sharding or None)`` in the target's order."""
    comm, me = communicator(), process_index()
    mine = [(r, stem) for r, (reader, stem) in sorted(found.reader.items()) if reader == me]

    def load():  # (a reader listed the files: its job id names them)
        path = os.path.join(tier_dir(directory, "restore"), found.name) if mine else ""
        return [_load(path, r, stem, found) for r, stem in mine]

    held = manifest.agreed(comm, load, f"restore of the in-memory step {found.step}",
                           TierDamaged)
    leaves = held[0][0]["leaves"] if found.reader[0][0] == me else None
    if comm is not None:
        with watched("restore (the saved leaves)"):
            leaves = comm.bcast(leaves, root=found.reader[0][0])
    plans, treedef = check({"leaves": leaves})
    position = {leaf["path"]: j for j, (leaf, _, _) in enumerate(plans)}
    sends = _pieces(held, leaves, position, plans, process_count())
    received = sends[0] if comm is None else _exchange(comm, sends)
    arrays = manifest.agreed(comm, lambda: _assemble(plans, received, found.step),
                             f"restore of the in-memory step {found.step}", CheckpointError)
    return tree_util.tree_unflatten(treedef, arrays)


def _load(path: str, rank: int, stem: str, found: Found) -> tuple[dict, np.ndarray]:
    name = os.path.join(path, stem)
    with open(name + ".json") as f:
        header = json.load(f)
    data = np.fromfile(name + ".bin", np.uint8)
    if data.size != header["size"] or zlib.crc32(data) != header["crc32"]:
        raise TierDamaged(
            f"restore: the in-memory blocks of process {rank} of step {found.step} "
            f"({name}.bin) are {'truncated' if data.size != header['size'] else 'altered'}"
            f" (the crc32 or size differs from its header)")
    if (header["step"], header["world"], header["rank"]) != (found.step, found.world, rank):
        raise TierDamaged(f"restore: {name}.json belongs to another save (step "
                              f"{header['step']} of {header['world']} processes)")
    return header, data


def _needed(shape: tuple, sharding, nprocs: int) -> list[list[list[tuple[int, int]]]]:
    """For each process, the distinct regions its devices hold (everything: unplaced)."""
    if sharding is None:
        return [[[(0, int(n)) for n in shape]] for _ in range(nprocs)]
    out: list[list] = [[] for _ in range(nprocs)]
    for device, index in sharding.devices_indices_map(shape).items():
        bounds = manifest._bounds(index, shape)
        if bounds not in out[device.process_index]:
            out[device.process_index].append(bounds)
    return out


def _overlap(a, b):
    """The intersection of two regions (None when empty; [] for 0-d values)."""
    out = [(max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b)]
    return None if any(hi <= lo for lo, hi in out) else out


def _pieces(held, leaves, position, plans, nprocs) -> list[list]:
    """For each process, the parts of the blocks read here that its devices need:
    ``(target leaf, region, data)``."""
    needs = [_needed(shape, sh, nprocs) for _, shape, sh in plans]
    sends: list[list] = [[] for _ in range(nprocs)]
    for header, data in held:
        for i, bounds, offset, nbytes in header["blocks"]:
            j = position[leaves[i]["path"]]
            bounds = [tuple(b) for b in bounds]
            block = data[offset:offset + nbytes].view(_dtype(leaves[i]["dtype"])).reshape(
                [hi - lo for lo, hi in bounds])
            for q in range(nprocs):
                for region in needs[j][q]:
                    part = _overlap(bounds, region)
                    if part is not None:
                        cut = tuple(slice(lo - b0, hi - b0) for (lo, hi), (b0, _) in
                                    zip(part, bounds))
                        sends[q].append((j, part, block[cut]))  # (a view: packed once)
    return sends


_ALIGN = 64  # each part's bytes start at a multiple: its view is aligned for any dtype


def _exchange(comm, sends: list[list]) -> list[tuple]:
    """Every process's parts for this one, ``(target leaf, region, data)``: the
    descriptions in one small all-to-all, the bytes packed once per destination
    (parts for this process are kept as they are) and moved by one ``Alltoallv``;
    each received part a view of the receive buffer."""
    me, n = comm.Get_rank(), comm.Get_size()
    said, counts = [], np.zeros(n, np.int64)
    for q, parts in enumerate(sends):
        entries, size = [], 0
        for j, region, data in parts if q != me else ():
            entries.append((j, region, data.dtype.str, data.shape, size))
            size += -(-data.nbytes // _ALIGN) * _ALIGN
        said.append(entries)
        counts[q] = size
    with watched("restore (moving the in-memory blocks)"):
        heard = comm.alltoall(said)
    rcounts = np.array([sum(-(-np.dtype(d).itemsize * int(np.prod(shape)) // _ALIGN) * _ALIGN
                            for _, _, d, shape, _ in entries) for entries in heard], np.int64)
    if max(counts.max(initial=0), rcounts.max(initial=0)) >= 2 ** 31:
        raise CheckpointError("restore: more than 2 GiB of one process's in-memory blocks go "
                              "to one other process (MPI counts are 32-bit); restore onto "
                              "more processes")
    sdispl = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rdispl = np.concatenate([[0], np.cumsum(rcounts)[:-1]])
    sendbuf = np.empty(int(counts.sum()), np.uint8)
    for q, entries in enumerate(said):
        for (_, _, d, shape, at), (_, _, data) in zip(entries, sends[q]):
            start = int(sdispl[q]) + at
            np.copyto(sendbuf[start:start + data.nbytes].view(data.dtype).reshape(shape), data)
    recvbuf = np.empty(int(rcounts.sum()), np.uint8)
    with watched("restore (moving the in-memory blocks)"):
        comm.Alltoallv([sendbuf, (counts.astype(np.int32), sdispl.astype(np.int32))],
                       [recvbuf, (rcounts.astype(np.int32), rdispl.astype(np.int32))])
    out = [(j, region, data) for j, region, data in sends[me]]
    for p, entries in enumerate(heard):
        for j, region, d, shape, at in entries:
            dtype = np.dtype(d)
            start = int(rdispl[p]) + at
            size = dtype.itemsize * int(np.prod(shape))
            out.append((j, region, recvbuf[start:start + size].view(dtype).reshape(shape)))
    return out


def _assemble(plans, received, step: int) -> list:
    """The target's leaves from the parts received, each region checked to be
    covered exactly (never a partial step)."""
    parts: list[list] = [[] for _ in plans]
    for j, region, data in received:
        parts[j].append(([tuple(r) for r in region], data))
    out = []
    for (leaf, shape, sh), mine in zip(plans, parts):
        dtype = _dtype(leaf["dtype"])

        def region_of(index, mine=mine, shape=shape, dtype=dtype, leaf=leaf):
            want = manifest._bounds(index, shape)
            whole = [data for region, data in mine if region == want]
            if whole:  # (one part is the region: itself, no copy)
                return whole[0]
            block = np.empty([hi - lo for lo, hi in want], dtype)
            covered = 0
            for region, data in mine:
                if _overlap(region, want) is None:
                    continue
                block[tuple(slice(lo - w0, hi - w0) for (lo, hi), (w0, _) in
                            zip(region, want))] = data
                covered += math.prod(hi - lo for lo, hi in region)
            if covered != math.prod(hi - lo for lo, hi in want):
                raise CheckpointError(f"restore: the in-memory step {step} does not cover "
                                      f"the region {want} of the leaf at {leaf['path']}")
            return block

        out.append(region_of(Ellipsis) if sh is None else
                   make_array_from_callback(shape, sh, region_of))
    return out


def _dtype(name: str) -> np.dtype:
    """A saved dtype's name as a dtype (bfloat16 and the float8 types: ml_dtypes has
    registered their names with numpy)."""
    return np.dtype(name)
