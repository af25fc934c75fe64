"""spmd.checkpointing: round trips across meshes and process counts, atomicity, and
every bad-input case.

Oracles: the saved numpy values.  The cross-process tests launch their own small
MPI jobs (4 and 2 ranks) under time limits and exchange checkpoints with this
process's 8 simulated devices.
"""

import os
import textwrap
import time

import numpy as np
import pytest

import spmd
from spmd import P, NamedSharding
from spmd import checkpointing as ckpt
from spmd.checkpointing import CheckpointError
from tests.mpi import run_mpi

W = np.arange(64, dtype=np.float32).reshape(8, 8)
B = np.arange(8, dtype=np.int32)


def _meshes():
    return {"4x2": spmd.make_mesh((4, 2), ("data", "model")),
            "2x4": spmd.make_mesh((2, 4), ("a", "b")),
            "8": spmd.make_mesh((8,), ("d",))}


def _tree(mesh):
    return {"params": {"w": spmd.device_put(W, NamedSharding(mesh, P("data", "model"))),
                       "b": spmd.device_put(B, NamedSharding(mesh, P("model")))},
            "step_scale": np.float32(0.5),
            "opt": (spmd.device_put(W * 2, NamedSharding(mesh, P())),)}


def _check(tree):
    np.testing.assert_array_equal(np.asarray(tree["params"]["w"]), W)
    np.testing.assert_array_equal(np.asarray(tree["params"]["b"]), B)
    assert float(tree["step_scale"]) == 0.5
    np.testing.assert_array_equal(np.asarray(tree["opt"][0]), W * 2)


@pytest.mark.parametrize("target_mesh, w_spec, b_spec", [
    ("4x2", P("data", "model"), P("model")),
    ("2x4", P(None, ("a", "b")), P("b")),
    ("8", P("d"), P()),
    ("8", P(), P("d")),
])
def test_round_trip_onto_another_mesh(tmp_path, target_mesh, w_spec, b_spec):
    meshes = _meshes()
    path = ckpt.save(str(tmp_path), _tree(meshes["4x2"]), step=3)
    assert path == str(tmp_path / "step_3") and ckpt.latest_step(str(tmp_path)) == 3
    m = meshes[target_mesh]
    target = {"params": {"w": NamedSharding(m, w_spec), "b": NamedSharding(m, b_spec)},
              "step_scale": np.float32(0), "opt": (NamedSharding(m, P()),)}
    out = ckpt.restore(str(tmp_path), target)
    _check(out)
    assert out["params"]["w"].sharding == NamedSharding(m, w_spec)


def test_restore_reads_only_each_devices_block(tmp_path, monkeypatch):
    meshes = _meshes()
    ckpt.save(str(tmp_path), {"w": spmd.device_put(W, NamedSharding(meshes["8"], P()))},
              step=0)
    reads = []
    real = ckpt.layout.open_store

    def spying_store(path, meta=None):
        store = real(path, meta)

        class Spy:
            def __getitem__(self, index):
                reads.append(index)
                return store[index]

            def read(self):
                reads.append("all")
                return store.read()
        return Spy()

    monkeypatch.setattr(ckpt.layout, "open_store", spying_store)
    out = ckpt.restore(str(tmp_path), {"w": NamedSharding(meshes["4x2"], P("data", "model"))})
    np.testing.assert_array_equal(np.asarray(out["w"]), W)
    assert "all" not in reads and len(reads) == 8  # one (2, 4) block per device
    assert all(tuple(s.stop - s.start for s in idx) == (2, 4) for idx in reads)


def test_save_writes_each_block_once_even_when_replicated(tmp_path, monkeypatch):
    mesh = _meshes()["4x2"]
    written = []
    real = ckpt.writing._blocks_to_write

    def spy(x, sharding, me):
        for index, block in real(x, sharding, me):
            written.append(block.shape)
            yield index, block

    monkeypatch.setattr(ckpt.writing, "_blocks_to_write", spy)
    # Split over 'data' only: each block is held by the 2 devices of a 'model' row.
    ckpt.save(str(tmp_path), {"w": spmd.device_put(W, NamedSharding(mesh, P("data")))}, step=0)
    assert written == [(2, 8)] * 4
    meta = ckpt.saved_metadata(str(tmp_path))
    assert meta["leaves"][0]["mesh"] == {"axis_names": ["data", "model"], "shape": [4, 2]}
    assert meta["leaves"][0]["spec"] == ["data"] and meta["step"] == 0


