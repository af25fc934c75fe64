"""The shared-memory segments a job leaves in ``/dev/shm``, and their removal.

MPICH gives the ranks of a node one named segment (``mpich_shm_<job>_<node>``,
2-4 MB) for the job's life and removes it in ``MPI_Finalize``; a job that ends
any other way (a killed rank, ``MPI_Abort`` after a collective deadline, an
exception, a rank ended by the launcher) leaves it behind.  Shared windows
(``Win.Allocate_shared``, spmd's own in ``spmd.collectives.mpi.shm``) are
unlinked as soon as every member has mapped them, so they leave a file only when
a rank dies in between; they are handled the same way.

Which files are this job's: those **its ranks have mapped or open**, identified
by device and inode, not by name.  :class:`Segments` reads
``/proc/<pid>/maps`` and ``/proc/<pid>/fd`` of the job's ranks while they run
(the launcher: when a rank starts, when a file has appeared in ``/dev/shm``,
which it lists every 0.1 s, whenever a rank's process ends, while the others
still hold the segment, and every 5 s besides) and takes the records the ranks write
themselves (``rank<N>.shm``, see :func:`spmd.launch._rank.record_segments`).
Names alone would not do: another job's segments have the same form, and a
name can be reused by a later file.  At the end, a recorded file is removed
only when

- the path still names the same inode that a rank had mapped (tmpfs numbers
  its inodes from a counter, so a later file does not get the number of one
  removed meanwhile; a file's times are no help, MPICH's segment is changed
  as the job ends),
- it was not in ``/dev/shm`` already when the job started (a segment the job
  merely used, made by someone else, stays), and
- no live process maps it or has it open (another job sharing it, or a rank
  that has not yet died, keeps it).

So a job never removes a segment that another live job uses.  Linux only
(``/proc``); elsewhere every function here does nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
import time

from spmd.launch import memory_tier

SHM_DIR = "/dev/shm"

# (st_dev, st_ino): how a segment is identified.
Key = tuple


def _in_dir(path: str, directory: str) -> bool:
    return os.path.dirname(path) == directory


def mapped_files(pid: int | str, directory: str = SHM_DIR) -> dict[str, Key]:
    """Path -> (device, inode) of the files in ``directory`` that process ``pid``
    maps or has open (``"self"`` for this process); deleted files are left out
    (nothing to remove).  Empty when the process is gone or unreadable."""
    found: dict[str, Key] = {}
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        # address perms offset dev inode path
        parts = line.split(None, 5)
        if len(parts) < 6 or parts[5].endswith(" (deleted)"):
            continue
        path = parts[5]
        if _in_dir(path, directory):
            major, _, minor = parts[3].partition(":")
            try:
                found[path] = (os.makedev(int(major, 16), int(minor, 16)), int(parts[4]))
            except ValueError:
                continue
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        link = os.path.join(fd_dir, fd)
        try:
            path = os.readlink(link)
            if not _in_dir(path, directory) or path.endswith(" (deleted)"):
                continue
            st = os.stat(link)  # the open file itself, whatever its name now
        except OSError:
            continue
        found[path] = (st.st_dev, st.st_ino)
    return found


def entries(directory: str = SHM_DIR) -> frozenset:
    """(name, inode) of every entry in ``directory`` now: one directory read, no
    ``stat`` (the launcher compares two of them to see whether a file has appeared,
    a name reused by a new file included)."""
    try:
        with os.scandir(directory) as it:
            return frozenset((e.name, e.inode()) for e in it)
    except OSError:
        return frozenset()


def listing(directory: str = SHM_DIR) -> dict[str, Key]:
    """Path -> (device, inode) of the regular files in ``directory`` now."""
    out: dict[str, Key] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[path] = (st.st_dev, st.st_ino)
    return out


def in_use(keys, directory: str = SHM_DIR) -> set:
    """The ``keys`` of files in ``directory`` that some live process maps or has
    open (every readable process of the machine)."""
    keys = set(keys)
    if not keys:
        return set()
    used: set = set()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return keys  # cannot tell: treat everything as in use
    for pid in pids:
        for key in mapped_files(pid, directory).values():
            if key in keys:
                used.add(key)
        if used == keys:
            break
    return used


class Segments:
    """The shared-memory files of one job: what was there before it, what its
    ranks were seen to map, and their removal (:meth:`remove`)."""

    def __init__(self, directory: str = SHM_DIR):
        self.dir = directory
        self.enabled = sys.platform.startswith("linux") and os.path.isdir(directory)
        self.before = listing(directory) if self.enabled else {}
        self.seen: dict[str, Key] = {}

    def add(self, found: dict[str, Key]) -> None:
        """Record files the job's ranks map or have open (:func:`mapped_files` of a
        rank, read while the caller knows that pid is still that rank)."""
        for path, key in found.items():
            if _in_dir(path, self.dir):
                self.seen[path] = tuple(key)

    def add_records(self, launch_dir: str, host: str) -> None:
        """Take the ``rank<N>.shm`` records of the ranks that ran on ``host``."""
        try:
            names = os.listdir(launch_dir)
        except OSError:
            return
        for name in names:
            if not (name.startswith("rank") and name.endswith(".shm")):
                continue
            try:
                with open(os.path.join(launch_dir, name)) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                continue
            if not (isinstance(rec, dict) and rec.get("host") == host):
                continue
            for path, key in (rec.get("files") or {}).items():  # path -> [st_dev, st_ino]
                if isinstance(key, list) and len(key) == 2 and all(
                        isinstance(v, int) for v in key):
                    self.add({path: key})

    def leftovers(self) -> dict[str, Key]:
        """The recorded files still there as the same file, not there before the job,
        and not used by a live process: what :meth:`remove` removes."""
        if not self.enabled:
            return {}
        candidates = {p: k for p, k in self.seen.items()
                      if self.before.get(p) != k and _same_file(p, k)}
        used = in_use(candidates.values(), self.dir)
        return {p: k for p, k in candidates.items() if k not in used}

    def remove(self) -> list[str]:
        """Remove the job's files that are left (see :meth:`leftovers`); return
        their paths.  A file that cannot be removed is reported on stderr."""
        removed = []
        for path, key in sorted(self.leftovers().items()):
            try:
                if not _same_file(path, key):  # replaced meanwhile
                    continue
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                print(f"spmd-run: cannot remove the job's shared-memory segment {path}: {e}",
                      file=sys.stderr)
        return removed


def _same_file(path: str, key: Key) -> bool:
    """``path`` is still the regular file ``key`` (device, inode)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == tuple(key)


