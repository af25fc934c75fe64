"""Checkpoint paths that are not directories (issue 58): saving into a path that is a
file, or under one, says so before any work (it said "creating the arrays failed on
process(es) [0]"), and ``latest_step``/``all_steps``/``restore`` on a file raise
naming it instead of reading it as "no checkpoint yet" (a missing directory still has
none).  On one process and on 2 MPI ranks."""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P
from spmd import checkpointing as ckpt
from spmd.checkpointing import CheckpointError
from spmd.checkpointing.layout import create_directory
from tests.mpi import run_mpi

TREE = {"x": np.arange(4, dtype=np.float32)}
TARGET = NamedSharding(spmd.make_mesh((2,), ("d",)), P("d"))
FIX = "give a directory path (it is created if missing)"


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("not a checkpoint directory\n")
    return str(path)


def test_saving_into_a_file_says_so_and_leaves_it_alone(a_file):
    for save in (ckpt.save, ckpt.save_async):  # save_async checks before it returns
        with pytest.raises(CheckpointError) as info:
            save(a_file, TREE, step=1)
        assert str(info.value) == f"save: directory {a_file!r} is a file; {FIX}"
    with open(a_file) as f:
        assert f.read() == "not a checkpoint directory\n"
    assert sorted(os.listdir(os.path.dirname(a_file))) == ["train.log"]


def test_saving_under_a_file_names_the_file(a_file):
    inside = os.path.join(a_file, "ckpt", "run1")
    with pytest.raises(CheckpointError) as info:
        ckpt.save(inside, TREE, step=1)
    assert str(info.value) == (f"save: directory {inside!r} cannot be created: {a_file!r} "
                               f"is a file; {FIX}")


def test_saving_into_a_missing_directory_creates_it(tmp_path):
    where = str(tmp_path / "a" / "b" / "ckpt")
    assert ckpt.save(where, TREE, step=3) == os.path.join(where, "step_3")
    assert ckpt.latest_step(where) == 3
    back = ckpt.restore(where, {"x": TARGET})
    np.testing.assert_array_equal(np.asarray(back["x"]), TREE["x"])


def test_latest_step_all_steps_and_restore_on_a_file_raise_naming_it(a_file):
    want = (f"{a_file!r} is a file, not a directory of checkpoints; give the directory "
            "that save wrote them into (save creates it)")
    for call in (ckpt.latest_step, ckpt.all_steps,
                 lambda d: ckpt.restore(d, {"x": TARGET}),
                 lambda d: ckpt.restore(d, {"x": TARGET}, step=1)):
        with pytest.raises(CheckpointError) as info:
            call(a_file)
        assert str(info.value) == want


def test_a_missing_directory_has_no_steps(tmp_path):
    missing = str(tmp_path / "not-yet")
    assert ckpt.latest_step(missing) is None and ckpt.all_steps(missing) == []
    assert not os.path.exists(missing)  # reading never creates it


def test_create_directory_answers_without_raising(tmp_path, a_file):
    assert create_directory(str(tmp_path / "new")) is None and (tmp_path / "new").is_dir()
    assert create_directory(str(tmp_path)) is None  # there already
    assert create_directory(a_file) == f"directory {a_file!r} is a file; {FIX}"


_TWO_RANKS = textwrap.dedent("""
    import numpy as np
    import spmd
    from spmd import checkpointing as ckpt
    from spmd.checkpointing import CheckpointError

    me = spmd.process_index()
    for what, call in (("save", lambda: ckpt.save({f!r}, {{"x": np.ones(2, np.float32)}},
                                                  step=1)),
                       ("latest_step", lambda: ckpt.latest_step({f!r}))):
        try:
            call()
        except CheckpointError as e:
            print(f"rank {{me}} {{what}}: {{e}}", flush=True)
        else:
            raise SystemExit(f"rank {{me}}: {{what}} did not raise")
    # The ranks are still in step: a save into a directory works.
    ckpt.save({d!r}, {{"x": np.ones(2, np.float32)}}, step=2)
    assert ckpt.latest_step({d!r}) == 2
    print(f"rank {{me}} done", flush=True)
""")


@pytest.mark.timeout(300)
def test_on_two_ranks_every_rank_raises_and_stays_in_step(tmp_path, a_file):
    d = str(tmp_path / "ck")
    status, out, _ = run_mpi(_TWO_RANKS.format(f=a_file, d=d), 2, tmp_path, timeout=120)
    assert status == 0, out[-4000:]
    for r in (0, 1):
        assert f"rank {r} save: save: directory {a_file!r} is a file; {FIX}" in out, out
        assert f"rank {r} latest_step: {a_file!r} is a file" in out, out
        assert f"rank {r} done" in out, out