def test_keep_last_k_and_latest_step(tmp_path):
    mesh = _meshes()["8"]
    for step in (1, 5, 10, 20):
        ckpt.save(str(tmp_path), _tree(spmd.make_mesh((4, 2), ("data", "model"))), step=step,
                  keep=2)
    assert ckpt.all_steps(str(tmp_path)) == [10, 20]
    assert ckpt.latest_step(str(tmp_path)) == 20
    out = ckpt.restore(str(tmp_path), {"params": {"w": NamedSharding(mesh, P()),
                                                  "b": NamedSharding(mesh, P())},
                                       "step_scale": np.float32(0),
                                       "opt": (NamedSharding(mesh, P()),)}, step=10)
    _check(out)
    assert ckpt.latest_step(str(tmp_path / "nowhere")) is None


def test_a_crash_mid_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    mesh = _meshes()["4x2"]
    ckpt.save(str(tmp_path), _tree(mesh), step=1)
    calls = []
    real = ckpt.layout.open_store

    def failing(path, meta=None):  # the second leaf's writes fail
        if meta is None:
            calls.append(path)
            if len(calls) == 2:
                raise OSError("disk full")
        return real(path, meta)

    monkeypatch.setattr(ckpt.layout, "open_store", failing)
    with pytest.raises(CheckpointError, match="writing the blocks failed on process"):
        ckpt.save(str(tmp_path), _tree(mesh), step=2)
    assert ckpt.latest_step(str(tmp_path)) == 1
    assert any(n.startswith(".tmp-step_2.") for n in os.listdir(tmp_path))
    monkeypatch.setattr(ckpt.layout, "open_store", real)
    _check(ckpt.restore(str(tmp_path), _tree(mesh)))
    ckpt.save(str(tmp_path), _tree(mesh), step=2)  # the next save clears the debris
    assert not any(n.startswith(".tmp-") for n in os.listdir(tmp_path))


def test_a_failure_reading_the_blocks_fails_the_save_before_writing(tmp_path, monkeypatch):
    mesh = _meshes()["4x2"]

    def failing(x, sharding, me):
        raise MemoryError("no room for the copy")
        yield

    monkeypatch.setattr(ckpt.writing, "_blocks_to_write", failing)
    with pytest.raises(CheckpointError, match="reading the blocks failed on process"):
        ckpt.save(str(tmp_path), _tree(mesh), step=1)
    assert ckpt.latest_step(str(tmp_path)) is None


# ------------------------------------------------------------------ async save

def test_save_async_snapshots_the_values_and_commits_in_order(tmp_path):
    mesh = _meshes()["4x2"]
    tree = _tree(mesh)
    host = {"h": np.arange(6, dtype=np.float32)}
    first = ckpt.save_async(str(tmp_path), {**tree, **host}, step=1)
    host["h"][:] = -1  # training goes on and changes its buffers
    second = ckpt.save_async(str(tmp_path), {**tree, **host}, step=2, keep=1)
    assert second.wait() == os.path.join(str(tmp_path), "step_2")
    assert first.done() and first.wait() == os.path.join(str(tmp_path), "step_1")
    assert ckpt.all_steps(str(tmp_path)) == [2]  # keep=1 applied after step 1 committed
    back = ckpt.restore(str(tmp_path), {**_tree(mesh), "h": np.zeros(6, np.float32)})
    _check(back)
    np.testing.assert_array_equal(back["h"], -np.ones(6, np.float32))


def test_save_async_checks_its_arguments_at_once_and_raises_failures_in_wait(tmp_path,
                                                                            monkeypatch):
    with pytest.raises(CheckpointError, match="step must be an integer >= 0"):
        ckpt.save_async(str(tmp_path), {}, step=-2)
    ckpt.save(str(tmp_path), {"x": np.ones(2, np.float32)}, step=1)
    with pytest.raises(CheckpointError, match="step_1 already exists"):
        ckpt.save_async(str(tmp_path), {"x": np.ones(2, np.float32)}, step=1)

    def failing(path, meta=None):
        raise OSError("read-only file system")

    monkeypatch.setattr(ckpt.layout, "open_store", failing)
    pending = ckpt.save_async(str(tmp_path), {"x": np.ones(2, np.float32)}, step=2)
    with pytest.raises(CheckpointError, match="creating the arrays failed"):
        pending.wait()
    assert ckpt.latest_step(str(tmp_path)) == 1


