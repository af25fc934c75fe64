import os
import stat
import time

# Simulated devices of a single process; set before anything imports spmd.
os.environ.setdefault("SPMD_NUM_DEVICES", "8")

from hypothesis import settings  # noqa: E402

# `ci` (the default) is derandomized, so every MPI rank draws the same examples;
# `dev` explores at random: HYPOTHESIS_PROFILE=dev (single-process runs only).
settings.register_profile("ci", deadline=None, max_examples=25, derandomize=True)
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


import pytest  # noqa: E402


@pytest.fixture
def x64():
    """64-bit types on (``enable_x64``) for one test, restored after it."""
    import spmd

    old = spmd.config.enable_x64
    spmd.config.update("enable_x64", True)
    yield
    spmd.config.update("enable_x64", old)


# ------------------------------------------------------- multi-process tests
#
# The tests marked @pytest.mark.mpi (tests/mpi) run on MPI ranks.  In a plain pytest
# run each becomes an spmd.testing test (@pytest.mark.spmd, docs/testing.md): it runs
# on SPMD_TEST_MPI_NP ranks (4) of a pool of rank workers, with the environment below,
# and its pytest-timeout limit (the module's timeout marker) is its limit there.  Under
# an outer `mpiexec -n 4 python -m pytest --with-mpi` (`make test-mpi`) they run in
# place on that job's ranks, as pytest-mpi runs them.

MPI_NP = int(os.environ.get("SPMD_TEST_MPI_NP", "4"))
MPI_ENV = {
    # Ranks share the machine's cores: one BLAS thread each, or their thread pools
    # and MPI's busy polling oversubscribe the CPU (10x slower seen with 4 ranks on 2).
    "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    # Every collective is compared across the ranks before its data moves
    # (docs/launching.md, "The checking mode"): ranks out of step fail at once.
    "SPMD_CHECK_COLLECTIVES": "1",
    "SPMD_TEST_MPI_NP": str(MPI_NP),
}
MPI_TIMEOUT = 300.0  # seconds, for a test without a timeout marker


def pytest_collection_modifyitems(config, items):
    from spmd.launch.runtime import launched_by_mpi

    if launched_by_mpi():  # ranks of an outer mpiexec, or of a pool: in place
        return
    found = False
    for item in items:
        if item.get_closest_marker("mpi") is None:
            continue
        found = True
        marker = item.get_closest_marker("spmd")
        kwargs = dict(marker.kwargs) if marker is not None else {}
        limit = item.get_closest_marker("timeout")
        kwargs.setdefault("processes", MPI_NP)
        kwargs.setdefault("timeout", float(limit.args[0]) if limit and limit.args
                          else MPI_TIMEOUT)
        kwargs["env"] = {**MPI_ENV, **kwargs.get("env", {})}
        item.add_marker(pytest.mark.spmd(**kwargs), append=False)
    if os.environ.get("SPMD_REQUIRE_MPI_TESTS") == "1" and not found:
        raise pytest.UsageError("SPMD_REQUIRE_MPI_TESTS=1 and no multi-process test "
                                "(@pytest.mark.mpi) was collected: the MPI suite vanished")


# ------------------------------------------------------------ /dev/shm at the end
#
# The suite leaves nothing in /dev/shm (RAM): at its end, a file that was not there
# when it started, has a name the suite's jobs make, and that no live process maps or
# has open, fails the session, named.  Checked in the process that runs the suite,
# after the plugin has stopped its pools of ranks (they are jobs that make such files);
# not in MPI ranks (their job's segment is theirs until MPI_Finalize, after pytest).
# Another job on the machine that leaves files meanwhile is blamed too: set
# SPMD_TEST_SHM_CHECK=0 there.

SHM_DIR = "/dev/shm"
# MPICH's segment of a node and its shared windows' files, UCX's (MPICH's transport
# may use it), and the tests' own files.
SHM_NAMES = ("mpich_shm_", "mpich_shar_tmp", "mpich_vci_", "ucx_shm_", "spmd")
_shm_at_start: dict = {}


def _shm_files() -> dict:
    """Path -> (device, inode) of the regular files in /dev/shm with the suite's names.
    Plain ``os``: at the session's start nothing of spmd may be imported yet (imported
    before numpy, spmd sets OpenBLAS's thread settings for the whole session)."""
    out = {}
    try:
        with os.scandir(SHM_DIR) as entries:
            for entry in entries:
                if not entry.name.startswith(SHM_NAMES):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[entry.path] = (st.st_dev, st.st_ino)
    except OSError:
        pass
    return out


def shm_left(before: dict, settle: float = 2.0) -> list:
    """The files with the suite's names in /dev/shm that were not in ``before`` (path ->
    key, :func:`_shm_files`) and that no live process uses; a job still ending gets
    ``settle`` seconds to remove its own."""
    from spmd.launch.cleanup import in_use

    deadline = time.monotonic() + settle
    while True:
        new = {p: k for p, k in _shm_files().items() if before.get(p) != k}
        used = in_use(new.values(), SHM_DIR) if new else set()
        left = sorted(p for p, k in new.items() if k not in used)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def pytest_sessionstart(session):
    if os.environ.get("SPMD_TEST_SHM_CHECK", "1") != "0" and os.path.isdir(SHM_DIR) \
            and not os.environ.get("SPMD_TESTING_WORKER"):
        _shm_at_start["files"] = _shm_files()


@pytest.hookimpl(trylast=True)  # after _spmd_pytest_plugin's, which stops the pools
def pytest_sessionfinish(session, exitstatus):
    before = _shm_at_start.pop("files", None)
    if before is None:
        return
    from spmd.launch.runtime import launched_by_mpi

    if launched_by_mpi():  # a rank: its job's segment is its own until MPI_Finalize
        return
    left = shm_left(before)
    if not left:
        return
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} file(s) the suite made are left in {SHM_DIR} (no live process "
             "uses them):"]
    for path in left:
        try:
            size = f"{os.path.getsize(path)} bytes"
        except OSError:
            size = "gone since"
        lines.append(f"  {path} ({size})")
    lines.append("A job of the suite ended without removing its shared memory; find the "
                 "test that made them, and make it clean up (docs/testing.md). Another job "
                 "on this machine may have left them: SPMD_TEST_SHM_CHECK=0 skips this check.")
    if report is not None:
        report.write_line("")
        report.write_sep("=", f"files left in {SHM_DIR}", red=True)
        for line in lines:
            report.write_line(line)
    else:
        print("\n".join(lines))
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
