"""Chunk manifests of :mod:`spmd.checkpointing`: which chunk files each process
wrote, with their sizes and checksums, and the checks made of them.

zarr reads a chunk file that is not there as the array's fill value, so a chunk
lost after a save (a write that never reached a shared filesystem, a partial copy
or sync of the checkpoint) would restore as zeros, silently.  So every process
writes ``spmd_manifest.<process>.json`` beside the arrays: for each chunk it wrote,
the chunk's key (``leaf_00003/c/1/0``), its size in bytes and its crc32c.  The
crc32c is zarr v3's ``crc32c`` codec, computed by tensorstore over the chunk's
bytes and stored as the chunk's last 4 bytes: tensorstore checks it on every
read (an altered or truncated chunk), and the manifest's copy tells a chunk that
is intact but not the one this save wrote (a sync that mixed two runs).

Everything here is local: a process writes the manifest of its own chunks, and a
reader checks only the chunks it reads (a stat and a 4-byte read each).  The
completeness check of :func:`incomplete` stats every listed chunk and reads none.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import warnings

import numpy as np

from spmd.checkpointing.coordination import watched

MANIFEST = "spmd_manifest.{}.json"
_DIGEST_BYTES = 4  # crc32c, little-endian, after the chunk's data
_TS_FILE = re.compile(r'Error reading local file "([^"]+)"')


def agreed(comm, fn, what: str, error_type, share: bool = False):
    """``fn()`` on every process of ``comm`` (None: this one only); if it raised on
    any, raise ``error_type`` on all of them with the first failing process's message,
    so that an error one process sees, all see, and none is left waiting in a later
    collective.  Returns fn's value, or with ``share`` every process's values."""
    value = error = None
    try:
        value = fn()
    except BaseException as e:  # told to the others before it is raised here
        error = e
    if comm is None:
        if error is not None:
            raise error
        return [value] if share else value
    text = None if error is None else (str(error) if isinstance(error, error_type)
                                       else f"{what}: {type(error).__name__}: {error}")
    with watched(what):
        gathered = comm.allgather((text, value if share and error is None else None))
    bad = [r for r, (t, _) in enumerate(gathered) if t is not None]
    if bad:
        if error is not None and not isinstance(error, Exception):
            raise error  # KeyboardInterrupt, SystemExit: itself, here
        raise error_type(f"{gathered[bad[0]][0]} [seen by process(es) {bad}]") from error
    return [v for _, v in gathered] if share else value


_warned: set = set()


def warn_once(key, message: str, stacklevel: int = 3) -> None:
    """Warn once per ``key`` in this process (what is said, and of which directory)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=stacklevel)


def codecs(dtype: np.dtype) -> list:
    """The zarr v3 codec chain of a saved array: raw bytes, then the crc32c digest."""
    raw: dict = {"name": "bytes"}
    if np.dtype(dtype).itemsize > 1:  # zarr v3: no endianness for one-byte types
        raw["configuration"] = {"endian": "little"}
    return [raw, {"name": "crc32c"}]


def chunk_key(coords) -> str:
    """zarr v3's default chunk key: ``c/<i>/<j>``; ``c`` for a 0-d array."""
    return "/".join(["c", *map(str, coords)])


def _bounds(index, shape) -> list[tuple[int, int]]:
    if index is Ellipsis:
        return [(0, int(n)) for n in shape]
    out = []
    for s, n in zip(index, shape):
        start, stop, _ = s.indices(int(n))
        out.append((start, stop))
    return out