# ------------------------------------------------------------------ bad input

def test_restore_into_another_structure_lists_the_paths(tmp_path):
    mesh = _meshes()["4x2"]
    ckpt.save(str(tmp_path), _tree(mesh), step=0)
    target = _tree(mesh)
    del target["params"]["b"]
    target["params"]["bias"] = NamedSharding(mesh, P())
    with pytest.raises(CheckpointError, match=r"in the target only: \[\"\['params'\]\['bias'\]\"\]"
                                              r"; in the checkpoint only: \[\"\['params'\]\['b'\]\"\]"):
        ckpt.restore(str(tmp_path), target)


def test_restore_with_another_shape_or_dtype(tmp_path):
    mesh = _meshes()["4x2"]
    ckpt.save(str(tmp_path), _tree(mesh), step=0)
    target = _tree(mesh)
    target["params"]["w"] = spmd.device_put(np.zeros((8, 4), np.float32),
                                            NamedSharding(mesh, P()))
    with pytest.raises(CheckpointError, match=r"\['params'\]\['w'\] was saved with shape \(8, 8\); "
                                              r"the target asks for \(8, 4\)"):
        ckpt.restore(str(tmp_path), target)
    target = _tree(mesh)
    target["params"]["b"] = np.zeros(8, np.float32)
    with pytest.raises(CheckpointError, match=r"\['params'\]\['b'\] was saved as int32; the "
                                              r"target asks for float32"):
        ckpt.restore(str(tmp_path), target)


def test_target_sharding_that_does_not_divide_the_saved_shape(tmp_path):
    mesh = _meshes()["4x2"]
    ckpt.save(str(tmp_path), {"v": np.arange(6, dtype=np.float32)}, step=0)
    with pytest.raises(CheckpointError, match=r"target sharding of the leaf at \['v'\] does not "
                                              r"fit its saved shape \(6,\)"):
        ckpt.restore(str(tmp_path), {"v": NamedSharding(mesh, P("data"))})


def test_missing_and_half_written_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="no complete checkpoint in .*no such directory"):
        ckpt.restore(str(tmp_path / "absent"), {})
    (tmp_path / ".tmp-step_4.abc").mkdir()
    (tmp_path / "step_7").mkdir()  # a step directory without its metadata
    assert ckpt.latest_step(str(tmp_path)) is None
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        ckpt.restore(str(tmp_path), {})
    with pytest.raises(CheckpointError, match="step_7 is not a complete checkpoint"):
        ckpt.restore(str(tmp_path), {}, step=7)
    with pytest.raises(CheckpointError, match="no checkpoint for step 3"):
        ckpt.restore(str(tmp_path), {}, step=3)


def test_bad_save_arguments(tmp_path):
    with pytest.raises(CheckpointError, match="step must be an integer >= 0, got -1"):
        ckpt.save(str(tmp_path), {}, step=-1)
    with pytest.raises(CheckpointError, match="keep must be an integer >= 1"):
        ckpt.save(str(tmp_path), {}, step=1, keep=0)
    with pytest.raises(CheckpointError, match=r"leaf at \['f'\] is a str"):
        ckpt.save(str(tmp_path), {"f": "text"}, step=1)
    ckpt.save(str(tmp_path), {"x": np.ones(2, np.float32)}, step=1)
    with pytest.raises(CheckpointError, match="step_1 already exists"):
        ckpt.save(str(tmp_path), {"x": np.ones(2, np.float32)}, step=1)
    assert not any(n.startswith(".tmp-") for n in os.listdir(tmp_path))


# ---------------------------------------------- across process counts (MPI)

_SAVE_4 = textwrap.dedent("""
    import numpy as np, spmd
    from spmd import P, NamedSharding, checkpointing as ckpt
    mesh = spmd.make_mesh((2, 2), ("data", "model"))
    W = np.arange(64, dtype=np.float32).reshape(8, 8)
    w = spmd.make_array_from_callback((8, 8), NamedSharding(mesh, P("data", "model")),
                                      lambda idx: W[idx])
    b = spmd.make_array_from_callback((8,), NamedSharding(mesh, P("model")),
                                      lambda idx: np.arange(8, dtype=np.int32)[idx])
    ckpt.save({d!r}, {{"w": w, "b": b}}, step=4)
    print("saved", spmd.process_index())
""")

