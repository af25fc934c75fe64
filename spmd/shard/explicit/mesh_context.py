"""The mesh context of current JAX: ``set_mesh`` / ``use_mesh`` and ``get_mesh``, and
``get_abstract_mesh`` (the axes of the current mesh, or of the enclosing ``shard_map``).

Inside ``with spmd.sharding.use_mesh(mesh):`` (or after
``spmd.sharding.set_mesh(mesh)``), ``shard_map`` needs no ``mesh=`` argument and
``device_put(x, P(...))`` places ``x`` on that mesh.  A block's mesh is per
thread, as tracing state is; ``set_mesh`` used as a plain call sets the mesh
for all threads until it is set again (``set_mesh(None)`` clears it).  Jitted
functions key their caches on the current mesh, so a function traced under one
mesh is retraced under another.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

from spmd.errors import SpmdError
from spmd import tree_util
from spmd.launch.timeline import recorder as _timeline
from spmd.mesh import AbstractMesh, AxisType, Mesh
from spmd.mesh.devices import Device
from spmd.shard.arrays.placing import device_put as put
from spmd.shard.arrays.sharded import SingleDeviceSharding
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec


class MeshContextError(SpmdError, ValueError):
    """No mesh where one is needed, or a value that is not a mesh."""


class _State(threading.local):
    def __init__(self):
        self.stack: list = []  # meshes of enclosing ``use_mesh``/``set_mesh`` blocks
        self.bodies: list = []  # (mesh, manual axes) of enclosing shard_map bodies
        self.eager_bodies = 0  # how many of them run eagerly (on concrete blocks)
        # Per jitted call being traced, the meshes its placed arguments are on.
        self.calls: list = []


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


def context_key():
    """What the caches of traced programs key on (the compiler's ``CONTEXT_KEY``): the
    current mesh, and whether a trace is on (a program stacked while a trace is on
    carries the markers of its collectives, :mod:`spmd.collectives.local`, and is
    never served to a call without one, nor the reverse).  The same work as
    :func:`get_mesh`, written out: it runs on every jitted call.

    >>> context_key() is get_mesh()   # no trace on
    True
    """
    stack = _state.stack
    mesh = stack[-1] if stack else _base[0]
    return mesh if _timeline.ACTIVE is None else (_TRACING, mesh)


_TRACING = "a trace is on"  # (a key part no mesh equals)


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


@contextlib.contextmanager
def in_body(mesh, manual, eager: bool = False):
    """While a ``shard_map`` body over ``mesh`` runs (``eager``: on concrete blocks) or
    is traced, manual along ``manual`` (all its axes when None): what
    :func:`get_abstract_mesh` says there."""
    _state.bodies.append((mesh, frozenset(mesh.axis_names if manual is None else manual)))
    _state.eager_bodies += eager
    try:
        yield
    finally:
        _state.bodies.pop()
        _state.eager_bodies -= eager


def get_abstract_mesh() -> AbstractMesh:
    """The current mesh's axis names, sizes and types (``jax.sharding.get_abstract_mesh``):
    inside a ``shard_map`` body its mesh, the body's manual axes (and those of enclosing
    bodies) typed ``Manual`` and the others as the mesh types them; else the mesh of
    ``set_mesh``/``use_mesh``; else an empty one (``.empty``).

    >>> shard_map(lambda b: b * get_abstract_mesh().shape["i"], ...)  # doctest: +SKIP
    """
    if _state.bodies:
        mesh = _state.bodies[-1][0]
        manual = frozenset().union(*(m for b, m in _state.bodies if b == mesh))
        return AbstractMesh(mesh.axis_sizes, mesh.axis_names,
                            tuple(AxisType.Manual if a in manual else t
                                  for a, t in zip(mesh.axis_names, mesh.axis_types)))
    mesh = get_mesh()
    return AbstractMesh((), ()) if mesh is None else mesh.abstract_mesh


@contextlib.contextmanager
def tracing_call(meshes):
    """While a jitted call whose placed arguments are on ``meshes`` is traced: a
    ``shard_map(mesh=AbstractMesh)`` inside may run on one of them (as in JAX)."""
    _state.calls.append(tuple(meshes))
    try:
        yield
    finally:
        _state.calls.pop()


def concrete_mesh(abstract: AbstractMesh, fname: str, arg_meshes=()) -> Mesh:
    """The mesh whose axes are ``abstract``'s that ``shard_map(mesh=abstract)`` runs on:
    an enclosing shard_map body's, else that of ``set_mesh``/``use_mesh``, else that of
    its arguments (``arg_meshes``: the meshes its placed arguments are on), else that of
    the placed arguments of the jitted call being traced."""
    candidates = [b for b, _ in reversed(_state.bodies)] + [get_mesh()] + list(arg_meshes)
    candidates += [m for call in reversed(_state.calls) for m in call]
    for mesh in candidates:
        if mesh is not None and (mesh.axis_names, mesh.axis_sizes) == \
                (abstract.axis_names, abstract.axis_sizes):
            return mesh
    raise MeshContextError(
        f"{fname}: mesh={abstract} has no devices, and no mesh of its axes is in context "
        f"(current: {get_mesh()}) or holds its arguments; pass Arrays placed on a mesh of "
        "those axes (NamedSharding), call it inside `with spmd.sharding.use_mesh(mesh):`, "
        "or pass the Mesh itself")


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
    """``spmd.device_put``: as :func:`spmd.shard.arrays.placing.device_put`, and a bare
    ``PartitionSpec`` places ``x`` on the current mesh (``use_mesh``/``set_mesh``).

    >>> with spmd.sharding.use_mesh(mesh):
    ...     x = spmd.device_put(np.ones((8, 4)), P("i"))
    """
    if _state.eager_bodies and isinstance(device, (Device, SingleDeviceSharding)):
        # A body's values are blocks on every device of its mesh (traced, as in JAX's
        # jit, a device_put is only a value).
        raise EagerBodyDeviceError(
            f"device_put inside an eager shard_map body got device {device!r}: the body "
            "runs on every device of its mesh, so its values cannot be put on one; leave "
            "the device out (device_put(x)), or call device_put outside the shard_map")
    if get_mesh() is not None:  # (without one, device_put's own error names the fix)
        device = resolve_specs(device, "device_put")
    return put(x, device, *args, **kwargs)


class EagerBodyDeviceError(SpmdError, ValueError):
    """``device_put`` to one device inside an eager ``shard_map`` body."""


