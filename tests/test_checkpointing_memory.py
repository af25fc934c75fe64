"""The fast tier (spmd.checkpointing.memory, ``save(..., local=True)``) in one process:
round trips onto other meshes, which tier ``restore`` and ``latest_step`` pick,
pruning, damage (a step with an altered or missing block file is never read: the
disk is, or an error says there is nothing), the job id, and every bad input.

Oracles: the saved numpy values.  Each test has a job id of its own, and its
``/dev/shm`` directory is removed afterwards (checked).  Across processes and nodes:
tests/launch/test_fast_tier_restart.py and tests/multinode/test_fast_recovery.py.
"""

from __future__ import annotations

import os
import re
import uuid
import warnings

import numpy as np
import pytest

import spmd
from spmd import P, NamedSharding
from spmd import checkpointing as ckpt
from spmd.checkpointing import CheckpointError, memory
from spmd.launch import memory_tier

W = np.arange(64, dtype=np.float32).reshape(8, 8)
B = np.arange(8, dtype=np.int32)


@pytest.fixture
def job(monkeypatch):
    """A job id of this test's own; its memory is checked and removed afterwards."""
    name = "test-" + uuid.uuid4().hex[:10]
    monkeypatch.setenv(memory_tier.JOB_ENV, name)
    monkeypatch.setenv("SPMD_RESTART_ATTEMPT", "0")
    yield name
    memory_tier.remove(name)
    assert not os.path.exists(memory_tier.job_dir(name))


def _tree(mesh, scale=1.0):
    return {"w": spmd.device_put(W * scale, NamedSharding(mesh, P("a", "b"))),
            "b": spmd.device_put(B, NamedSharding(mesh, P("b"))),
            "count": np.int32(7), "half": np.float16(scale)}


def _target(mesh):
    return {"w": NamedSharding(mesh, P(None, mesh.axis_names[-1])), "b": NamedSharding(mesh, P()),
            "count": np.int32(0), "half": np.float16(0)}


def _check(out, scale=1.0):
    np.testing.assert_array_equal(np.asarray(out["w"]), W * scale)
    np.testing.assert_array_equal(np.asarray(out["b"]), B)
    assert int(out["count"]) == 7 and float(out["half"]) == np.float16(scale)


def test_a_step_in_memory_restores_onto_another_mesh(job, tmp_path):
    mesh, other = spmd.make_mesh((4, 2), ("a", "b")), spmd.make_mesh((8,), ("d",))
    where = ckpt.save(str(tmp_path), _tree(mesh), step=5, local=True)
    assert os.path.dirname(where) == memory.tier_dir(str(tmp_path))
    assert re.fullmatch(r"step_5\.a0\.s\d+", os.path.basename(where)), where
    assert where.startswith(memory_tier.job_dir(job))
    assert sorted(os.listdir(where)) == ["commit.r0", "r0.w0.bin", "r0.w0.json"]
    assert not os.listdir(tmp_path)  # nothing on disk
    assert ckpt.latest_step(str(tmp_path)) is None
    assert ckpt.latest_step(str(tmp_path), local=True) == 5
    out = ckpt.restore(str(tmp_path), _target(other))
    _check(out)
    assert out["w"].sharding == NamedSharding(other, P(None, "d"))
    _check(ckpt.restore(str(tmp_path), _target(other), step=5))


def test_the_newer_tier_is_read(job, tmp_path):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    ckpt.save(str(tmp_path), _tree(mesh, 2.0), step=10)
    ckpt.save(str(tmp_path), _tree(mesh, 3.0), step=11, local=True)
    assert ckpt.latest_step(str(tmp_path), local=True) == 11
    _check(ckpt.restore(str(tmp_path), _target(mesh)), 3.0)           # memory: newer
    _check(ckpt.restore(str(tmp_path), _target(mesh), step=10), 2.0)  # asked for: disk
    ckpt.save(str(tmp_path), _tree(mesh, 4.0), step=12)
    assert ckpt.latest_step(str(tmp_path), local=True) == 12
    _check(ckpt.restore(str(tmp_path), _target(mesh)), 4.0)           # disk: newer


