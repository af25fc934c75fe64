"""Where a checkpoint lies on disk: ``<directory>/step_<k>/`` with its metadata file
and one zarr v3 array per leaf; which steps are there, which are complete, and
opening an array.

>>> from spmd.checkpointing import layout
>>> layout.step_dir("ckpt", 100)
'ckpt/step_100'
"""

from __future__ import annotations

import json
import os
import re

from spmd.checkpointing import manifest
from spmd.checkpointing.coordination import CheckpointError

METADATA = "spmd_checkpoint.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
FORMAT = 2  # 2: chunk manifests and the crc32c codec; 1: neither


def step_dir(directory: str, step: int) -> str:
    """The directory of the committed checkpoint of ``step``."""
    return os.path.join(directory, f"step_{int(step)}")


def all_steps(directory: str) -> list[int]:
    """The steps of the committed checkpoints in ``directory`` (their metadata
    written), ascending; :func:`latest_step` also checks that their chunks are all
    there.  A missing directory has none; a file is an error (a mistyped path must not
    read as "no checkpoint yet", which would start training over)."""
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            raise CheckpointError(
                f"{directory!r} is {_kind(directory)}, not a directory of checkpoints; give "
                "the directory that save wrote them into (save creates it)")
        return []
    steps = []
    for name in os.listdir(directory):
        m = _STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(directory, name, METADATA)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_step(directory: str) -> int | None:
    """The newest complete checkpoint's step in ``directory`` (None when there is none).

    Temporary directories of saves that did not finish are never picked, nor steps
    whose chunks are not all there with the sizes their manifests list (a stat per
    chunk, no reads): such a step is skipped with a warning, once per process.

    >>> latest_step("ckpt")
    100
    """
    for step in reversed(all_steps(directory)):
        why = incomplete(step_dir(directory, step))
        if why is None:
            return step
        manifest.warn_once(("skip", os.path.realpath(step_dir(directory, step))),
                           f"spmd.checkpointing.latest_step: skipping step {step} in "
                           f"{directory!r}: {why}")
    return None


_FIX = "give a directory path (it is created if missing)"


def create_directory(directory: str) -> str | None:
    """Create ``directory`` (and its parents) where missing, to save checkpoints into:
    None, or why it cannot hold them, with the fix (a phrase for the caller's message).

    >>> create_directory("train.log")  # doctest: +SKIP
    "directory 'train.log' is a file; give a directory path (it is created if missing)"
    """
    if os.path.exists(directory) and not os.path.isdir(directory):
        return f"directory {directory!r} is {_kind(directory)}; {_FIX}"
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        # (Name the file in the way: makedirs says only "Not a directory".)
        above = os.path.dirname(os.path.abspath(directory))
        while not os.path.exists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        why = f"{above!r} is {_kind(above)}" if not os.path.isdir(above) else \
            f"{e.strerror or type(e).__name__}"
        return f"directory {directory!r} cannot be created: {why}; {_FIX}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"directory {directory!r} is not writable; give one you can write into"
    return None


def _kind(path: str) -> str:
    return "a file" if os.path.isfile(path) else "not a directory"


def incomplete(path: str) -> str | None:
    """Why the committed checkpoint ``path`` is not complete (None when it is)."""
    try:
        meta = read_meta(path)
    except CheckpointError as e:
        return str(e)
    if meta.get("format", 1) < 2:  # no manifests to check against
        return None
    return manifest.incomplete(path, meta)


def open_store(path: str, meta: dict | None = None):
    """The zarr array at ``path``: opened, or with ``meta`` created anew."""
    import tensorstore as ts  # optional (third-party): needed by a save or a restore only

    # Chunks equal to the fill value are written too: every chunk has a file, so a
    # missing file is always a loss.
    spec: dict = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                  "store_data_equal_to_fill_value": True}
    if meta is None:
        return ts.open(spec, open=True).result()
    spec["metadata"] = meta
    return ts.open(spec, create=True, delete_existing=True).result()


def read_meta(path: str) -> dict:
    """The metadata of the checkpoint ``path`` (a CheckpointError when it has none)."""
    meta_file = os.path.join(path, METADATA)
    if not os.path.isfile(meta_file):
        raise CheckpointError(f"restore: {path} is not a complete checkpoint (it has no "
                              f"{METADATA}); a save that did not finish leaves such a directory")
    try:
        with open(meta_file) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"restore: the metadata {meta_file} is unreadable "
                              f"({type(e).__name__}: {e})") from None

