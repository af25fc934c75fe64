"""Checkpoints of pytrees of (sharded) arrays that restore onto another mesh.

>>> from spmd import checkpointing
>>> checkpointing.save("ckpt", {"params": params, "opt": opt_state}, step=100, keep=3)
>>> step = checkpointing.latest_step("ckpt")                     # 100
>>> target = spmd.tree_util.tree_map(lambda x: x.sharding, state) # shardings for the new mesh
>>> state = checkpointing.restore("ckpt", target)                 # the latest step

Layout: ``<directory>/step_<k>/`` holds one zarr v3 array per leaf (written
through tensorstore) and ``spmd_checkpoint.json`` (the step, the leaves' pytree
paths, shapes, dtypes and saving shardings, the saving mesh).  Each array is
chunked by the blocks of its saving sharding, so every process writes only the
chunks of the blocks its devices hold, each block once (by the device whose
``replica_id`` is 0) even when replicated.  On restore each process reads only
the regions its devices need under the target sharding: no process ever holds
the whole model unless the target says it should.

Checked: each process writes a manifest of the chunks it wrote (sizes, crc32c), and
each process checks the chunks it reads: a missing, truncated or altered chunk is
a :class:`CheckpointError` on every process; :func:`latest_step` skips a damaged
step (see :mod:`spmd.checkpointing.manifest`).

Atomic: everything is written into ``<directory>/.tmp-step_<k>.<nonce>``; once
every process has written its chunks, process 0 writes the metadata and renames
the directory to ``step_<k>``.  A crash mid-save leaves only a ``.tmp-`` directory,
which :func:`latest_step` never picks (and the next save removes).

Fast tier: ``save(..., local=True)`` keeps a step in the nodes' memory, with a copy
of each process's blocks on another node; ``restore`` reads it while it is the
newest complete step (:mod:`~spmd.checkpointing.memory`).

Modules: :mod:`~spmd.checkpointing.layout` (the files), :mod:`~spmd.checkpointing.writing`
(one save's stages), :mod:`~spmd.checkpointing.saving` (``save``, ``save_async``),
:mod:`~spmd.checkpointing.restoring`, :mod:`~spmd.checkpointing.coordination` (the
exchanges between processes), :mod:`~spmd.checkpointing.manifest` (the checks).
"""

from __future__ import annotations

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.checkpointing import layout, manifest, memory, restoring, saving, writing  # noqa: F401
from spmd.checkpointing.coordination import CheckpointError, watched
from spmd.checkpointing.layout import METADATA, all_steps, step_dir
from spmd.checkpointing.restoring import latest_step, restore, saved_metadata
from spmd.checkpointing.saving import PendingSave, save, save_async, wait_pending

__all__ = ["CheckpointError", "METADATA", "PendingSave", "all_steps", "latest_step",
           "restore", "save", "save_async", "saved_metadata", "step_dir", "wait_pending",
           "watched"]
