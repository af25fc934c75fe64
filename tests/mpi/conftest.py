"""pytest-mpi skips every test with the keyword ``mpi`` unless run ``--with-mpi``,
and a test's keywords include the names of its directories: here, ``mpi``.  The
tests of this directory that are not marked ``@pytest.mark.mpi`` (they launch
their own MPI jobs) belong to the single-process suite, so that skip is undone
for them."""

import pytest

_REASON = "need --with-mpi option to run"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("mpi") is None:
            item.own_markers[:] = [m for m in item.own_markers
                                   if not (m.name == "skip" and m.kwargs.get("reason") == _REASON)]
