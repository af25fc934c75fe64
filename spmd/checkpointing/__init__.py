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
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import sys
import threading
import uuid
import warnings
from typing import Any

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.checkpointing import manifest
from spmd import tree_util
from spmd.collectives.mpi.control import Watched
from spmd.compiler.core.array import Array
from spmd.errors import SpmdError
from spmd.launch.mpi import threads_may_call_mpi, world
from spmd.mesh import process_count, process_index
from spmd.shard.arrays.placing import SingleDeviceSharding, make_array_from_callback
from spmd.shard.arrays.spec import NamedSharding, ShardingError, check_spec

METADATA = "spmd_checkpoint.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_FORMAT = 2  # 2: chunk manifests and the crc32c codec; 1: neither


class CheckpointError(SpmdError, ValueError):
    """A checkpoint that is missing, incomplete, or does not match its target."""


# ------------------------------------------------------------ coordination

_comm_cache: list = []


def _comm():
    """A communicator of all processes for the save protocol (None in one process).

    Its own duplicate of the world communicator: the barriers and flags of a save
    can never pair with a data collective of the program."""
    if process_count() == 1:
        return None
    if not _comm_cache:
        with watched("setting up"):
            _comm_cache.append(world().Dup())
    return _comm_cache[0]


def watched(what: str):
    """The protocol's exchanges are collective over every process: watched like a
    collective (the deadline, ``spmd-run``'s check for ranks that finished), so that a
    process that exits or never saves is reported instead of waited for."""
    return Watched(tuple(range(process_count())), f"checkpointing ({what})")


def _all_ok(ok: bool, what: str) -> None:
    """Raise on every process unless ``ok`` holds on all of them (naming the ranks)."""
    comm = _comm()
    if comm is None:
        flags = [ok]
    else:
        with watched(what):
            flags = comm.allgather(ok)
    bad = [r for r, f in enumerate(flags) if not f]
    if bad:
        raise CheckpointError(f"{what} failed on process(es) {bad}; see their errors")


def _bcast(value):
    comm = _comm()
    if comm is None:
        return value
    with watched("agreeing on a name"):
        return comm.bcast(value, root=0)


# --------------------------------------------------------------- helpers

def step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"step_{int(step)}")


def all_steps(directory: str) -> list[int]:
    """The steps of the committed checkpoints in ``directory`` (their metadata
    written), ascending; :func:`latest_step` also checks that their chunks are all
    there."""
    if not os.path.isdir(directory):
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
        why = _incomplete(step_dir(directory, step))
        if why is None:
            return step
        manifest.warn_once(("skip", os.path.realpath(step_dir(directory, step))),
                           f"spmd.checkpointing.latest_step: skipping step {step} in "
                           f"{directory!r}: {why}")
    return None


def _incomplete(path: str) -> str | None:
    """Why the committed checkpoint ``path`` is not complete (None when it is)."""
    try:
        meta = _read_meta(path)
    except CheckpointError as e:
        return str(e)
    if meta.get("format", 1) < 2:  # no manifests to check against
        return None
    return manifest.incomplete(path, meta)


def _store(path: str, meta: dict | None = None):
    import tensorstore as ts  # optional (third-party): needed by a save or a restore only

    # Chunks equal to the fill value are written too: every chunk has a file, so a
    # missing file is always a loss.
    spec: dict = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                  "store_data_equal_to_fill_value": True}
    if meta is None:
        return ts.open(spec, open=True).result()
    spec["metadata"] = meta
    return ts.open(spec, create=True, delete_existing=True).result()


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


# ------------------------------------------------------------------- save

def save(directory: str, tree, *, step: int, keep: int | None = None) -> str:
    """Save ``tree`` as ``<directory>/step_<step>``; every process must call it.

    Each process writes only the blocks its devices hold (replicated blocks
    once).  ``keep``: then delete all but the newest ``keep`` checkpoints.
    Returns the checkpoint's directory.  Waits for a pending :func:`save_async`
    first, so checkpoints commit in the order they were asked for.

    >>> save("ckpt", {"params": params}, step=10, keep=2)
    'ckpt/step_10'
    """
    wait_pending()  # one save at a time uses the checkpoint communicator
    return _write(_plan(directory, tree, step, keep, copy=False))


class PendingSave:
    """A checkpoint being written by a background thread (see :func:`save_async`)."""

    def __init__(self, plan: "_Plan", background: bool = True):
        self.path = plan.final
        self._error: BaseException | None = None
        self._reported = False  # whether its error reached the caller
        self._thread = threading.Thread(target=self._run, args=(plan,),
                                        name=f"spmd-checkpoint-{plan.step}", daemon=True)
        self._thread.start()
        if not background:
            self._thread.join()

    def _run(self, plan):
        try:
            _write(plan)
        except BaseException as e:  # re-raised by wait() in the caller's thread
            self._error = e

    def done(self) -> bool:
        """True once the checkpoint is committed (or its save failed)."""
        return not self._thread.is_alive()

    def wait(self) -> str:
        """Block until the checkpoint is committed; return its directory, or raise the
        save's error."""
        self._thread.join()
        if self._error is not None:
            self._reported = True
            raise self._error
        return self.path


