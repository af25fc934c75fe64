"""_spmd_pytest_plugin, loaded through the pytest11 entry point: the spmd_mesh fixture
(meshes larger than the run's devices, the count put back after) and the spmd_meshes
marker (one run per shape), used here directly and in an inner pytest run of a
user's test file (pytester, in a subprocess: its own devices)."""

from __future__ import annotations

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P
from spmd.testing import assert_sharded_allclose
from tests.testing import usage_error

pytest_plugins = ["pytester"]


def test_spmd_mesh_makes_a_mesh_larger_than_the_run(spmd_mesh):
    before = spmd.device_count()
    mesh = spmd_mesh((before, 2), ("data", "model"))
    assert mesh.shape == {"data": before, "model": 2}
    x = spmd.device_put(np.ones((before, 2), np.float32), NamedSharding(mesh, P("data", "model")))
    assert_sharded_allclose(spmd.jit(lambda a: a * 3)(x), np.full((before, 2), 3.0))


def test_the_device_count_is_back_after_the_test_above():
    assert spmd.device_count() == 8  # tests/conftest.py's SPMD_NUM_DEVICES


@pytest.mark.spmd_meshes((8,), (4, 2), (2, 2, 2))
def test_spmd_meshes_runs_once_per_shape(spmd_mesh, request):
    mesh = spmd_mesh()
    shape = tuple(mesh.shape.values())
    assert request.node.callspec.id in ("8", "4x2", "2x2x2")
    assert "x".join(map(str, shape)) == request.node.callspec.id
    assert mesh.axis_names == ("i", "j", "k")[:len(shape)]
    spec = P(mesh.axis_names)  # every axis on the first dimension
    x = spmd.device_put(np.arange(16.0, dtype=np.float32), NamedSharding(mesh, spec))
    assert_sharded_allclose(spmd.jit(lambda a: a - 1)(x), np.arange(16.0) - 1)


USER_TESTS = '''
import numpy as np
import pytest
import spmd
from spmd import NamedSharding, P
from spmd.testing import assert_sharded_allclose


def test_big_mesh(spmd_mesh):
    mesh = spmd_mesh((4, 4), ("i", "j"))
    assert spmd.device_count() == 16


def test_count_back():
    assert spmd.device_count() == 2


@pytest.mark.spmd_meshes((2,), (1, 2), names=("rows", "cols"))
def test_named(spmd_mesh):
    mesh = spmd_mesh()
    assert mesh.axis_names[0] == "rows"


def test_wrong_block(spmd_mesh):
    mesh = spmd_mesh((2,), ("i",))
    x = spmd.device_put(np.zeros(4, np.float32), NamedSharding(mesh, P("i")))
    assert_sharded_allclose(x, np.array([0, 0, 0, 1.0]))


def test_no_shape(spmd_mesh):
    spmd_mesh()

'''


def test_a_users_test_file_with_plain_pytest(pytester, monkeypatch):
    monkeypatch.setenv("SPMD_NUM_DEVICES", "2")
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    out = result.stdout.str()
    result.assert_outcomes(passed=4, failed=2)
    assert "the block of device 1, mesh coordinates {'i': 1}, global index [2:4]" in out
    assert "spmd_mesh(): give a shape" in out


def test_the_marker_needs_the_fixture(pytester):
    out = usage_error(pytester, """
import pytest

@pytest.mark.spmd_meshes((2,))
def test_marker_without_fixture():
    pass
""")
    assert "needs the test to take the spmd_mesh fixture" in out


def test_a_bad_marker_shape_is_a_usage_error(pytester):
    out = usage_error(pytester, """
import pytest

@pytest.mark.spmd_meshes((0, 2))
def test_bad(spmd_mesh):
    pass
""")
    assert "give one or more mesh shapes, each a tuple of positive axis sizes" in out


def test_spmd_modules_are_not_assertion_rewritten(pytester):
    """pytest marks the packages of a pytest11 plugin's distribution for assertion
    rewriting; the plugin takes spmd back out (its modules are library code)."""
    pytester.makepyfile(test_user='''
def test_not_rewritten():
    import spmd.shard.arrays.local_data as m
    from _pytest.assertion.rewrite import AssertionRewritingHook
    assert not isinstance(m.__loader__, AssertionRewritingHook), m.__loader__
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_session_without_spmd_imports_nothing_of_it(pytester):
    """The plugin is loaded in every pytest run of the environment; one that uses none
    of spmd's markers and fixtures imports nothing of spmd (no process settings, no
    second of imports)."""
    pytester.makepyfile(test_user='''
import sys

def test_untouched():
    assert not [m for m in sys.modules if m == "spmd" or m.startswith("spmd.")]
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
