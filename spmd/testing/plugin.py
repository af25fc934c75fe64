"""The pytest plugin of ``spmd`` (registered through the ``pytest11`` entry point when
``spmd`` is installed; nothing to configure).

- the ``spmd_mesh`` fixture, a factory: ``spmd_mesh((4, 2), ("i", "j"))`` is a mesh of
  simulated devices of that shape whatever ``SPMD_NUM_DEVICES`` the run started with
  (more devices are simulated for the test when needed, and the old count is put back
  after it: :func:`spmd.testing.simulated_devices`);
- the ``spmd_meshes`` marker runs a test once per mesh shape, ``spmd_mesh()`` (no
  arguments) giving that shape's mesh::

      @pytest.mark.spmd_meshes((8,), (4, 2), (2, 2, 2))
      def test_same_result_on_every_mesh(spmd_mesh):
          mesh = spmd_mesh()          # axes named "i", "j", "k" unless names= is given

Nothing of spmd is imported before a test asks for it (a conftest may still set
``SPMD_NUM_DEVICES`` first).
"""

from __future__ import annotations

import contextlib
import math

import pytest

_NAMES = ("i", "j", "k", "l", "m", "n")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "spmd_meshes(*shapes, names=None): run the test once per mesh shape; "
        "the spmd_mesh fixture called with no arguments gives that shape's mesh "
        "(spmd.testing.plugin)")


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