def test_only_the_newest_steps_are_kept(job, tmp_path):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    tier = memory.tier_dir(str(tmp_path))
    for k in range(1, 4):
        ckpt.save(str(tmp_path), _tree(mesh, k), step=k, local=True)
    steps = lambda: sorted(n.rsplit(".s", 1)[0] for n in os.listdir(tier)  # noqa: E731
                           if not n.startswith("."))
    assert steps() == ["step_3.a0"]
    # (the dropped steps' block files are kept aside, to be written over)
    assert len(os.listdir(os.path.join(tier, ".spare"))) >= 1
    ckpt.save(str(tmp_path), _tree(mesh, 4.0), step=4, local=True, keep=2)
    assert steps() == ["step_3.a0", "step_4.a0"]
    pending = ckpt.save_async(str(tmp_path), _tree(mesh, 5.0), step=5, local=True, keep=2)
    assert pending.wait().startswith(os.path.join(tier, "step_5.a0.s"))
    assert steps() == ["step_4.a0", "step_5.a0"]
    _check(ckpt.restore(str(tmp_path), _target(mesh)), 5.0)


def _damage(path: str, how: str) -> None:
    if how == "altered":
        with open(os.path.join(path, "r0.w0.bin"), "r+b") as f:
            f.seek(17)
            byte = f.read(1)
            f.seek(17)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif how == "truncated":
        with open(os.path.join(path, "r0.w0.bin"), "r+b") as f:
            f.truncate(100)
    elif how == "a process's blocks missing":
        os.remove(os.path.join(path, "r0.w0.json"))
    else:  # the save never committed
        os.remove(os.path.join(path, "commit.r0"))


@pytest.mark.parametrize("how", ["altered", "truncated", "a process's blocks missing",
                                 "uncommitted"])
