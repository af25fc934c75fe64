"""The mesh context of current JAX: ``set_mesh`` / ``use_mesh`` and ``get_mesh``.

Inside ``with spmd.sharding.use_mesh(mesh):`` (or after
``spmd.sharding.set_mesh(mesh)``), ``shard_map`` needs no ``mesh=`` argument and
``device_put(x, P(...))`` places ``x`` on that mesh.  The context is per
thread, as tracing state is; ``set_mesh`` used as a plain call sets the mesh
of the current thread until it is set again (``set_mesh(None)`` clears it).
"""

from __future__ import annotations

import threading
from typing import Optional

from spmd.errors import SpmdError


class MeshContextError(SpmdError, ValueError):
    """No mesh where one is needed, or a value that is not a mesh."""


class _State(threading.local):
    def __init__(self):
        self.stack: list = []  # meshes of enclosing ``use_mesh``/``set_mesh`` blocks
        self.base = None  # the mesh of a plain ``set_mesh(mesh)`` call


_state = _State()


def _check(mesh, fname):
    from spmd.mesh import Mesh

    if mesh is not None and not isinstance(mesh, Mesh):
        raise MeshContextError(f"{fname}: expected a spmd.Mesh (or None), got "
                               f"{type(mesh).__name__}; make one with spmd.make_mesh(...)")
    return mesh


def get_mesh() -> Optional[object]:
    """The mesh of the innermost ``use_mesh``/``set_mesh``, or None.

    >>> with use_mesh(mesh):
    ...     assert get_mesh() is mesh
    """
    if _state.stack:
        return _state.stack[-1]
    return _state.base


class use_mesh:
    """Context manager making ``mesh`` the current mesh inside its block.

    >>> with spmd.sharding.use_mesh(mesh):
    ...     y = spmd.shard_map(f, in_specs=P("i"), out_specs=P("i"))(x)
    """

    def __init__(self, mesh):
        self.mesh = _check(mesh, type(self).__name__)

    def __enter__(self):
        _state.stack.append(self.mesh)
        return self.mesh

    def __exit__(self, *exc):
        _state.stack.pop()
        return False


class set_mesh(use_mesh):
    """``set_mesh(mesh)`` makes ``mesh`` the current mesh of this thread (``None``
    clears it); ``with set_mesh(mesh):`` does so for the block only, as in JAX.

    >>> spmd.sharding.set_mesh(mesh)
    >>> y = spmd.device_put(x, P("i"))   # placed on mesh
    """

    def __init__(self, mesh):
        super().__init__(mesh)
        self._previous = _state.base
        _state.base = self.mesh

    def __enter__(self):
        # Within a block the base mesh is the one from before this call, restored on exit.
        _state.base = self._previous
        return super().__enter__()


def require_mesh(fname: str, how: str = "pass mesh="):
    """The current mesh, or an error naming ``fname`` and the ways to give one."""
    mesh = get_mesh()
    if mesh is None:
        raise MeshContextError(
            f"{fname}: no mesh was given and none is set; {how}, or call it inside "
            "`with spmd.sharding.use_mesh(mesh):` (or after spmd.sharding.set_mesh(mesh))")
    return mesh
