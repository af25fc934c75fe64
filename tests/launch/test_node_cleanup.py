"""One node's cleanup pass (``python -m spmd.launch.cleanup LAUNCH_DIR``, which
``spmd-run`` starts on every host of a job across hosts): it removes the segments
the job's ranks on this node recorded, and keeps what was there before the job, what
a live process maps, and what other hosts' ranks recorded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest

from spmd.launch import cleanup, memory_tier
from tests.mpi import REPO_ROOT

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm") or not sys.platform.startswith(
    "linux"), reason="needs Linux's /dev/shm")


def _segment(tag: str) -> tuple[str, list[int]]:
    path = f"/dev/shm/spmd-test-node-cleanup-{tag}-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as f:
        f.write(b"x" * 64)
    st = os.stat(path)
    return path, [st.st_dev, st.st_ino]


def _record(launch_dir, rank: int, host: str, before: dict, files: dict) -> None:
    # A rank that has ended (pid 0 is never a live rank of the job).
    (launch_dir / f"rank{rank}.pid").write_text(json.dumps({"pid": 0, "host": host,
                                                            "shm": before}))
    (launch_dir / f"rank{rank}.shm").write_text(json.dumps({"rank": rank, "host": host,
                                                            "files": files}))


def test_the_pass_removes_only_this_nodes_leftovers(tmp_path):
    host = socket.gethostname()
    made = [_segment(t) for t in ("left", "before", "held", "elsewhere", "seen-by-one")]
    (left, kl), (before, kb), (held, kh), (elsewhere, ke), (one, ko) = made
    keeper = open(held, "rb")  # a live process (this one) has it open
    try:
        # Rank 0 started first, before "seen-by-one" was made by the job (rank 1 saw it).
        _record(tmp_path, 0, host, {before: kb}, {left: kl, before: kb, held: kh, one: ko})
        _record(tmp_path, 1, host, {before: kb, one: ko}, {left: kl})
        _record(tmp_path, 2, "another-host", {}, {elsewhere: ke})
        out = subprocess.run([sys.executable, "-m", "spmd.launch.cleanup", str(tmp_path)],
                             capture_output=True, text=True, timeout=60,
                             cwd=str(REPO_ROOT))
        assert out.returncode == 0, out.stderr
        assert sorted(out.stdout.splitlines()) == sorted(
            f"{host}: removed the job's leftover {p}" for p in (left, one))
        assert [os.path.exists(p) for p, _ in made] == [False, True, True, True, False]
    finally:
        keeper.close()
        for path, _ in made:
            if os.path.exists(path):
                os.unlink(path)


def test_the_pass_needs_a_launch_directory(tmp_path):
    out = subprocess.run([sys.executable, "-m", "spmd.launch.cleanup", str(tmp_path / "no")],
                         capture_output=True, text=True, timeout=60,
                             cwd=str(REPO_ROOT))
    assert out.returncode == 2
    assert "usage: python -m spmd.launch.cleanup LAUNCH_DIR | --memory-tier JOB (got [" in out.stderr
    assert "give the launch directory of a job that has ended" in out.stderr
    assert cleanup.clean_node(str(tmp_path)) == []  # no records: nothing to do


def test_the_pass_removes_a_jobs_memory_tier():
    job = "cleanup-test-" + str(os.getpid())
    where = memory_tier.job_dir(job)
    os.makedirs(os.path.join(where, "k", "step_1.a0"))
    out = subprocess.run([sys.executable, "-m", "spmd.launch.cleanup", "--memory-tier", job],
                         capture_output=True, text=True, timeout=60, cwd=str(REPO_ROOT))
    assert out.returncode == 0, out.stderr
    assert f"removed the job's in-memory checkpoints {where}" in out.stdout
    assert not os.path.exists(where)
    bad = subprocess.run([sys.executable, "-m", "spmd.launch.cleanup", "--memory-tier", "a/b"],
                         capture_output=True, text=True, timeout=60, cwd=str(REPO_ROOT))
    assert bad.returncode == 2
    assert "SPMD_JOB_ID='a/b' cannot name a directory" in bad.stderr
