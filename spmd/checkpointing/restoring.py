"""Restoring a checkpoint onto any mesh: the step every process agrees on, the
target checked against what was saved, and each process reading only the blocks its
devices need, each chunk checked against the save's manifests.

>>> from spmd import checkpointing
>>> state = checkpointing.restore("ckpt", tree_map(lambda x: x.sharding, state))
"""

from __future__ import annotations

import os

import numpy as np

from spmd import tree_util
from spmd.checkpointing import layout, manifest, memory
from spmd.checkpointing.coordination import CheckpointError, communicator
from spmd.checkpointing.layout import all_steps, incomplete, read_meta, step_dir
from spmd.checkpointing.layout import latest_step as _latest_on_disk
from spmd.checkpointing.saving import wait_pending
from spmd.launch import memory_tier
from spmd.profiler import host_span
from spmd.shard.arrays.placing import SingleDeviceSharding, make_array_from_callback
from spmd.shard.arrays.spec import NamedSharding, ShardingError, check_spec


def _target_info(t, path: str):
    """(sharding or None, shape or None, dtype or None) that a target leaf asks for."""
    if isinstance(t, NamedSharding):
        return t, None, None
    if isinstance(t, SingleDeviceSharding):  # an unplaced value: restored whole
        return None, None, None
    sh = getattr(t, "sharding", None)
    shape = getattr(t, "shape", None)
    dtype = getattr(t, "dtype", None)
    if shape is None and sh is None:
        raise CheckpointError(f"restore: the target leaf at {path} is a {type(t).__name__}; "
                              "give a NamedSharding, an array, or an abstract array with "
                              ".shape/.dtype (and .sharding)")
    return (sh if isinstance(sh, NamedSharding) else None,
            None if shape is None else tuple(shape),
            None if dtype is None else np.dtype(dtype))


def latest_step(directory: str, *, local: bool = False) -> int | None:
    """The newest complete checkpoint's step in ``directory`` (None when there is none).

    Temporary directories of saves that did not finish are never picked, nor steps
    whose chunks are not all there with the sizes their manifests list (a stat per
    chunk, no reads): such a step is skipped with a warning, once per process.

    ``local=True`` counts the in-memory steps too (``save(..., local=True)``): the
    newest step that :func:`restore` would read, from memory or disk; collective
    then (every process must call it), and the same on every process.

    >>> latest_step("ckpt")
    100
    """
    if not local:
        return _latest_on_disk(directory)
    wait_pending()  # (the agreements below use the communicator of a pending save)
    found = memory.newest(directory)
    disk = _disk_step(directory)
    if found is None:
        return disk
    return found.step if disk is None else max(found.step, disk)


def _disk_step(directory: str) -> int | None:
    """The latest complete step on disk as every process sees it (the oldest of their
    views), collective."""
    steps = manifest.agreed(communicator(), lambda: _latest_on_disk(directory),
                            "latest_step", CheckpointError, share=True)
    return None if None in steps else min(steps)


def restore(directory: str, target, *, step: int | None = None):
    """Read the checkpoint of ``step`` (default: the latest complete one) in
    ``directory`` into the structure of ``target``, placed by its shardings; every
    process must call it.

    The in-memory steps (``save(..., local=True)``) count too: the newest complete
    step is read from memory when the live processes' nodes hold every block of it
    and it is at least as new as the newest on disk; a step damaged in memory (its
    checksums) is not read: the newest on disk is, with a warning.

    ``target`` is a pytree like the saved one whose leaves are ``NamedSharding``s,
    arrays (their sharding, shape and dtype), or abstract arrays with ``.shape``,
    ``.dtype`` and ``.sharding``.  Leaves without a sharding restore as whole
    numpy arrays.  Each process reads only the blocks of its devices, and checks
    each chunk it reads against the save's manifests: a missing, truncated or
    altered chunk raises :class:`CheckpointError` on every process, naming the
    step, the leaf and the block.  Waits for a pending :func:`save_async` first.

    >>> state = restore("ckpt", tree_map(lambda x: x.sharding, state))
    """
    span = host_span("checkpoint restore", "checkpoint", path=str(directory), step=step)
    with span:
        return _restore(directory, target, step, span)


def _restore(directory: str, target, step, span):
    """:func:`restore`'s work (``span``: its trace span, told the step chosen)."""
    wait_pending()  # the agreements below use the communicator of a pending save
    tree = _from_memory(directory, target, step, span)
    if tree is not None:
        return tree
    # Every process raises alike (see manifest.agreed), so none waits in a collective.
    steps = manifest.agreed(communicator(), lambda: _step_to_restore(directory, step), "restore",
                            CheckpointError, share=True)
    if len(set(steps)) > 1:  # a shared filesystem that shows processes different files
        manifest.warn_once(("steps", os.path.realpath(directory), tuple(steps)),
                           f"spmd.checkpointing.restore: the processes see different latest "
                           f"complete steps in {directory!r} ({steps}, by process); "
                           f"restoring step {min(steps)}, the oldest of them")
    chosen = min(steps)
    span.args["step"] = chosen
    return manifest.agreed(communicator(), lambda: _restore_step(directory, chosen, target),
                           f"restore of {step_dir(directory, chosen)}", CheckpointError)


