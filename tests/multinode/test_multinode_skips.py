"""Where emulated nodes cannot be made, the multi-node tests skip and say why.

Here (as root, where they can be made) an inner pytest run of a multi-node test
is started the two ways a developer's machine differs: as a user other than root
(a user namespace that maps this user to ``nobody``), and as root without the
capabilities that make namespaces (``setpriv`` empties the bounding set, as in an
unprivileged container).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.mpi import REPO_ROOT
from tests.multinode.conftest import job_env

pytestmark = pytest.mark.timeout(120)

WAYS = {
    "not-root": (["unshare", "--user", "--map-user=65534", "--map-group=65534"],
                 "emulated nodes need root to make UTS, mount and IPC namespaces"),
    "no-capabilities": (["setpriv", "--bounding-set=-all", "--inh-caps=-all"],
                        "`unshare` cannot make a node's namespaces here"),
}


@pytest.mark.parametrize("way", WAYS)
def test_multinode_tests_skip_with_the_reason(way):
    prefix, reason = WAYS[way]
    if shutil.which(prefix[0]) is None:
        pytest.skip(f"util-linux's {prefix[0]} is not installed")
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:  # e.g. user namespaces disabled (user.max_user_namespaces=0)
        pytest.skip(f"`{' '.join(prefix)}` does not run here: {probe.stderr.strip()[-300:]}")
    # The inner run holds no multi-process test and makes no file in /dev/shm: the
    # suite's own checks of those (`make test` sets the first) are not for it.
    env = job_env({"SPMD_TEST_SHM_CHECK": "0"})
    env.pop("SPMD_REQUIRE_MPI_TESTS", None)
    out = subprocess.run([*prefix, sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                          "no:cacheprovider", "tests/multinode/test_emulated_nodes.py"],
                         env=env, capture_output=True, text=True, timeout=100,
                         cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 skipped" in out.stdout and "passed" not in out.stdout, out.stdout[-3000:]
    assert f"SKIPPED [1] tests/multinode/test_emulated_nodes.py: {reason}" in out.stdout, \
        out.stdout[-3000:]