_RESTORE_2 = textwrap.dedent("""
    import numpy as np, spmd
    from spmd import P, NamedSharding, checkpointing as ckpt
    mesh = spmd.make_mesh((1, 2), ("data", "model"))
    out = ckpt.restore({d!r}, {{"w": NamedSharding(mesh, P("data", "model")),
                               "b": NamedSharding(mesh, P())}})
    W = np.arange(64, dtype=np.float32).reshape(8, 8)
    for s in out["w"].addressable_shards:
        assert s.data.shape == (8, 4), s.data.shape
        np.testing.assert_array_equal(np.asarray(s.data), W[s.index])
    np.testing.assert_array_equal(spmd.process_allgather(out["b"]), np.arange(8))
    ckpt.save({d2!r}, out, step=5)
    print("restored", spmd.process_index())
""")

_KILLED = textwrap.dedent("""
    import os, signal, numpy as np, spmd
    from spmd import P, NamedSharding, checkpointing as ckpt
    mesh = spmd.make_mesh((4,), ("d",))
    x = spmd.make_array_from_callback((8,), NamedSharding(mesh, P("d")),
                                      lambda idx: np.arange(8, dtype=np.float32)[idx])
    ckpt.save({d!r}, {{"x": x}}, step=1)
    real = ckpt.layout.open_store
    def dying(path, meta=None):  # rank 2 dies while writing its blocks
        if meta is None and spmd.process_index() == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, meta)
    ckpt.layout.open_store = dying
    ckpt.save({d!r}, {{"x": x * 10}}, step=2)
""")


@pytest.mark.timeout(300)
def test_saved_on_4_ranks_restored_on_2_ranks_and_on_one_process(tmp_path):
    d, d2 = str(tmp_path / "four"), str(tmp_path / "two")
    status, out, _ = run_mpi(_SAVE_4.format(d=d), 4, tmp_path, timeout=120)
    assert status == 0, out[-4000:]
    status, out, _ = run_mpi(_RESTORE_2.format(d=d, d2=d2), 2, tmp_path, timeout=120)
    assert status == 0, out[-4000:]
    mesh = spmd.make_mesh((2, 2, 2), ("x", "y", "z"))
    for where, step in ((d, 4), (d2, 5)):
        back = ckpt.restore(where, {"w": NamedSharding(mesh, P("x", ("y", "z"))),
                                    "b": NamedSharding(mesh, P("z"))})
        assert ckpt.latest_step(where) == step
        np.testing.assert_array_equal(np.asarray(back["w"]), W)
        np.testing.assert_array_equal(np.asarray(back["b"]), B)
    meta = ckpt.saved_metadata(d)
    assert meta["leaves"][1]["mesh"] == {"axis_names": ["data", "model"], "shape": [2, 2]}


def test_a_failed_async_save_never_waited_on_fails_the_next_save(tmp_path, monkeypatch):
    real = ckpt.layout.open_store

    def failing(path, meta=None):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.layout, "open_store", failing)
    pending = ckpt.save_async(str(tmp_path), {"x": np.ones(2, np.float32)}, step=1)
    while not pending.done():  # let it fail (its wait() is never called)
        time.sleep(0.01)
    monkeypatch.setattr(ckpt.layout, "open_store", real)
    with pytest.raises(CheckpointError, match=r"asynchronous save of .*step_1 failed \(its "
                                              r"wait\(\) was never called\)"):
        ckpt.save(str(tmp_path), {"x": np.ones(2, np.float32)}, step=2)
    ckpt.save(str(tmp_path), {"x": np.ones(2, np.float32)}, step=2)  # reported once
    assert ckpt.all_steps(str(tmp_path)) == [2]


