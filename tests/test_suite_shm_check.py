"""tests/conftest.py ends the suite by checking /dev/shm: a file that the session made
(a name the suite's jobs make), that is still there and that no live process uses,
fails the session, named.  Checked here on an inner session that loads the conftest
as a plugin and runs one test that leaves such a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")

LEAVES = '''
import os

def test_leaves_a_file():
    with open(os.environ["LEAVE_AT"], "wb") as f:
        f.write(b"x" * 100)

def test_leaves_nothing():
    pass
'''


def _inner(tmp_path, test: str, leave_at: str):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text(LEAVES)
    env = {**os.environ, "LEAVE_AT": leave_at}
    env.pop("SPMD_TEST_SHM_CHECK", None)
    env.pop("SPMD_REQUIRE_MPI_TESTS", None)  # `make test` sets it; no MPI test here
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
         f"{tmp_path / 'test_user.py'}::{test}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_file_left_in_dev_shm_fails_the_session_and_is_named(tmp_path):
    path = f"/dev/shm/spmd-test-left-{os.getpid()}"
    try:
        done = _inner(tmp_path, "test_leaves_a_file", path)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "1 passed" in done.stdout
        assert "files left in /dev/shm" in done.stdout
        assert f"  {path} (100 bytes)" in done.stdout
        clean = _inner(tmp_path, "test_leaves_nothing", path)  # the file is old now
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "files left in /dev/shm" not in clean.stdout
    finally:
        if os.path.exists(path):
            os.unlink(path)
