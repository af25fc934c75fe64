"""A pool of rank workers (spmd.testing.pool) replaced after a hang leaves nothing in
/dev/shm: its hung ranks cannot end the job themselves (MPI_Finalize would remove
MPICH's segment of the node), so the pool has the launcher end it, or, when the
launcher does not end either, kills it and the ranks and removes what they mapped."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pytestmark = [
    pytest.mark.skipif(shutil.which("mpiexec") is None and not os.path.exists(MPIEXEC),
                       reason="needs MPI (mpi4py and the mpich wheel: pip install spmd[mpi])"),
    pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.isdir("/dev/shm"),
                       reason="needs Linux's /dev/shm"),
]

USER_TESTS = '''
import time
import numpy as np
import pytest
import spmd
from spmd import lax, P


def _psum():
    mesh = spmd.make_mesh((2,), ("i",))
    f = spmd.jit(spmd.shard_map(lambda x: lax.psum(x, "i"), mesh=mesh, in_specs=P("i"),
                                out_specs=P()))
    x = spmd.make_array_from_process_local_data(
        spmd.NamedSharding(mesh, P("i")), np.ones(8192, np.float32))
    return f(x)


def test_passes():
    _psum()


def test_rank_one_sleeps():
    _psum()
    if spmd.process_index() == 1:
        time.sleep(60)
    _psum()
'''


def _same_file(path: str, key) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == tuple(key)


@pytest.mark.parametrize("launcher", ["ends the job", "is killed"])
def test_a_pool_replaced_after_a_hang_leaves_no_file_in_dev_shm(tmp_path, monkeypatch,
                                                                 launcher):
    from spmd.launch.cleanup import mapped_files
    from spmd.testing import pool as pool_module

    if launcher == "is killed":  # as if spmd-run did not end on SIGTERM
        monkeypatch.setattr(pool_module, "TERM_WAIT", 0.0)
    (tmp_path / "test_user.py").write_text(USER_TESTS)

    def job(name):
        return {"file": str(tmp_path / "test_user.py"), "nodeid": f"test_user.py::{name}",
                "rootdir": str(tmp_path), "invocation_dir": str(tmp_path), "inifile": None}

    pools = pool_module.Pools()
    try:
        assert all(r.state == "passed" for r in pools.run(2, 1, job("test_passes"), 120).ranks)
        (pool,) = pools.pools.values()
        files = {}
        for pid in pool.pids.values():
            files.update(mapped_files(pid))
        # MPICH's segment of the node, at least (spmd's windows are unlinked once mapped).
        assert any(os.path.basename(p).startswith("mpich_shm_") for p in files), files
        outcome = pools.run(2, 1, job("test_rank_one_sleeps"), 3)
        assert [r.state for r in outcome.ranks] == ["hung", "hung"]
        assert not pools.pools  # replaced: the next test would get a fresh one
        assert not [p for p, key in files.items() if _same_file(p, key)]
        assert not any(pool_module._is_worker(pid) for pid in pool.pids.values())
    finally:
        pools.stop()