_pending: list[PendingSave] = []
_pending_lock = threading.Lock()


def save_async(directory: str, tree, *, step: int, keep: int | None = None) -> PendingSave:
    """Start saving ``tree`` as ``<directory>/step_<step>`` in a background thread and
    return at once; every process must call it.

    The arguments are checked, and the blocks this process writes are copied,
    before it returns, so training may go on and change its arrays.  A second
    save (async or not) first waits for a pending one, so checkpoints commit in
    order and at most one is in flight; ``wait()`` on the
    returned handle re-raises a failed save's error.  The program waits for a
    pending save at exit.

    >>> pending = save_async("ckpt", state, step=200, keep=3)
    >>> ...                                   # more training steps
    >>> pending.wait()
    'ckpt/step_200'
    """
    with _pending_lock:
        # The plan's checks are collectives on the checkpoint communicator, which a
        # pending save's thread may still be using: one save at a time.
        wait_pending()
        plan = _plan(directory, tree, step, keep, copy=True)
        if not _exit_hook:
            # Registered now, after MPI is up (the plan made the communicator), so that
            # it runs before MPI finalises at exit (atexit runs last-in, first-out).
            atexit.register(_wait_at_exit)
            _exit_hook.append(True)
        handle = PendingSave(plan, background=_threads_may_call_mpi())
        _pending.append(handle)
    return handle


def _threads_may_call_mpi() -> bool:
    """Whether a background thread may run the save's MPI calls while the main thread
    runs the program's collectives (MPI_THREAD_MULTIPLE; mpi4py asks for it)."""
    if process_count() == 1 or threads_may_call_mpi():
        return True
    warnings.warn("spmd.checkpointing.save_async: this MPI library was initialised without "
                  "MPI_THREAD_MULTIPLE, so the save runs in the calling thread",
                  RuntimeWarning, stacklevel=3)
    return False


def wait_pending() -> None:
    """Wait for every checkpoint started by :func:`save_async` to commit.  A failed
    save whose handle's ``wait()`` was never called raises here (a checkpoint must
    never go missing unnoticed); the others raise from ``wait()``."""
    failed = []
    while _pending:
        handle = _pending.pop(0)
        handle._thread.join()
        if handle._error is not None and not handle._reported:
            handle._reported = True
            failed.append(handle)
    if failed:
        raise CheckpointError(
            f"the asynchronous save of {failed[0].path} failed (its wait() was never "
            f"called): {failed[0]._error}") from failed[0]._error


_exit_hook: list = []


def _wait_at_exit() -> None:
    """At exit: let pending saves commit; say so loudly if one failed unnoticed."""
    try:
        wait_pending()
    except CheckpointError as e:
        print(f"spmd.checkpointing: {e}", file=sys.stderr, flush=True)


class _Plan:
    """What one process writes for one checkpoint, checked on every process."""

    def __init__(self, directory, step, keep, final, treedef, leaves, replace=False):
        self.directory, self.step, self.keep, self.final = directory, step, keep, final
        self.replace = replace  # a damaged checkpoint of this step is there
        self.treedef, self.leaves = treedef, leaves  # leaves: (path, shape, dtype, sh, blocks)


def _plan(directory: str, tree, step, keep, *, copy: bool) -> _Plan:
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"save: step must be an integer >= 0, got {step!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise CheckpointError(f"save: keep must be an integer >= 1 or None, got {keep!r}")
    paths_leaves, treedef = tree_util.tree_flatten_with_path(tree)
    me = process_index()
    _comm()  # created here, in the calling thread: Dup is a collective on the world
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
        _all_ok(ok, f"save of {step_dir(directory, step)}: reading the blocks")
    final = step_dir(directory, step)
    # An existing step is never overwritten unless it is damaged: latest_step skips
    # it, so a run resumed from an earlier step saves this step again.  Process 0's
    # view decides, so that all processes raise or none.
    exists, damaged = _bcast((os.path.exists(final), os.path.exists(final) and
                              _incomplete(final)) if me == 0 else None)
    if exists and not damaged:
        raise CheckpointError(f"save: {final} already exists; save under a new step, or "
                              "delete it first")
    if exists:
        manifest.warn_once(("replace", os.path.realpath(final)),
                           f"spmd.checkpointing.save: {final} exists but is damaged "
                           f"({damaged}); this save replaces it", stacklevel=5)
    return _Plan(directory, int(step), keep, final, treedef, leaves, replace=exists)


