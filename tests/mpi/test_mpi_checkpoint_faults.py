"""Damaged checkpoints across processes: each rank writes the manifest of its own
chunks, checks only the chunks it reads, and a damage one rank finds is the same
:class:`CheckpointError` on every rank (no rank is left waiting).

Runs on 2 or 4 ranks (``NP=2 bash .ci/pytest_mpi.sh tests/mpi/test_mpi_checkpoint_faults.py``),
any number of devices per rank.  Oracle: the saved numpy values.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import make_mesh  # noqa: E402

import spmd  # noqa: E402
from spmd import NamedSharding, P  # noqa: E402
from spmd import checkpointing as ckpt  # noqa: E402
from spmd.checkpointing import CheckpointError  # noqa: E402

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]

BLOCK = 4096  # elements per device's block


def _world():
    from spmd.launch.mpi_init import world

    return world()


@pytest.fixture
def shared_dir(tmp_path):
    """Rank 0's tmp_path, the same directory on every rank (one machine)."""
    d = _world().bcast(str(tmp_path / "ck") if spmd.process_index() == 0 else None, root=0)
    yield d
    _world().Barrier()  # no rank's next test starts while another still reads here


def _saved(shared_dir):
    """Steps 0 and 1 of {'x': a P('i') array, one block per device}; (mesh, values of
    step 1, this rank's chunk keys)."""
    mesh = make_mesh("1d")
    n = mesh.size * BLOCK
    values = np.arange(n, dtype=np.float32) + 1
    for step, scale in ((0, 0.5), (1, 1.0)):
        x = spmd.make_array_from_callback((n,), NamedSharding(mesh, P("i")),
                                          lambda idx: values[idx] * scale)
        ckpt.save(shared_dir, {"x": x}, step=step)
    mine = sorted(f"leaf_00000/c/{s.index[0].start // BLOCK}" for s in x.addressable_shards)
    return mesh, values, mine


def _on_rank_0(damage) -> None:
    """Run ``damage()`` on rank 0 between barriers; if it fails, fail every rank (a
    failure on one rank alone would leave the others waiting)."""
    _world().Barrier()
    error = None
    if spmd.process_index() == 0:
        try:
            damage()
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
    error = _world().bcast(error, root=0)
    assert error is None, f"damaging the checkpoint on rank 0 failed: {error}"


def _agreed_texts(text: str) -> set:
    return set(_world().allgather(text))


def test_each_rank_lists_its_own_chunks_and_a_deleted_chunk_fails_every_rank(shared_dir):
    mesh, values, mine = _saved(shared_dir)
    me, last = spmd.process_index(), spmd.process_count() - 1
    step1 = os.path.join(shared_dir, "step_1")
    with open(os.path.join(step1, f"spmd_manifest.{me}.json")) as f:
        listed = json.load(f)["chunks"]
    assert sorted(listed) == mine  # its own blocks, and only those
    assert all(size == 4 * BLOCK + 4 for size, _ in listed.values())
    assert ckpt.saved_metadata(shared_dir)["writers"] == spmd.process_count()

    victim = _world().bcast(mine[0] if me == last else None, root=last)
    # A chunk that only the last rank writes and reads is lost.
    _on_rank_0(lambda: os.remove(os.path.join(step1, victim)))
    target = {"x": NamedSharding(mesh, P("i"))}
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(shared_dir, target, step=1)
    text = str(info.value)
    k = int(victim.rsplit("/", 1)[1])
    assert (f"step 1 in {shared_dir!r} is damaged: the leaf at ['x'], block "
            f"[{k * BLOCK}:{(k + 1) * BLOCK}] (chunk c/{k} of leaf_00000), is missing; process "
            f"{last} wrote it") in text, text
    assert "restore(..., step=0)" in text and f"[seen by process(es) [{last}]]" in text
    assert len(_agreed_texts(text)) == 1  # the same error on every rank

    # Every rank skips step 1 (said once) and restores step 0; nothing is left half-agreed.
    with pytest.warns(UserWarning, match=rf"skipping step 1 .*{victim} .* is missing"):
        assert ckpt.latest_step(shared_dir) == 0
    out = ckpt.restore(shared_dir, target)
    for s in out["x"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), values[s.index] * 0.5)


def test_a_lost_manifest_or_truncated_chunk_fails_every_rank(shared_dir):
    mesh, values, mine = _saved(shared_dir)
    me, last = spmd.process_index(), spmd.process_count() - 1
    step1 = os.path.join(shared_dir, "step_1")
    first = _world().bcast(mine[0] if me == 0 else None, root=0)

    def damage():  # the last rank's manifest never arrived; rank 0's first chunk is cut short
        os.remove(os.path.join(step1, f"spmd_manifest.{last}.json"))
        with open(os.path.join(step1, first), "r+b") as f:
            f.truncate(100)

    _on_rank_0(damage)
    # Restored onto the devices in reverse: every rank reads another rank's blocks.
    devices = np.array(mesh.devices).reshape(-1)[::-1]
    target = {"x": NamedSharding(spmd.Mesh(devices, ("i",)), P("i"))}
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(shared_dir, target, step=1)
    text = str(info.value)
    assert len(_agreed_texts(text)) == 1 and "step 1" in text and "['x']" in text
    # The first failing rank's error: the one that reads rank 0's chunk (truncated)
    # or a chunk of the last rank (in no manifest).
    assert ("has 100 bytes where the save wrote" in text
            or f"the manifest of process {last} (spmd_manifest.{last}.json) is missing" in text)
    with pytest.warns(UserWarning, match=rf"skipping step 1 .*manifest of process {last}"):
        assert ckpt.latest_step(shared_dir) == 0
