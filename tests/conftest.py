import os

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