def chunks_of(index, shape, chunk) -> list[tuple]:
    """The grid coordinates of the chunks that a region (a tuple of slices, or
    Ellipsis for the whole array) intersects."""
    ranges = [range(a // c, -(-b // c)) if b > a else range(0)
              for (a, b), c in zip(_bounds(index, shape), chunk)]
    return list(itertools.product(*ranges))


def grid_size(shape, chunk) -> int:
    return math.prod(-(-int(n) // c) for n, c in zip(shape, chunk))


def block_text(coords, shape, chunk) -> str:
    """A chunk's global index range, as ``[524288:786432]`` or ``[6:8, 4:8]``."""
    if not coords:
        return "[] (the 0-d value)"
    return "[" + ", ".join(f"{i * c}:{min((i + 1) * c, int(n))}"
                           for i, c, n in zip(coords, chunk, shape)) + "]"


def _digest(file: str) -> str:
    """The crc32c that the codec stored at the end of a chunk file (hex)."""
    with open(file, "rb") as f:
        f.seek(-_DIGEST_BYTES, os.SEEK_END)
        return f.read(_DIGEST_BYTES)[::-1].hex()


def write(step_path: str, process: int, keys: list[str]) -> None:
    """Write this process's manifest of the chunks it wrote (their files are there)."""
    chunks = {}
    for key in keys:
        file = os.path.join(step_path, key)
        chunks[key] = [os.path.getsize(file), _digest(file)]
    name = os.path.join(step_path, MANIFEST.format(process))
    with open(name, "w") as f:
        json.dump({"format": 1, "process": process, "chunks": chunks}, f)
        f.flush()
        os.fsync(f.fileno())


class Manifest:
    """The manifests of a checkpoint's writers, merged: ``chunks`` maps a chunk key
    to (size, crc32c, process); ``lost`` names the manifests that are missing or
    unreadable, with why."""

    def __init__(self, step_path: str, writers: int):
        self.chunks: dict[str, tuple[int, str, int]] = {}
        self.lost: list[tuple[int, str]] = []
        for r in range(writers):
            name = os.path.join(step_path, MANIFEST.format(r))
            try:
                with open(name) as f:
                    listed = json.load(f)["chunks"]
            except FileNotFoundError:
                self.lost.append((r, "is missing"))
                continue
            except (OSError, ValueError, KeyError, TypeError) as e:
                self.lost.append((r, f"is unreadable ({type(e).__name__}: {e})"))
                continue
            for key, (size, digest) in listed.items():
                self.chunks[key] = (int(size), str(digest), r)

    def lost_text(self) -> str:
        """Why chunks cannot be checked: the manifests that are not there."""
        return "; ".join(f"the manifest of process {r} ({MANIFEST.format(r)}) {why}, so the "
                         "chunks it lists cannot be checked (that process's writes never "
                         "reached this filesystem, or a partial copy)" for r, why in self.lost)

    def check(self, step_path: str, key: str, *, read_digest: bool = True) -> str | None:
        """Why the chunk ``key`` is not what the save wrote (None when it is).

        A stat, and a read of the chunk's last 4 bytes when ``read_digest``."""
        if key not in self.chunks:
            if self.lost:
                return f"is in no manifest: {self.lost_text()}"
            return "is in no process's manifest (the save did not record writing it)"
        size, digest, writer = self.chunks[key]
        file = os.path.join(step_path, key)
        try:
            found = os.path.getsize(file)
            if found == size and read_digest:
                stored = _digest(file)
        except FileNotFoundError:
            return (f"is missing; process {writer} wrote it at save, so it was lost since "
                    "(a write that never reached this filesystem, or a partial copy)")
        except OSError as e:
            return f"cannot be read ({type(e).__name__}: {e})"
        if found != size:
            return (f"has {found} bytes where the save wrote {size} (truncated or "
                    "overwritten since the save)")
        if read_digest and stored != digest:
            return (f"holds other data than the save wrote (its crc32c {stored} is not the "
                    f"manifest's {digest}: a chunk of another save?)")
        return None


def incomplete(step_path: str, meta: dict) -> str | None:
    """Why a committed checkpoint is not complete (None when it is): a writer's
    manifest missing, a chunk of a leaf in no manifest, an array's zarr.json or a
    listed chunk file missing, or a chunk of another size.  Stats only; reads no
    chunk."""
    try:
        return _incomplete(step_path, meta)
    except (KeyError, TypeError, ValueError) as e:  # a metadata file edited or cut short
        return f"its metadata is malformed ({type(e).__name__}: {e})"


def _incomplete(step_path: str, meta: dict) -> str | None:
    manifest = Manifest(step_path, int(meta.get("writers", 1)))
    if manifest.lost:
        return manifest.lost_text()
    listed: dict[str, int] = {}
    for key in manifest.chunks:
        leaf = key.split("/", 1)[0]
        listed[leaf] = listed.get(leaf, 0) + 1
    for leaf in meta["leaves"]:
        want = grid_size(leaf["shape"], leaf["chunk"])
        if listed.get(leaf["file"], 0) != want:
            return (f"the manifests list {listed.get(leaf['file'], 0)} of the {want} chunks "
                    f"of the leaf at {leaf['path']} ({leaf['file']})")
    for leaf in meta["leaves"]:
        if not os.path.isfile(os.path.join(step_path, leaf["file"], "zarr.json")):
            return f"the array of the leaf at {leaf['path']} ({leaf['file']}/zarr.json) is missing"
    paths = {leaf["file"]: leaf["path"] for leaf in meta["leaves"]}
    for key in manifest.chunks:
        why = manifest.check(step_path, key, read_digest=False)
        if why is not None:
            return f"its chunk {key} (of the leaf at {paths.get(key.split('/', 1)[0])}) {why}"
    return None


def read_error_reason(e: BaseException) -> tuple[str | None, str]:
    """(the chunk file that tensorstore named, or None; why) for a failed read."""
    text = str(e)
    m = _TS_FILE.search(text)
    file = m.group(1) if m else None
    if "DATA_LOSS" in text or "Digest mismatch" in text:
        return file, f"fails its checksum: its bytes changed since the save (tensorstore: {text})"
    return file, f"could not be read by tensorstore ({type(e).__name__}: {text})"


class ReadChecks:
    """The checks of one process's restore of one step: each chunk is checked once,
    before its first read; a failure is a message naming the step, the leaf's pytree
    path, the block and what to do (``other_step()``: the newest other complete step,
    looked for only then)."""

    def __init__(self, directory: str, step: int, path: str, meta: dict, other_step):
        self.directory, self.step, self.path = directory, step, path
        self.other_step = other_step
        self.verified: set[str] = set()
        self._chunks: dict[str, list[int]] = {}
        self.manifest = None
        if meta.get("format", 1) >= 2:
            self.manifest = Manifest(path, int(meta.get("writers", 1)))
        else:  # older checkpoints: nothing to check against
            warn_once(("old", os.path.realpath(path)),
                      f"spmd.checkpointing.restore: step {step} in {directory!r} was saved "
                      f"without chunk manifests (format {meta.get('format', 1)}): a lost "
                      "chunk would read as zeros, unnoticed; save it again to get a checked "
                      "checkpoint")

    def fix(self) -> str:
        """What to do about a damaged step."""
        other = self.other_step()
        again = f"copy step_{self.step} again from where it was saved"
        if other is None:
            return f"there is no other complete step: {again}"
        return f"restore the latest complete step with restore(..., step={other}), or {again}"

    def chunk(self, leaf: dict) -> list[int]:
        """A leaf's chunk shape: in the metadata, or (older checkpoints) in zarr.json."""
        if leaf["file"] not in self._chunks:
            chunk = leaf.get("chunk")
            if chunk is None:
                with open(os.path.join(self.path, leaf["file"], "zarr.json")) as f:
                    chunk = json.load(f)["chunk_grid"]["configuration"]["chunk_shape"]
            self._chunks[leaf["file"]] = [int(c) for c in chunk]
        return self._chunks[leaf["file"]]

    def before_read(self, leaf: dict, index) -> str | None:
        """Why the chunks under ``index`` cannot be read as saved (None: they can)."""
        if self.manifest is None:
            return None
        chunk = self.chunk(leaf)
        for coords in chunks_of(index, leaf["shape"], chunk):
            key = f"{leaf['file']}/{chunk_key(coords)}"
            if key in self.verified:
                continue
            why = self.manifest.check(self.path, key)
            if why is not None:
                return self.damaged(leaf, coords, why)
            self.verified.add(key)
        return None

    def read_failed(self, leaf: dict, index, error: BaseException) -> str:
        """The message of a read that tensorstore failed (an altered chunk)."""
        file, why = read_error_reason(error)
        coords = None
        if file is not None:
            rel = os.path.relpath(file, os.path.join(self.path, leaf["file"])).split(os.sep)
            if rel[0] == "c" and all(part.isdigit() for part in rel[1:]):
                coords = tuple(int(part) for part in rel[1:])
        return self.damaged(leaf, coords, why, index)

    def damaged(self, leaf: dict, coords, why: str, index=None) -> str:
        shape = leaf["shape"]
        if coords is None:  # the region read, when the chunk is not known
            where = "block [" + ", ".join(f"{a}:{b}" for a, b in _bounds(index, shape)) + "]"
        else:
            where = (f"block {block_text(coords, shape, self.chunk(leaf))} "
                     f"(chunk {chunk_key(coords)} of {leaf['file']})")
        return (f"restore: step {self.step} in {self.directory!r} is damaged: the leaf at "
                f"{leaf['path']}, {where}, {why}; {self.fix()}")
