"""The multi-process tests' hooks.

- pytest-mpi skips every test with the keyword ``mpi`` unless run ``--with-mpi``, and
  a test's keywords include the names of its directories: here, ``mpi``.  The tests
  of this directory that are not marked ``@pytest.mark.mpi`` (they launch their own
  MPI jobs) belong to the single-process suite, so that skip is undone for them.
- In a plain pytest run (tests/conftest.py turns each ``mpi`` test into an
  ``spmd.testing`` test on 4 ranks), the collective, array and shared-memory tests
  run a second time with the ranks on two simulated nodes (``SPMD_SIMULATE_NODES=2``,
  docs/launching.md): the multi-node branches (no window across nodes, node-local
  numbering) must give the same results.  Under an outer mpiexec they run once, in
  whatever environment that job has.  The simulated nodes stay beside the emulated
  ones of ``tests/multinode``: they need no root, so the multi-node branches are
  tested on every machine, and they cover the shared-memory and point-to-point
  modules, which the emulated nodes do not run (docs/testing.md, "Multi-node tests").
"""

import os

import pytest

_REASON = "need --with-mpi option to run"

TWO_NODE_MODULES = {"test_mpi_collectives.py", "test_mpi_arrays.py", "test_mpi_shm.py",
                    "test_mpi_p2p.py"}
# The 12 s stress test of the shared window: no window spans two nodes, once is enough.
ONE_NODE_ONLY = {"test_mixed_blocking_and_started_calls_are_exact_under_skew"}


def _pooled() -> bool:
    """A plain run, or a rank of its pool: where the node variants exist."""
    from spmd.launch.runtime import launched_by_mpi

    return bool(os.environ.get("SPMD_TESTING_WORKER")) or not launched_by_mpi()


@pytest.fixture(autouse=True)
def simulated_nodes(request):
    """The simulated node count of this run of a test (its ranks' SPMD_SIMULATE_NODES)."""
    return getattr(request, "param", None)


def pytest_generate_tests(metafunc):
    definition = metafunc.definition
    if (definition.path.name not in TWO_NODE_MODULES
            or metafunc.function.__name__ in ONE_NODE_ONLY
            or definition.get_closest_marker("mpi") is None or not _pooled()):
        return
    two = pytest.mark.spmd(env={"SPMD_SIMULATE_NODES": "2"})
    metafunc.parametrize("simulated_nodes", [pytest.param(1, id="1node"),
                                             pytest.param(2, id="2nodes", marks=two)],
                         indirect=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("mpi") is None:
            item.own_markers[:] = [m for m in item.own_markers
                                   if not (m.name == "skip" and m.kwargs.get("reason") == _REASON)]
