"""The pytest plugin of ``spmd`` (registered through the ``pytest11`` entry point when
``spmd`` is installed; nothing to configure).

- the ``spmd`` marker: ``@pytest.mark.spmd(processes=2, devices_per_process=1,
  timeout=60, env=None)`` runs the test as a job of that many MPI ranks (with those
  environment variables set for them), from a plain ``pytest``, through a pool of
  rank workers (:mod:`spmd.testing.pool`), with one outcome naming each rank that
  failed, hung or died; under an outer ``mpiexec`` (pytest-mpi) marked tests run in
  place;
- the ``spmd_mesh`` fixture, a factory: ``spmd_mesh((4, 2), ("i", "j"))`` is a mesh of
  simulated devices of that shape whatever ``SPMD_NUM_DEVICES`` the run started with
  (more devices are simulated for the test when needed, and the old count is put back
  after it: :func:`spmd.testing.simulated_devices`);
- the ``spmd_meshes`` marker runs a test once per mesh shape, ``spmd_mesh()`` (no
  arguments) giving that shape's mesh::

      @pytest.mark.spmd_meshes((8,), (4, 2), (2, 2, 2))
      def test_same_result_on_every_mesh(spmd_mesh):
          mesh = spmd_mesh()          # axes named "i", "j", "k" unless names= is given

Nothing of spmd is imported before a test asks for it: a conftest may still set
``SPMD_NUM_DEVICES`` first, and a session that uses none of spmd's markers and
fixtures gets none of spmd's process settings (``spmd.config``) nor the cost of its
import (about a second for the whole library).  That is why this is a top-level
module, outside the ``spmd`` package.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import pytest

_NAMES = ("i", "j", "k", "l", "m", "n")


def pytest_addoption(parser, pluginmanager):
    # pytest marks every package of a distribution that has a pytest11 entry point for
    # assertion rewriting, so each spmd module imported during a test run would be
    # parsed and recompiled with pytest's asserts (measured: a lazily imported module
    # costing 150 KB of allocations inside a test's memory budget).  spmd is a library,
    # not test code: its modules keep their own asserts.  (The earliest hook a plugin
    # gets: before conftest files import anything.)
    hook = getattr(pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    if isinstance(marked, set):
        for name in [n for n in marked if n == "spmd" or n.startswith("spmd.")]:
            marked.discard(name)
        cache = getattr(hook, "_marked_for_rewrite_cache", None)
        if isinstance(cache, dict):
            cache.clear()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "spmd(processes=2, devices_per_process=1, timeout=60, env=None): run the "
        "test as a job of that many MPI ranks, with those environment variables (a pool of "
        "rank workers per (processes, devices, env), reused); one outcome, naming "
        "each rank that failed, hung or died (_spmd_pytest_plugin)")
    config.addinivalue_line(
        "markers", "spmd_meshes(*shapes, names=None): run the test once per mesh shape; "
        "the spmd_mesh fixture called with no arguments gives that shape's mesh "
        "(_spmd_pytest_plugin)")


# ------------------------------------------------------- multi-process tests

DEFAULT_TIMEOUT = 60.0
_POOLS = None


def _in_place() -> bool:
    """Whether marked tests run in this process as they are: in a pool's rank, or in an
    MPI job started around pytest (``mpiexec -n N python -m pytest --with-mpi``)."""
    if os.environ.get("SPMD_TESTING_WORKER"):
        return True
    from spmd.launch.runtime import launched_by_mpi

    return launched_by_mpi()


def _marker_args(item, marker) -> tuple:
    """``(processes, devices_per_process, timeout, env)`` of an ``spmd`` marker."""
    def arg(name, default, kind, low):
        value = marker.kwargs.get(name, default)
        if isinstance(value, bool) or not isinstance(value, kind) or value < low:
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.spmd({name}={value!r}): {name} must be a "
                f"number >= {low}, e.g. @pytest.mark.spmd(processes=2, timeout=30)")
        return value

    if marker.args:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.spmd takes keywords: "
                                "processes=, devices_per_process=, timeout=, env=")
    env = marker.kwargs.get("env") or {}
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and k and "=" not in k and isinstance(v, str)
            for k, v in env.items()):
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.spmd(env={env!r}): env must map environment "
            "variable names to string values, e.g. env={'SPMD_SIMULATE_NODES': '2'}")
    return (arg("processes", 2, int, 1), arg("devices_per_process", 1, int, 1),
            float(arg("timeout", DEFAULT_TIMEOUT, (int, float), 1)), dict(env))


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("spmd")
    if marker is None or not _in_place() or os.environ.get("SPMD_TESTING_WORKER"):
        return
    # Under an outer mpiexec: the job must be the size and have the environment the
    # test asks for (its variables are read when the ranks start: none can be set now).
    import spmd

    processes, _, _, env = _marker_args(item, marker)
    if spmd.process_count() != processes:
        pytest.skip(f"@pytest.mark.spmd(processes={processes}) in an MPI job of "
                    f"{spmd.process_count()} ranks")
    differ = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if differ:
        pytest.skip(f"@pytest.mark.spmd(env=...) needs {differ} in the environment; "
                    "this MPI job started without it")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # pytest-timeout's limit (--timeout, a timeout marker) would interrupt this process
    # while it waits for the ranks, leaving the pool in mid-test: the marker's own
    # timeout is the test's limit there, and the pool names the ranks that hung.
    marked = [item for item in items if item.get_closest_marker("spmd") is not None]
    if not marked or not config.pluginmanager.hasplugin("timeout") or _in_place():
        return
    for item in marked:
        item.add_marker(pytest.mark.timeout(0), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    marker = item.get_closest_marker("spmd")
    if marker is None or _in_place():
        return None
    global _POOLS
    from spmd.testing.pool import Pools

    processes, devices, timeout, env = _marker_args(item, marker)
    if _POOLS is None:
        _POOLS = Pools()
    config = item.config
    job = {"file": str(item.path), "nodeid": item.nodeid, "rootdir": str(config.rootpath),
           "invocation_dir": str(config.invocation_params.dir),
           "inifile": str(config.inipath) if config.inipath else None}
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    start = time.time()
    try:
        outcome = _POOLS.run(processes, devices, job, timeout, env)
        phases, seconds = outcome.phases, outcome.seconds
    except RuntimeError as e:  # the pool did not start
        phases, seconds = [("setup", "failed", str(e), None)], time.time() - start
    keywords = {k: 1 for k in item.keywords}
    reported = {when for when, *_ in phases}
    for when in ("setup", "call", "teardown"):
        if when == "teardown" and _teardown_before(item, nextitem, start):
            continue
        found = next((p for p in phases if p[0] == when), None)
        if found is None:
            if when == "call" and ("setup" in reported):
                continue  # setup failed or skipped: no call, as pytest reports it
            found = (when, "passed", "", None)
        _, result, text, reason = found
        longrepr = None
        if result == "failed":
            longrepr = text
        elif result == "skipped":
            longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
        report = pytest.TestReport(item.nodeid, item.location, keywords, result, longrepr,
                                   when, duration=seconds if when == "call" else 0.0,
                                   start=start, stop=start + seconds)
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _teardown_before(item, nextitem, start: float) -> bool:
    """Tear down here what the tests before ``item`` set up (their modules' and
    packages' fixtures) up to what ``nextitem`` shares, as pytest does after any test:
    this process sets up nothing of a marked test, but must leave its setup state as
    the next test expects.  True when that failed (and was reported).

    pytest's own teardown step (its ``runner`` plugin's), without the hook's other
    implementations: those read what their setup step stored, and there was none."""
    runner = item.config.pluginmanager.get_plugin("runner")
    call = pytest.CallInfo.from_call(
        lambda: runner.pytest_runtest_teardown(item=item, nextitem=nextitem),
        when="teardown", reraise=(pytest.exit.Exception, KeyboardInterrupt))
    if call.excinfo is None:
        return False
    report = pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords},
                               "failed", call.excinfo.getrepr(), "teardown",
                               duration=call.duration, start=start, stop=call.stop)
    item.ihook.pytest_runtest_logreport(report=report)
    return True


def pytest_sessionfinish(session):
    if _POOLS is not None:
        _POOLS.stop()


# ------------------------------------------------------------ simulated meshes

def _shapes(marker) -> list:
    shapes = [tuple(int(s) for s in (a if isinstance(a, (tuple, list)) else (a,)))
              for a in marker.args]
    if not shapes or any(not s or min(s) < 1 for s in shapes):
        raise pytest.UsageError(
            f"@pytest.mark.spmd_meshes{marker.args}: give one or more mesh shapes, each a "
            "tuple of positive axis sizes, e.g. @pytest.mark.spmd_meshes((8,), (4, 2))")
    return shapes


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("spmd_meshes")
    if marker is None:
        return
    if "_spmd_mesh_shape" not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: @pytest.mark.spmd_meshes needs the test to take "
            "the spmd_mesh fixture (spmd_mesh() is then the mesh of each shape)")
    shapes = _shapes(marker)
    metafunc.parametrize("_spmd_mesh_shape", shapes, indirect=True,
                         ids=["x".join(map(str, s)) for s in shapes])


@pytest.fixture
def _spmd_mesh_shape(request):
    """The mesh shape of this run of an ``spmd_meshes`` test (None otherwise)."""
    return getattr(request, "param", None)


@pytest.fixture
def spmd_mesh(request, _spmd_mesh_shape):
    """``spmd_mesh(shape, names)``: a mesh of simulated devices of that shape (made for
    the test when the process has fewer; put back after it).  Under an
    ``spmd_meshes`` marker, ``spmd_mesh()`` is the mesh of this run's shape.

    >>> def test_psum(spmd_mesh):
    ...     mesh = spmd_mesh((4, 2), ("i", "j"))   # doctest: +SKIP
    """
    import spmd
    from spmd.errors import ArgumentError
    from spmd.testing import simulated_devices

    marker = request.node.get_closest_marker("spmd_meshes")
    default_names = marker.kwargs.get("names") if marker is not None else None
    with contextlib.ExitStack() as stack:
        def make(shape=None, names=None):
            if shape is None:
                if _spmd_mesh_shape is None:
                    raise ArgumentError(
                        "spmd_mesh(): give a shape, e.g. spmd_mesh((4, 2), ('i', 'j')), or "
                        "mark the test with @pytest.mark.spmd_meshes(...) to get each of its "
                        "shapes")
                shape = _spmd_mesh_shape
            shape = tuple(shape)
            if names is None:  # the marker's names (as many as the shape has axes)
                names = tuple(default_names or _NAMES)[:len(shape)]
            stack.enter_context(simulated_devices(math.prod(shape)))
            return spmd.make_mesh(shape, names)

        yield make