_ASYNC_4 = textwrap.dedent("""
    import numpy as np, spmd
    from spmd import P, NamedSharding, checkpointing as ckpt, lax, shard_map
    mesh = spmd.make_mesh((4,), ("d",))
    x = spmd.make_array_from_callback((8,), NamedSharding(mesh, P("d")),
                                      lambda idx: np.arange(8, dtype=np.float32)[idx])
    total = spmd.jit(shard_map(lambda b: lax.psum(b.sum(), "d"), mesh=mesh,
                               in_specs=P("d"), out_specs=P()))
    pending = ckpt.save_async({d!r}, {{"x": x}}, step=1)
    for _ in range(50):  # the program's collectives run while the save's travel
        assert float(total(x)) == 28.0
    pending2 = ckpt.save_async({d!r}, {{"x": x * 2}}, step=2)
    assert float(total(x * 3)) == 84.0
    assert pending2.wait().endswith("step_2") and pending.done()
    print("async ok", spmd.process_index())
""")


@pytest.mark.timeout(300)
def test_save_async_on_4_ranks_beside_the_programs_collectives(tmp_path):
    d = str(tmp_path / "ck")
    status, out, _ = run_mpi(_ASYNC_4.format(d=d), 4, tmp_path, timeout=120)
    assert status == 0, out[-4000:]
    assert out.count("async ok") == 4
    mesh = spmd.make_mesh((8,), ("d",))
    for step, scale in ((1, 1), (2, 2)):
        back = ckpt.restore(d, {"x": NamedSharding(mesh, P("d"))}, step=step)
        np.testing.assert_array_equal(np.asarray(back["x"]),
                                      scale * np.arange(8, dtype=np.float32))


@pytest.mark.timeout(300)
def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    d = str(tmp_path / "ck")
    status, out, _ = run_mpi(_KILLED.format(d=d), 4, tmp_path, timeout=120)
    assert status not in (0, None), out[-4000:]
    assert ckpt.latest_step(d) == 1
    mesh = spmd.make_mesh((8,), ("d",))
    back = ckpt.restore(d, {"x": NamedSharding(mesh, P("d"))})
    np.testing.assert_array_equal(np.asarray(back["x"]), np.arange(8, dtype=np.float32))


def test_restore_onto_the_shardings_of_a_live_tree(tmp_path):
    # The usual target: tree_map(lambda x: x.sharding, state), where unplaced values
    # (a step counter) have a SingleDeviceSharding and restore whole.
    mesh = _meshes()["2x4"]
    state = {"w": spmd.device_put(W, NamedSharding(mesh, P("a"))),
             "count": spmd.numpy.zeros((), np.int32) + 7}
    ckpt.save(str(tmp_path), state, step=1)
    target = spmd.tree_util.tree_map(lambda x: x.sharding, state)
    out = ckpt.restore(str(tmp_path), target)
    assert int(out["count"]) == 7 and out["w"].sharding == NamedSharding(mesh, P("a"))
    np.testing.assert_array_equal(np.asarray(out["w"]), W)


# ------------------------------------------- damaged checkpoints (lost chunks)

N = 1 << 20  # the array: 1M float32 elements in 4 blocks of 262,144


def _big(mesh, scale=1.0):
    x = (np.arange(N, dtype=np.float32) + 1) * scale  # no zeros: a zero block is a loss
    return spmd.device_put(x, NamedSharding(mesh, P("d")))


def _two_steps(tmp_path):
    """Steps 0 and 1 of {'params': {'w': <1M P('d') array on 4 devices>}}; the chunk
    files of step 1's leaf, by chunk key (c/0 .. c/3)."""
    mesh = spmd.make_mesh((4,), ("d",))
    ckpt.save(str(tmp_path), {"params": {"w": _big(mesh, 0.5)}}, step=0)
    ckpt.save(str(tmp_path), {"params": {"w": _big(mesh)}}, step=1)
    c = tmp_path / "step_1" / "leaf_00000" / "c"
    return mesh, {f"c/{n}": c / n for n in sorted(os.listdir(c))}


def _target(mesh, spec=P("d")):
    return {"params": {"w": NamedSharding(mesh, spec)}}


# The error names the step, the leaf's pytree path, the block and the fix.
_BLOCK_2 = (r"step 1 in .* the leaf at \['params'\]\['w'\], block \[524288:786432\] "
            r"\(chunk c/2 of leaf_00000\)")
_FIX = r"restore\(\.\.\., step=0\)"


