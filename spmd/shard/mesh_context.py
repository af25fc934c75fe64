"""The mesh context of current JAX: ``set_mesh`` / ``use_mesh`` and ``get_mesh``.

Inside ``with spmd.sharding.use_mesh(mesh):`` (or after
``spmd.sharding.set_mesh(mesh)``), ``shard_map`` needs no ``mesh=`` argument and
``device_put(x, P(...))`` places ``x`` on that mesh.  A block's mesh is per
thread, as tracing state is; ``set_mesh`` used as a plain call sets the mesh
for all threads until it is set again (``set_mesh(None)`` clears it).  Jitted
functions key their caches on the current mesh, so a function traced under one
mesh is retraced under another.
"""

from __future__ import annotations

import threading
from typing import Optional

from spmd.errors import SpmdError
from spmd import tree_util
from spmd.mesh import Mesh
from spmd.shard.array import device_put as put
from spmd.shard.spec import NamedSharding, PartitionSpec


class MeshContextError(SpmdError, ValueError):
    """No mesh where one is needed, or a value that is not a mesh."""


class _State(threading.local):
    def __init__(self):
        self.stack: list = []  # meshes of enclosing ``use_mesh``/``set_mesh`` blocks


_state = _State()
# The mesh of a plain ``set_mesh(mesh)`` call: global, as JAX's (blocks are per thread).
_base: list = [None]


def _check(mesh, fname):
    if mesh is not None and not isinstance(mesh, Mesh):
        raise MeshContextError(f"{fname}: expected a spmd.Mesh (or None), got "
                               f"{type(mesh).__name__}; make one with spmd.make_mesh(...)")
    return mesh


def get_mesh() -> Optional[object]:
    """The mesh of the innermost ``use_mesh``/``set_mesh``, or None.

    >>> with use_mesh(mesh):
    ...     assert get_mesh() is mesh
    """
    stack = _state.stack
    return stack[-1] if stack else _base[0]


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
    """``set_mesh(mesh)`` makes ``mesh`` the current mesh (``None`` clears it);
    ``with set_mesh(mesh):`` does so for the block only (and this thread), as in JAX.

    >>> spmd.sharding.set_mesh(mesh)
    >>> y = spmd.device_put(x, P("i"))   # placed on mesh
    """

    def __init__(self, mesh):
        super().__init__(mesh)
        self._previous = _base[0]
        _base[0] = self.mesh

    def __enter__(self):
        # Used as a block, the mesh is set for the block only: the global one goes back.
        _base[0] = self._previous
        return super().__enter__()


def require_mesh(fname: str, how: str = "pass mesh="):
    """The current mesh, or an error naming ``fname`` and the ways to give one."""
    mesh = get_mesh()
    if mesh is None:
        raise MeshContextError(
            f"{fname}: no mesh was given and none is set; {how}, or call it inside "
            "`with spmd.sharding.use_mesh(mesh):` (or after spmd.sharding.set_mesh(mesh))")
    return mesh


def resolve_specs(shardings, fname: str):
    """``shardings`` (a pytree prefix) with each bare PartitionSpec made a
    NamedSharding over the current mesh; unchanged when it holds none."""
    def is_leaf(s):
        return isinstance(s, (PartitionSpec, NamedSharding))

    if not any(isinstance(s, PartitionSpec)
               for s in tree_util.tree_leaves(shardings, is_leaf=is_leaf)):
        return shardings
    mesh = require_mesh(fname, "give NamedSharding(mesh, spec) instead of a bare PartitionSpec")
    return tree_util.tree_map(
        lambda s: NamedSharding(mesh, s) if isinstance(s, PartitionSpec) else s, shardings,
        is_leaf=is_leaf)


def device_put(x, device=None, *args, **kwargs):
    """``spmd.device_put``: as :func:`spmd.shard.array.device_put`, and a bare
    ``PartitionSpec`` places ``x`` on the current mesh (``use_mesh``/``set_mesh``).

    >>> with spmd.sharding.use_mesh(mesh):
    ...     x = spmd.device_put(np.ones((8, 4)), P("i"))
    """
    if get_mesh() is not None:  # (without one, device_put's own error names the fix)
        device = resolve_specs(device, "device_put")
    return put(x, device, *args, **kwargs)