def test_a_damaged_step_in_memory_is_never_read(job, tmp_path, how):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    ckpt.save(str(tmp_path), _tree(mesh, 2.0), step=3)
    where = ckpt.save(str(tmp_path), _tree(mesh, 9.0), step=4, local=True)
    _damage(where, how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ckpt.restore(str(tmp_path), _target(mesh))
    _check(out, 2.0)  # the disk's step 3
    said = [str(w.message) for w in caught]
    if how in ("altered", "truncated"):  # found whole, then its bytes failed the check
        assert any(f"are {how} (the crc32 or size differs" in m and
                   "restoring from the checkpoints on disk instead" in m for m in said), said
        assert ckpt.latest_step(str(tmp_path), local=True) == 4  # (not read by it)
    else:  # never counted as whole
        assert ckpt.latest_step(str(tmp_path), local=True) == 3


def test_a_damaged_step_in_memory_and_nothing_on_disk(job, tmp_path):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    where = ckpt.save(str(tmp_path), _tree(mesh), step=4, local=True)
    _damage(where, "altered")
    with pytest.warns(UserWarning, match="are altered"):
        with pytest.raises(CheckpointError, match="no complete checkpoint in"):
            ckpt.restore(str(tmp_path), _target(mesh))


def test_a_target_that_does_not_match_is_an_error_not_a_fallback(job, tmp_path):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    ckpt.save(str(tmp_path), _tree(mesh), step=2)
    ckpt.save(str(tmp_path), _tree(mesh), step=4, local=True)
    target = _target(mesh)
    del target["half"]
    with pytest.raises(CheckpointError, match=r"differs from the checkpoint the in-memory "
                                              r"step 4: in the target only: none; in the "
                                              r"checkpoint only: \[\"\['half'\]\"\]"):
        ckpt.restore(str(tmp_path), target)
    target = dict(_target(mesh), count=np.zeros(3, np.int32))
    with pytest.raises(CheckpointError, match=r"the leaf at \['count'\] was saved with shape"):
        ckpt.restore(str(tmp_path), target)


def test_a_step_saved_again_never_mixes_with_its_first_save(job, tmp_path):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    first = ckpt.save(str(tmp_path), _tree(mesh, 1.0), step=6, local=True)
    again = ckpt.save(str(tmp_path), _tree(mesh, 2.0), step=6, local=True)
    assert first != again and not os.path.exists(first)  # its own directory; the first dropped
    _check(ckpt.restore(str(tmp_path), _target(mesh)), 2.0)


def test_two_checkpoint_directories_never_mix(job, tmp_path):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    ckpt.save(str(tmp_path / "one"), _tree(mesh, 1.0), step=8, local=True)
    ckpt.save(str(tmp_path / "two"), _tree(mesh, 2.0), step=3, local=True)
    _check(ckpt.restore(str(tmp_path / "one"), _target(mesh)), 1.0)
    _check(ckpt.restore(str(tmp_path / "two"), _target(mesh)), 2.0)


def test_other_dtypes_round_trip(job, tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    mesh = spmd.make_mesh((8,), ("d",))
    tree = {"flags": np.array([True, False, True]), "i8": np.arange(-4, 4, dtype=np.int8),
            "bf": np.array([1.5, -2.25, 3.0], ml_dtypes.bfloat16),
            "f8": np.array([0.5, -1.0, 2.0], ml_dtypes.float8_e4m3fn),
            "sharded": spmd.device_put(np.arange(16, dtype=ml_dtypes.bfloat16),
                                       NamedSharding(mesh, P("d")))}
    ckpt.save(str(tmp_path), tree, step=1, local=True)
    target = {k: np.zeros_like(v) for k, v in tree.items() if k != "sharded"}
    out = ckpt.restore(str(tmp_path), dict(target, sharded=NamedSharding(mesh, P())))
    for k, v in tree.items():
        assert out[k].dtype == v.dtype
        np.testing.assert_array_equal(np.asarray(out[k]).astype(np.float64),
                                      np.asarray(v).astype(np.float64))


def test_without_a_job_id_saving_in_memory_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.delenv(memory_tier.JOB_ENV, raising=False)
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    with pytest.raises(CheckpointError, match=r"save\(local=True\): in-memory checkpoints "
                                              r"need a job .* \$SPMD_JOB_ID is not set; run "
                                              r"under spmd-run"):
        ckpt.save(str(tmp_path), _tree(mesh), step=1, local=True)
    assert ckpt.latest_step(str(tmp_path), local=True) is None  # no tier: the disk's
    ckpt.save(str(tmp_path), _tree(mesh), step=2)
    _check(ckpt.restore(str(tmp_path), _target(mesh)))


@pytest.mark.parametrize("value", ["a/b", "..", "x" * 65, "white space"])
def test_a_bad_job_id_is_named(monkeypatch, tmp_path, value):
    monkeypatch.setenv(memory_tier.JOB_ENV, value)
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    with pytest.raises(CheckpointError, match=f"SPMD_JOB_ID={value!r} cannot name a "
                                              "directory; use 1-64 letters"):
        ckpt.save(str(tmp_path), _tree(mesh), step=1, local=True)
    with pytest.raises(CheckpointError, match="cannot name a directory"):
        ckpt.restore(str(tmp_path), _target(mesh))


@pytest.mark.parametrize("kwargs, match", [
    (dict(step=-1), r"step must be an integer >= 0, got -1"),
    (dict(step=True), r"step must be an integer >= 0, got True"),
    (dict(step=1, keep=0), r"keep must be an integer >= 1 or None, got 0"),
])
def test_bad_arguments_are_named(job, tmp_path, kwargs, match):
    mesh = spmd.make_mesh((4, 2), ("a", "b"))
    with pytest.raises(CheckpointError, match=r"save\(local=True\): " + match):
        ckpt.save(str(tmp_path), _tree(mesh), local=True, **kwargs)
    assert not os.path.exists(memory_tier.job_dir(job))  # nothing half-written


@pytest.mark.parametrize("value", [np.array([object()]), np.array([1 + 2j], np.complex64)])
def test_a_leaf_of_another_dtype_is_refused(job, tmp_path, value):
    with pytest.raises(CheckpointError, match=rf"the leaf at \['x'\] has dtype {value.dtype}, "
                                              "which checkpoints do not store"):
        ckpt.save(str(tmp_path), {"x": value}, step=1, local=True)


@pytest.mark.parametrize("hosts, expected", [
    (["a"], [None]),
    (["a", "a", "a"], [None, None, None]),
    (["a", "a", "b", "b"], [2, 3, 0, 1]),
    (["a", "b", "a", "b"], [1, 0, 3, 2]),
    (["a", "a", "b"], [2, 2, 0]),
    (["a", "b", "c"], [1, 2, 0]),
])
def test_each_copy_goes_to_the_next_node(hosts, expected):
    out = memory.partners(hosts)
    assert out == expected
    for r, p in enumerate(out):
        assert p is None or hosts[p] != hosts[r]