def test_a_missing_chunk_is_an_error_not_zeros(tmp_path):
    mesh, chunks = _two_steps(tmp_path)
    assert sorted(chunks) == ["c/0", "c/1", "c/2", "c/3"]
    os.remove(chunks["c/2"])
    with pytest.raises(CheckpointError, match=_BLOCK_2 + r", is missing.*" + _FIX):
        ckpt.restore(str(tmp_path), _target(mesh), step=1)
    # Onto another mesh and replicated (every device reads every chunk): the same error.
    with pytest.raises(CheckpointError, match=_BLOCK_2 + r", is missing"):
        ckpt.restore(str(tmp_path), _target(spmd.make_mesh((8,), ("d",)), P()), step=1)
    # The intact step still restores.
    out = ckpt.restore(str(tmp_path), _target(mesh), step=0)
    np.testing.assert_array_equal(np.asarray(out["params"]["w"]),
                                  (np.arange(N, dtype=np.float32) + 1) * 0.5)


def test_a_truncated_chunk_is_a_checkpoint_error(tmp_path):
    mesh, chunks = _two_steps(tmp_path)
    data = chunks["c/2"].read_bytes()
    chunks["c/2"].write_bytes(data[:1000])
    with pytest.raises(CheckpointError, match=_BLOCK_2 + r", has 1000 bytes where the save "
                                              r"wrote \d+ \(truncated.*" + _FIX):
        ckpt.restore(str(tmp_path), _target(mesh), step=1)


def test_an_altered_chunk_is_a_checkpoint_error(tmp_path):
    mesh, chunks = _two_steps(tmp_path)
    data = bytearray(chunks["c/2"].read_bytes())
    data[4096] ^= 0x10  # one bit of one element, same size
    chunks["c/2"].write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=_BLOCK_2 + r", fails its checksum.*" + _FIX):
        ckpt.restore(str(tmp_path), _target(mesh), step=1)


def test_a_chunk_replaced_by_another_valid_chunk_is_a_checkpoint_error(tmp_path):
    # Intact on its own (its checksum fits its bytes) but not what this save wrote: a
    # sync that mixed two runs.  Only the manifest's checksum tells.
    mesh, chunks = _two_steps(tmp_path)
    chunks["c/2"].write_bytes(chunks["c/1"].read_bytes())
    with pytest.raises(CheckpointError, match=_BLOCK_2 + r", holds other data than the save "
                                              r"wrote.*" + _FIX):
        ckpt.restore(str(tmp_path), _target(mesh), step=1)


def test_a_lost_chunk_of_zeros_is_caught_too(tmp_path):
    # Chunks equal to zarr's fill value are written too, so a lost one is noticed.
    mesh = spmd.make_mesh((4,), ("d",))
    ckpt.save(str(tmp_path), {"z": spmd.device_put(np.zeros(16, np.float32),
                                                   NamedSharding(mesh, P("d")))}, step=3)
    c = tmp_path / "step_3" / "leaf_00000" / "c"
    assert sorted(os.listdir(c)) == ["0", "1", "2", "3"]
    os.remove(c / "1")
    with pytest.raises(CheckpointError, match=r"step 3 .*\['z'\], block \[4:8\] \(chunk c/1 of "
                                              r"leaf_00000\), is missing.*no other complete"):
        ckpt.restore(str(tmp_path), {"z": NamedSharding(mesh, P("d"))}, step=3)


def test_a_missing_chunk_of_an_unplaced_leaf_and_of_a_2d_leaf(tmp_path):
    mesh = _meshes()["4x2"]
    ckpt.save(str(tmp_path), _tree(mesh), step=2)
    os.remove(tmp_path / "step_2" / "leaf_00003" / "c")  # the 0-d 'step_scale'
    os.remove(tmp_path / "step_2" / "leaf_00002" / "c" / "3" / "1")  # ['params']['w']
    target = _tree(mesh)
    with pytest.raises(CheckpointError, match=r"\['params'\]\['w'\], block \[6:8, 4:8\] "
                                              r"\(chunk c/3/1 of leaf_00002\), is missing"):
        ckpt.restore(str(tmp_path), target, step=2)
    del target["params"]["w"]  # (restore needs the whole structure: read it unsharded)
    target["params"]["w"] = np.zeros((8, 8), np.float32)
    with pytest.raises(CheckpointError, match=r"\['params'\]\['w'\], block \[6:8, 4:8\]"):
        ckpt.restore(str(tmp_path), target, step=2)
    (tmp_path / "step_2" / "leaf_00002" / "c" / "3" / "1").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"\['params'\]\['w'\], block \[6:8, 4:8\] "
                                              r"\(chunk c/3/1 of leaf_00002\), has 0 bytes"):
        ckpt.restore(str(tmp_path), _tree(mesh), step=2)