def _from_memory(directory: str, target, step, span):
    """The tree from the newest whole in-memory step when it is the one to restore
    (None: read the disk)."""
    found = memory.newest(directory, step)
    if found is None:
        return None
    disk = None if step is not None else _disk_step(directory)
    if disk is not None and disk > found.step:
        return None
    try:
        tree = memory.read(directory, found, lambda meta: _checked(
            meta, target, f"the in-memory step {found.step}"))
    except memory.TierDamaged as e:
        manifest.warn_once(("memory", os.path.realpath(directory), found.name,
                            os.environ.get(memory_tier.JOB_ENV)),
                           f"spmd.checkpointing.restore: {e}; "
                           "restoring from the checkpoints on disk instead", stacklevel=5)
        return None
    span.args.update(step=found.step, tier="memory")
    return tree


def _step_to_restore(directory: str, step) -> int:
    if step is not None:
        return int(step)
    found = _latest_on_disk(directory)
    if found is not None:
        return found
    committed = all_steps(directory)
    if committed:  # every committed step is damaged: say how
        why = "; ".join(f"step {s}: {incomplete(step_dir(directory, s))}"
                        for s in reversed(committed[-3:]))
        raise CheckpointError(f"restore: no complete checkpoint in {directory!r} ({why}); "
                              "copy a step again from where it was saved")
    listing = sorted(os.listdir(directory)) if os.path.isdir(directory) else None
    raise CheckpointError(
        f"restore: no complete checkpoint in {directory!r}" +
        (f" (it holds {listing[:8]})" if listing else " (no such directory)"
         if listing is None else " (it is empty)"))


def _restore_step(directory: str, step: int, target):
    path = step_dir(directory, step)
    if not os.path.isdir(path):
        raise CheckpointError(f"restore: no checkpoint for step {step} in {directory!r} "
                              f"(steps there: {all_steps(directory)})")
    meta = read_meta(path)
    plans, treedef = _checked(meta, target, path)
    checks = manifest.ReadChecks(directory, step, path, meta, lambda: next(
        (s for s in reversed(all_steps(directory))
         if s != step and incomplete(step_dir(directory, s)) is None), None))
    leaves = [_read_leaf(checks, *plan) for plan in plans]
    return tree_util.tree_unflatten(treedef, leaves)


def _checked(meta: dict, target, where: str):
    """``(plans, treedef)``: the target's leaves as ``(saved leaf, shape, sharding or
    None)``, in its order, checked against what ``meta`` says was saved."""
    saved = {leaf["path"]: leaf for leaf in meta["leaves"]}
    paths_targets, treedef = tree_util.tree_flatten_with_path(
        target, is_leaf=lambda x: isinstance(x, (NamedSharding, SingleDeviceSharding)))
    wanted = [tree_util.keystr(p) for p, _ in paths_targets]
    missing = [p for p in wanted if p not in saved]
    extra = [p for p in saved if p not in set(wanted)]
    if missing or extra:
        raise CheckpointError(
            f"restore: the target's structure differs from the checkpoint {where}: "
            f"in the target only: {missing[:8] or 'none'}; in the checkpoint only: "
            f"{extra[:8] or 'none'}")
    plans = []
    for p, t in zip(wanted, (t for _, t in paths_targets)):
        leaf = saved[p]
        shape, dtype = tuple(leaf["shape"]), np.dtype(leaf["dtype"])
        sh, t_shape, t_dtype = _target_info(t, p)
        if t_shape is not None and t_shape != shape:
            raise CheckpointError(f"restore: the leaf at {p} was saved with shape {shape}; "
                                  f"the target asks for {t_shape}")
        if t_dtype is not None and t_dtype != dtype:
            raise CheckpointError(f"restore: the leaf at {p} was saved as {dtype}; the target "
                                  f"asks for {t_dtype} (restore as saved, then cast)")
        if sh is not None:
            try:
                check_spec(sh.spec, sh.mesh, shape, f"restore of {p}")
            except ShardingError as e:
                raise CheckpointError(f"restore: the target sharding of the leaf at {p} does "
                                      f"not fit its saved shape {shape}: {e}") from None
        plans.append((leaf, shape, sh))
    return plans, treedef


def _read_leaf(checks, leaf: dict, shape: tuple, sharding):
    try:
        store = layout.open_store(os.path.join(checks.path, leaf["file"]))
    except Exception as e:  # its zarr.json lost or damaged
        raise CheckpointError(f"restore: step {checks.step} in {checks.directory!r} is "
                              f"damaged: the array of the leaf at {leaf['path']} "
                              f"({leaf['file']}) does not open ({type(e).__name__}: {e}); "
                              f"{checks.fix()}") from None

    def read(index):
        why = checks.before_read(leaf, index)
        if why is not None:
            raise CheckpointError(why)
        try:
            return np.asarray((store.read() if index is Ellipsis else store[index].read())
                              .result())
        except Exception as e:  # tensorstore's errors, named by leaf and block
            raise CheckpointError(checks.read_failed(leaf, index, e)) from None

    if sharding is None:
        return read(Ellipsis)
    return make_array_from_callback(shape, sharding, read)


def saved_metadata(directory: str, step: int | None = None) -> dict:
    """The metadata of a checkpoint: step, leaves (path, shape, dtype, saving mesh and
    spec)."""
    step = latest_step(directory) if step is None else step
    if step is None:
        raise CheckpointError(f"saved_metadata: no complete checkpoint in {directory!r}")
    return read_meta(step_dir(directory, step))