def _write(plan: _Plan) -> str:
    directory, final, me = plan.directory, plan.final, process_index()
    nonce = _bcast(uuid.uuid4().hex[:12] if me == 0 else None)
    tmp = os.path.join(directory, f".tmp-step_{plan.step}.{nonce}")
    ok = True
    try:
        if me == 0:
            os.makedirs(directory, exist_ok=True)
            _remove_stale_tmp(directory)
            os.makedirs(tmp)
            for i, (p, shape, dtype, sh, _) in enumerate(plan.leaves):
                _store(os.path.join(tmp, f"leaf_{i:05d}"), {
                    "shape": list(shape), "data_type": _zarr_dtype(dtype, p),
                    "chunk_grid": {"name": "regular",
                                   "configuration": {"chunk_shape": _chunk(shape, sh)}},
                    "codecs": manifest.codecs(dtype)})
    except BaseException:
        ok = False
        raise
    finally:
        _all_ok(ok, f"save of {final}: creating the arrays")
    try:
        writes = []
        for i, (p, shape, dtype, sh, blocks) in enumerate(plan.leaves):
            store = _store(os.path.join(tmp, f"leaf_{i:05d}")) if blocks else None
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
        _all_ok(ok, f"save of {final}: writing the blocks")
    try:
        if me == 0:
            meta = {"format": _FORMAT, "step": plan.step, "treedef": str(plan.treedef),
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
        _all_ok(ok, f"save of {final}: the commit")
    return final


def _remove_stale_tmp(directory: str) -> None:
    for name in os.listdir(directory):
        if name.startswith(".tmp-step_"):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _zarr_dtype(dtype: np.dtype, path: str) -> str:
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise CheckpointError(f"save: the leaf at {path} has dtype {dtype}, which checkpoints "
                              "do not store (bool, integer and floating dtypes)")
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


# ---------------------------------------------------------------- restore

def _read_meta(path: str) -> dict:
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


def restore(directory: str, target, *, step: int | None = None):
    """Read the checkpoint of ``step`` (default: the latest complete one) in
    ``directory`` into the structure of ``target``, placed by its shardings; every
    process must call it.

    ``target`` is a pytree like the saved one whose leaves are ``NamedSharding``s,
    arrays (their sharding, shape and dtype), or abstract arrays with ``.shape``,
    ``.dtype`` and ``.sharding``.  Leaves without a sharding restore as whole
    numpy arrays.  Each process reads only the blocks of its devices, and checks
    each chunk it reads against the save's manifests: a missing, truncated or
    altered chunk raises :class:`CheckpointError` on every process, naming the
    step, the leaf and the block.  Waits for a pending :func:`save_async` first.

    >>> state = restore("ckpt", tree_map(lambda x: x.sharding, state))
    """
    wait_pending()  # the agreements below use the communicator of a pending save
    # Every process raises alike (see manifest.agreed), so none waits in a collective.
    steps = manifest.agreed(_comm(), lambda: _step_to_restore(directory, step), "restore",
                            CheckpointError, share=True)
    if len(set(steps)) > 1:  # a shared filesystem that shows processes different files
        manifest.warn_once(("steps", os.path.realpath(directory), tuple(steps)),
                           f"spmd.checkpointing.restore: the processes see different latest "
                           f"complete steps in {directory!r} ({steps}, by process); "
                           f"restoring step {min(steps)}, the oldest of them")
    chosen = min(steps)
    return manifest.agreed(_comm(), lambda: _restore_step(directory, chosen, target),
                           f"restore of {step_dir(directory, chosen)}", CheckpointError)


def _step_to_restore(directory: str, step) -> int:
    if step is not None:
        return int(step)
    found = latest_step(directory)
    if found is not None:
        return found
    committed = all_steps(directory)
    if committed:  # every committed step is damaged: say how
        why = "; ".join(f"step {s}: {_incomplete(step_dir(directory, s))}"
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
    meta = _read_meta(path)
    saved = {leaf["path"]: leaf for leaf in meta["leaves"]}
    paths_targets, treedef = tree_util.tree_flatten_with_path(
        target, is_leaf=lambda x: isinstance(x, (NamedSharding, SingleDeviceSharding)))
    wanted = [tree_util.keystr(p) for p, _ in paths_targets]
    missing = [p for p in wanted if p not in saved]
    extra = [p for p in saved if p not in set(wanted)]
    if missing or extra:
        raise CheckpointError(
            f"restore: the target's structure differs from the checkpoint {path}: "
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
    checks = manifest.ReadChecks(directory, step, path, meta, lambda: next(
        (s for s in reversed(all_steps(directory))
         if s != step and _incomplete(step_dir(directory, s)) is None), None))
    leaves = [_read_leaf(checks, *plan) for plan in plans]
    return tree_util.tree_unflatten(treedef, leaves)


def _read_leaf(checks, leaf: dict, shape: tuple, sharding):
    try:
        store = _store(os.path.join(checks.path, leaf["file"]))
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
    return _read_meta(step_dir(directory, step))