def test_a_missing_manifest_is_an_error_naming_the_process(tmp_path):
    mesh, chunks = _two_steps(tmp_path)
    os.remove(tmp_path / "step_1" / "spmd_manifest.0.json")
    with pytest.raises(CheckpointError, match=r"step 1 in .*the manifest of process 0 "
                                              r"\(spmd_manifest\.0\.json\) is missing.*" + _FIX):
        ckpt.restore(str(tmp_path), _target(mesh), step=1)


def test_latest_step_skips_an_incomplete_step_and_says_so_once(tmp_path):
    mesh, chunks = _two_steps(tmp_path)
    assert ckpt.latest_step(str(tmp_path)) == 1
    os.remove(chunks["c/3"])
    with pytest.warns(UserWarning, match=r"latest_step: skipping step 1 in .*: its chunk "
                                         r"leaf_00000/c/3 \(of the leaf at \['params'\]\['w'\]"
                                         r"\) is missing"):
        assert ckpt.latest_step(str(tmp_path)) == 0
    import warnings as w
    with w.catch_warnings():
        w.simplefilter("error")  # said once per step directory
        assert ckpt.latest_step(str(tmp_path)) == 0
        out = ckpt.restore(str(tmp_path), _target(mesh))  # the latest complete one
    np.testing.assert_array_equal(np.asarray(out["params"]["w"]),
                                  (np.arange(N, dtype=np.float32) + 1) * 0.5)
    assert ckpt.all_steps(str(tmp_path)) == [0, 1]  # committed, complete or not


def test_latest_step_skips_a_truncated_chunk_and_a_missing_manifest(tmp_path):
    mesh, chunks = _two_steps(tmp_path)
    chunks["c/0"].write_bytes(chunks["c/0"].read_bytes()[:-1])
    with pytest.warns(UserWarning, match=r"skipping step 1 .*leaf_00000/c/0 .* has \d+ bytes "
                                         r"where the save wrote \d+"):
        assert ckpt.latest_step(str(tmp_path)) == 0
    os.remove(tmp_path / "step_0" / "spmd_manifest.0.json")
    with pytest.warns(UserWarning, match=r"skipping step 0 .*the manifest of process 0"):
        assert ckpt.latest_step(str(tmp_path)) is None
    with pytest.raises(CheckpointError, match=r"no complete checkpoint in .*step 1: .*c/0"):
        ckpt.restore(str(tmp_path), _target(mesh))


def _save_old_format(directory, mesh):
    """A checkpoint as the code before chunk manifests wrote it (format 1: no
    checksum codec, no manifests, chunks equal to the fill value not stored)."""
    import json
    import tensorstore as ts
    x = np.arange(16, dtype=np.float32)
    x[4:8] = 0  # a block of zeros: not stored
    path = os.path.join(directory, "step_5")
    ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path + "/leaf_00000"},
             "metadata": {"shape": [16], "data_type": "float32",
                          "chunk_grid": {"name": "regular",
                                         "configuration": {"chunk_shape": [4]}}}},
            create=True).result()[...].write(x).result()
    with open(os.path.join(path, "spmd_checkpoint.json"), "w") as f:
        json.dump({"format": 1, "step": 5, "treedef": "PyTreeDef({'x': *})",
                   "leaves": [{"path": "['x']", "file": "leaf_00000", "shape": [16],
                               "dtype": "float32", "mesh": {"axis_names": ["d"], "shape": [4]},
                               "spec": ["d"]}]}, f)
    return x


