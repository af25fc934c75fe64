"""What one save writes: the plan (checked, agreed by every process: the leaves, the
blocks this process holds), then the arrays, the blocks, the manifests and the
commit, each stage agreed on by every process.

>>> from spmd.checkpointing import writing
>>> writing.write(writing.plan("ckpt", state, 10, None, copy=False))
'ckpt/step_10'
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import numpy as np

from spmd import tree_util
from spmd.checkpointing import layout, manifest
from spmd.checkpointing.coordination import CheckpointError, all_ok, bcast, communicator
from spmd.checkpointing.layout import FORMAT, METADATA, all_steps, incomplete, step_dir
from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.mesh import process_count, process_index
from spmd.shard.arrays.spec import NamedSharding


def _leaf_info(x, path: str) -> tuple[tuple, np.dtype, Any]:
    """(shape, dtype, sharding or None) of a leaf to save."""
    if isinstance(x, Array):
        sh = x.sharding
        return tuple(x.shape), np.dtype(x.dtype), sh if isinstance(sh, NamedSharding) else None
    if isinstance(x, (np.ndarray, np.generic, int, float, bool)):
        a = np.asarray(x)
        return a.shape, a.dtype, None
    raise CheckpointError(f"save: the leaf at {path} is a {type(x).__name__}; checkpoints hold "
                          "arrays (spmd Arrays, numpy arrays, Python scalars)")


def _chunk(shape, sharding) -> list[int]:
    if sharding is None:
        return [max(int(n), 1) for n in shape]
    return [max(int(n), 1) for n in sharding.shard_shape(shape)]


def _mesh_record(sharding) -> dict | None:
    if sharding is None:
        return None
    m = sharding.mesh
    return {"axis_names": list(m.axis_names), "shape": [int(m.shape[a]) for a in m.axis_names]}


def _spec_record(sharding):
    if sharding is None:
        return None
    return [list(e) if isinstance(e, tuple) else e for e in sharding.spec]


class Plan:
    """What one process writes for one checkpoint, checked on every process."""

    def __init__(self, directory, step, keep, final, treedef, leaves, replace=False):
        self.directory, self.step, self.keep, self.final = directory, step, keep, final
        self.replace = replace  # a damaged checkpoint of this step is there
        self.treedef, self.leaves = treedef, leaves  # leaves: (path, shape, dtype, sh, blocks)


def plan(directory: str, tree, step, keep, *, copy: bool) -> Plan:
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"save: step must be an integer >= 0, got {step!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise CheckpointError(f"save: keep must be an integer >= 1 or None, got {keep!r}")
    paths_leaves, treedef = tree_util.tree_flatten_with_path(tree)
    me = process_index()
    communicator()  # created here, in the calling thread: Dup is a collective on the world
    # Before any work: a path that is a file (or under one) is named as such, not met
    # as a failure to create the arrays.  Process 0 creates the directory (it writes
    # the metadata), so its view decides, and every process raises or none.
    problem = bcast(layout.create_directory(directory) if me == 0 else None)
    if problem is not None:
        raise CheckpointError(f"save: {problem}")
    leaves = []
    for path, x in paths_leaves:
        p = tree_util.keystr(path)
        shape, dtype, sh = _leaf_info(x, p)
        _zarr_dtype(dtype, p)
        leaves.append((p, shape, dtype, sh, x))
    ok = True
    try:  # a process-local failure (memory, a device) must fail every process
        leaves = [(p, shape, dtype, sh,
                   [(index, np.array(b, copy=True) if copy else b)
                    for index, b in _blocks_to_write(x, sh, me)])
                  for p, shape, dtype, sh, x in leaves]
    except BaseException:
        ok = False
        raise
    finally:
        all_ok(ok, f"save of {step_dir(directory, step)}: reading the blocks")
    final = step_dir(directory, step)
    # An existing step is never overwritten unless it is damaged: latest_step skips
    # it, so a run resumed from an earlier step saves this step again.  Process 0's
    # view decides, so that all processes raise or none.
    exists, damaged = bcast((os.path.exists(final), os.path.exists(final) and
                              incomplete(final)) if me == 0 else None)
    if exists and not damaged:
        raise CheckpointError(f"save: {final} already exists; save under a new step, or "
                              "delete it first")
    if exists:
        manifest.warn_once(("replace", os.path.realpath(final)),
                           f"spmd.checkpointing.save: {final} exists but is damaged "
                           f"({damaged}); this save replaces it", stacklevel=5)
    return Plan(directory, int(step), keep, final, treedef, leaves, replace=exists)


def write(plan: Plan) -> str:
    directory, final, me = plan.directory, plan.final, process_index()
    nonce = bcast(uuid.uuid4().hex[:12] if me == 0 else None)
    tmp = os.path.join(directory, f".tmp-step_{plan.step}.{nonce}")
    ok = True
    try:
        if me == 0:
            os.makedirs(directory, exist_ok=True)
            _remove_stale_tmp(directory)
            os.makedirs(tmp)
            for i, (p, shape, dtype, sh, _) in enumerate(plan.leaves):
                layout.open_store(os.path.join(tmp, f"leaf_{i:05d}"), {
                    "shape": list(shape), "data_type": _zarr_dtype(dtype, p),
                    "chunk_grid": {"name": "regular",
                                   "configuration": {"chunk_shape": _chunk(shape, sh)}},
                    "codecs": manifest.codecs(dtype)})
    except BaseException:
        ok = False
        raise
    finally:
        all_ok(ok, f"save of {final}: creating the arrays")
    try:
        writes = []
        for i, (p, shape, dtype, sh, blocks) in enumerate(plan.leaves):
            store = layout.open_store(os.path.join(tmp, f"leaf_{i:05d}")) if blocks else None
            writes.extend(store[index].write(block) for index, block in blocks)
        for w in writes:
            w.result()
        keys = [f"leaf_{i:05d}/{manifest.chunk_key(c)}"
                for i, (p, shape, dtype, sh, blocks) in enumerate(plan.leaves)
                for index, _ in blocks
                for c in manifest.chunks_of(index, shape, _chunk(shape, sh))]
        manifest.write(tmp, me, keys)  # after its chunks: it lists only written ones
    except BaseException:
        ok = False
        raise
    finally:
        all_ok(ok, f"save of {final}: writing the blocks")
    try:
        if me == 0:
            meta = {"format": FORMAT, "step": plan.step, "treedef": str(plan.treedef),
                    "writers": process_count(),
                    "leaves": [{"path": p, "file": f"leaf_{i:05d}", "shape": list(shape),
                                "chunk": _chunk(shape, sh),
                                "dtype": dtype.name, "mesh": _mesh_record(sh),
                                "spec": _spec_record(sh)}
                               for i, (p, shape, dtype, sh, _) in enumerate(plan.leaves)]}
            with open(os.path.join(tmp, METADATA), "w") as f:
                json.dump(meta, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            if plan.replace and os.path.exists(final):
                # Set aside under a temporary name first: a crash between the renames
                # leaves debris that the next save removes, never a mixed step.
                aside = f"{tmp}.replaced"
                os.rename(final, aside)
                os.rename(tmp, final)  # the commit
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(tmp, final)  # the commit
            if plan.keep is not None:
                for old in all_steps(directory)[:-plan.keep]:
                    shutil.rmtree(step_dir(directory, old), ignore_errors=True)
    except BaseException:
        ok = False
        raise
    finally:
        all_ok(ok, f"save of {final}: the commit")
    return final


def _remove_stale_tmp(directory: str) -> None:
    for name in os.listdir(directory):
        if name.startswith(".tmp-step_"):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _zarr_dtype(dtype: np.dtype, path: str) -> str:
    if dtype in dtypes.NARROW_FLOATS:  # zarr v3 (tensorstore) names them as numpy does
        return dtype.name
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise CheckpointError(f"save: the leaf at {path} has dtype {dtype}, which checkpoints "
                              "do not store (bool, integer and floating dtypes, bfloat16 "
                              "and the float8 types)")
    return "bool" if dtype.kind == "b" else dtype.name


def _blocks_to_write(x, sharding, me: int):
    """(global index, block) pairs this process writes: the replica-0 blocks of its
    devices; process 0 writes leaves that are not placed on a mesh."""
    if sharding is None:
        if me == 0:
            yield (Ellipsis, np.asarray(x))
        return
    for shard in x.addressable_shards:
        if shard.replica_id == 0:
            yield (shard.index, np.asarray(shard.data))