# ------------------------------------------------------------ one node's pass

# How long the pass waits for the job's ranks on its node to be gone (mpiexec has
# ended: they are being killed by their MPI proxy) before it kills them itself.
RANKS_GONE_S = 2.0


def _ranks_here(launch_dir: str, host: str) -> dict[int, dict]:
    """Rank -> its start record (``rank<N>.pid``: pid, host, what /dev/shm held) for
    the job's ranks that ran on ``host``."""
    out = {}
    try:
        names = os.listdir(launch_dir)
    except OSError:
        return out
    for name in names:
        if name.startswith("rank") and name.endswith(".pid") and name[4:-4].isdigit():
            try:
                with open(os.path.join(launch_dir, name)) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict) and rec.get("host") == host:
                out[int(name[4:-4])] = rec
    return out


def _alive(pid, launch_dir: str) -> bool:
    """``pid`` is a live process of this job (its environment names ``launch_dir``)."""
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            return f"SPMD_LAUNCH_DIR={launch_dir}".encode() in f.read().split(b"\0")
    except (OSError, ValueError, TypeError):
        return False


def _end_ranks(launch_dir: str, ranks: dict[int, dict]) -> None:
    """Wait for the node's ranks to be gone; kill those left (orphans: mpiexec ended)."""

    pids = [rec.get("pid") for rec in ranks.values()]
    end = time.monotonic() + RANKS_GONE_S
    while any(_alive(p, launch_dir) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid, launch_dir):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    end = time.monotonic() + 1.0
    while any(_alive(p, launch_dir) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)


def clean_node(launch_dir: str, host: str | None = None) -> list[str]:
    """Remove, on this node, the segments that the job's ranks here recorded
    (``rank<N>.shm``) and left, with :class:`Segments`' rules; what was in /dev/shm
    before the job is what every rank here saw there when it started (the rank that
    made the node's segment saw it missing).  Returns the removed paths.

    >>> clean_node("/work/.spmd-run/job-x1y2")                  # doctest: +SKIP
    ['/dev/shm/mpich_shm_5edb29d8_1']
    """

    host = socket.gethostname() if host is None else host
    ranks = _ranks_here(launch_dir, host)
    segments = Segments()
    if not ranks or not segments.enabled:
        return []
    _end_ranks(launch_dir, ranks)
    listings = [{p: tuple(k) for p, k in (rec.get("shm") or {}).items()}
                for rec in ranks.values()]
    before = dict(listings[0]) if listings else {}
    for other in listings[1:]:
        before = {p: k for p, k in before.items() if other.get(p) == k}
    segments.before = before
    segments.add_records(launch_dir, host)
    return segments.remove()


def main(argv: list[str] | None = None) -> int:
    """``python -m spmd.launch.cleanup LAUNCH_DIR``: :func:`clean_node` on this node
    (``spmd-run`` starts one on every host after a job across hosts);
    ``python -m spmd.launch.cleanup --memory-tier JOB``: remove the job's in-memory
    checkpoints on this node (:mod:`spmd.launch.memory_tier`; once the job ended)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--memory-tier":
        try:
            job = memory_tier.job_id({memory_tier.JOB_ENV: argv[1]})
        except memory_tier.MemoryTierError as e:
            print(f"usage: python -m spmd.launch.cleanup --memory-tier JOB: {e}",
                  file=sys.stderr)
            return 2
        if job and memory_tier.remove(job):
            print(f"{socket.gethostname()}: removed the job's in-memory checkpoints "
                  f"{memory_tier.job_dir(job)}")
        return 0
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print(f"usage: python -m spmd.launch.cleanup LAUNCH_DIR | --memory-tier JOB (got "
              f"{argv!r}: give the launch directory of a job that has ended)", file=sys.stderr)
        return 2
    for path in clean_node(os.path.abspath(argv[0])):
        print(f"{socket.gethostname()}: removed the job's leftover {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