def test_checkpoints_without_a_manifest_still_restore_with_one_warning(tmp_path):
    mesh = spmd.make_mesh((4,), ("d",))
    x = _save_old_format(str(tmp_path), mesh)
    assert sorted(os.listdir(tmp_path / "step_5" / "leaf_00000" / "c")) == ["0", "2", "3"]
    assert ckpt.latest_step(str(tmp_path)) == 5
    with pytest.warns(UserWarning, match=r"step 5 in .* was saved without chunk manifests "
                                         r"\(format 1\): a lost chunk would read as zeros"):
        out = ckpt.restore(str(tmp_path), {"x": NamedSharding(mesh, P("d"))})
    np.testing.assert_array_equal(np.asarray(out["x"]), x)
    import warnings as w
    with w.catch_warnings():
        w.simplefilter("error")
        out = ckpt.restore(str(tmp_path), {"x": NamedSharding(mesh, P())})
    np.testing.assert_array_equal(np.asarray(out["x"]), x)
    # A truncated chunk of an old checkpoint is still a CheckpointError naming the leaf.
    c0 = tmp_path / "step_5" / "leaf_00000" / "c" / "0"
    c0.write_bytes(c0.read_bytes()[:5])
    with pytest.raises(CheckpointError, match=r"step 5 .*the leaf at \['x'\], block \[0:4\] "
                                              r"\(chunk c/0 of leaf_00000\), could not be "
                                              r"read by tensorstore"):
        ckpt.restore(str(tmp_path), {"x": NamedSharding(mesh, P("d"))})


def test_the_manifest_lists_each_chunk_once_with_size_and_checksum(tmp_path):
    import json
    mesh, chunks = _two_steps(tmp_path)
    with open(tmp_path / "step_1" / "spmd_manifest.0.json") as f:
        man = json.load(f)
    assert man["process"] == 0 and sorted(man["chunks"]) == [
        f"leaf_00000/c/{i}" for i in range(4)]
    for key, (size, digest) in man["chunks"].items():
        assert size == os.path.getsize(chunks[key[len("leaf_00000/"):]]) == 4 * N // 4 + 4
        assert len(digest) == 8
    assert ckpt.saved_metadata(str(tmp_path))["writers"] == 1


def test_a_lost_array_description_or_metadata_is_a_checkpoint_error(tmp_path):
    mesh, chunks = _two_steps(tmp_path)
    os.remove(tmp_path / "step_1" / "leaf_00000" / "zarr.json")
    with pytest.raises(CheckpointError, match=r"step 1 in .* is damaged: the array of the leaf "
                                              r"at \['params'\]\['w'\] \(leaf_00000\) does not "
                                              r"open.*" + _FIX):
        ckpt.restore(str(tmp_path), _target(mesh), step=1)
    with pytest.warns(UserWarning, match=r"skipping step 1 .*leaf_00000/zarr\.json\) is missing"):
        assert ckpt.latest_step(str(tmp_path)) == 0
    (tmp_path / "step_0" / "spmd_checkpoint.json").write_text('{"format": 2, "ste')
    with pytest.raises(CheckpointError, match=r"the metadata .*step_0/spmd_checkpoint\.json is "
                                              r"unreadable \(JSONDecodeError"):
        ckpt.restore(str(tmp_path), _target(mesh), step=0)
    with pytest.warns(UserWarning, match=r"skipping step 0 .*unreadable"):
        assert ckpt.latest_step(str(tmp_path)) is None


def test_saving_a_step_again_replaces_it_only_when_damaged(tmp_path):
    # A run resumed from step 0 (latest_step skipped the damaged step 1) saves step 1
    # again; a complete step 1 is never overwritten.
    mesh, chunks = _two_steps(tmp_path)
    with pytest.raises(CheckpointError, match="step_1 already exists"):
        ckpt.save(str(tmp_path), {"params": {"w": _big(mesh, 2.0)}}, step=1)
    os.remove(chunks["c/1"])
    with pytest.warns(UserWarning, match=r"save: .*step_1 exists but is damaged \(its chunk "
                                         r"leaf_00000/c/1 .* is missing.*this save replaces it"):
        ckpt.save(str(tmp_path), {"params": {"w": _big(mesh, 2.0)}}, step=1)
    assert ckpt.latest_step(str(tmp_path)) == 1 and sorted(os.listdir(tmp_path)) == [
        "step_0", "step_1"]
    out = ckpt.restore(str(tmp_path), _target(mesh))
    np.testing.assert_array_equal(np.asarray(out["params"]["w"]),
                                  (np.arange(N, dtype=np.float32) + 1) * 2.0)
