"""The compiler's extension points: the behaviour that upper layers supply.

The compiler (layer 0) never imports the layers above it, yet two of its paths
need them: tracing a ``shard_map`` body inserts ``pvary`` (a collective), and
caches of traced programs must key on ambient state of the shard layer (the
mesh context that a ``shard_map`` without ``mesh=`` reads).  Each such
need is one :class:`ExtensionPoint` declared here, with its name, the signature of
the function that fills it, what it is for, and a default that keeps the compiler
working alone.  Nothing fills a point when a module is imported: one installer,
:func:`spmd._install.install_extensions`, fills them all, so this file and that one
are the whole picture of the wiring.

When it runs.  ``spmd/__init__.py`` is lazy (``import spmd.compiler`` must load
nothing above the compiler), and Python runs it before any submodule, so it hands
the installer to this module (:func:`register_installer`) without importing it.
The installer then runs (:func:`run_installer`, once):

- at the end of ``spmd/shard/__init__.py``.  The shard layer is the top layer below
  the front ends and every provider of a point sits at or below it, but it may not
  import the front end (``spmd._install``), hence the registered function.  So a
  usable shard layer always has its points filled, whatever imported it: in
  particular :data:`CONTEXT_KEY` is never at its default (``None``) once a mesh
  context can be set, which would let a cache traced under one mesh serve another;
- when any front end is imported (``spmd.numpy``, ``spmd.lax``, ``spmd.autodiff``,
  ...), and before the root's ``__getattr__`` hands out a name (``spmd.jit``);
- when an ``Array`` is unpickled (``Array.__setstate__``).

Before that, the defaults are right for what is loaded: without the shard layer
no mesh context exists (``CONTEXT_KEY`` -> None is exact), no ``shard_map`` body is
traced (``PVARY`` is never asked), and the points that have no sensible default
raise :class:`ExtensionNotInstalledError` instead of answering wrongly.

| point | filled with | default |
| --- | --- | --- |
| :data:`PVARY` | ``spmd.collectives.api.pvary_traced`` | raises ExtensionNotInstalledError |
| :data:`PREDUCED` | ``spmd.collectives.api.preduced_traced`` | raises ExtensionNotInstalledError |
| :data:`SUMMANDS` | ``spmd.collectives.primitives.as_summands`` | raises ExtensionNotInstalledError |
| :data:`CONTEXT_KEY` | ``spmd.shard.explicit.mesh_context.context_key`` | returns None (no ambient state) |
| :data:`PLAIN_SHARDING` | ``spmd.shard.arrays.sharded.plain_sharding`` | raises ExtensionNotInstalledError |
| :data:`PLAIN_SHARDS` | ``spmd.shard.arrays.sharded.plain_shards`` | raises ExtensionNotInstalledError |
| :data:`ARRAY_MODULE` | ``spmd.launch.platform.resolve_array_module`` | returns numpy |
| :data:`EAGER_EVAL` | ``spmd.shard.call.dispatch.eval_primitive`` | None (evaluate as usual); raises ExtensionNotInstalledError for an upper layer's array |

An upper layer may subclass :class:`spmd.compiler.core.array.Array` (the shard layer's
``ShardedArray``); an eager primitive with such an array among its arguments, and
every eager higher-order primitive, is offered to :data:`EAGER_EVAL` first, so the
compiler knows nothing of shardings or processes: not how a placed array is
computed on, nor which equations (a ``shard_map`` over processes) it cannot run.

>>> [p.name for p in POINTS]
['pvary', 'preduced', 'summands', 'context_key', 'plain_sharding', 'plain_shards', 'array_module', 'eager_eval']
"""

from __future__ import annotations

from typing import Callable, Generic, Optional, TypeVar

from spmd.errors import SpmdError

F = TypeVar("F", bound=Callable)


class ExtensionNotInstalledError(SpmdError, RuntimeError):
    """An extension point was needed while only the layers below the shard layer were
    loaded (nothing has run the installer, which fills them all)."""


class ExtensionPoint(Generic[F]):
    """A named slot of the compiler that an upper layer fills with one function.

    ``signature`` documents the function's type; ``fn`` is what is called (the
    default until :meth:`install`); ``installed_by`` names who filled it.

    >>> p = ExtensionPoint("demo", "(x: int) -> int", "doubles", lambda x: 2 * x)
    >>> p.fn(3)
    6
    """

    __slots__ = ("name", "signature", "doc", "default", "fn", "installed_by")

    def __init__(self, name: str, signature: str, doc: str, default: F):
        self.name = name
        self.signature = signature
        self.doc = doc
        self.default = default
        self.fn: F = default
        self.installed_by: Optional[str] = None

    def install(self, fn: F, by: str) -> None:
        """Fill the point with ``fn``; ``by`` names the module that provides it."""
        if not callable(fn):
            raise TypeError(f"extension point {self.name}: expected a function "
                            f"{self.signature}, got {fn!r}")
        self.fn = fn
        self.installed_by = by

    def reset(self) -> None:
        """Back to the default (tests that run the compiler alone)."""
        self.fn = self.default
        self.installed_by = None

    def __repr__(self):
        who = self.installed_by or "default"
        return f"ExtensionPoint({self.name}: {self.signature}, {who})"


# What the defaults that raise say to do.
_HOW = ("the compiler's extension points are filled when the shard layer or a front end "
        "is loaded: use spmd through them (`import spmd.numpy`, `spmd.jit`, `from spmd "
        "import shard_map`), or call spmd.compiler.extensions.run_installer()")


def _cast_missing(kind: str, cast: str):
    def missing(x, axes):
        raise ExtensionNotInstalledError(
            f"a value meets others {kind} along mesh axes {tuple(axes)} and needs {cast}, "
            f"which the collectives layer provides; {_HOW}")
    return missing


PVARY: ExtensionPoint = ExtensionPoint(
    "pvary", "(x: Tracer, axes: tuple[str, ...]) -> Tracer",
    "Mark ``x`` as varying along ``axes`` (an explicit pvary equation, whose transpose is "
    "the psum reverse mode needs; JEP 17111).  Called when tracing a shard_map body, where "
    "an operand invariant along some axes meets one that varies along them.",
    _cast_missing("varying", "pvary"))


PREDUCED: ExtensionPoint = ExtensionPoint(
    "preduced", "(x: Tracer, axes: tuple[str, ...]) -> Tracer",
    "Mark ``x`` (invariant along ``axes``) as reduced there (an explicit "
    "pcast(to='reduced') equation, whose transpose is the psum of the summands its "
    "cotangent arrives as).  Called when tracing a shard_map body, where an invariant "
    "operand meets a reduced one.",
    _cast_missing("reduced", "pcast(to='reduced')"))

SUMMANDS: ExtensionPoint = ExtensionPoint(
    "summands", "(x: Tracer, axes: tuple[str, ...]) -> Tracer",
    "``x`` typed unreduced along ``axes``: a varying value's blocks are summands as they "
    "are; an invariant one is held by the first device along them, zeros elsewhere.  "
    "Called when a loop's cotangent carry is made from a value of another type.",
    _cast_missing("unreduced", "summands (axis_index and a mask)"))

CONTEXT_KEY: ExtensionPoint = ExtensionPoint(
    "context_key", "() -> Hashable",
    "A key of the upper layers' ambient state that changes what a trace produces (the "
    "mesh of spmd.sharding.use_mesh/set_mesh, read by a shard_map without mesh=); caches "
    "of traced programs include it, so a function traced under one mesh is retraced "
    "under another.",
    lambda: None)



def _placement_missing(x):
    raise ExtensionNotInstalledError(
        "an Array's placement (.sharding, .addressable_shards) is described by the shard "
        f"layer; {_HOW}")


PLAIN_SHARDING: ExtensionPoint = ExtensionPoint(
    "plain_sharding", "(x: Array) -> Sharding",
    "The sharding of an Array that was never placed (JAX's x.sharding of an unplaced "
    "array: one whole copy on this process's first device).",
    _placement_missing)

PLAIN_SHARDS: ExtensionPoint = ExtensionPoint(
    "plain_shards", "(x: Array) -> list[Shard]",
    "The addressable shards of an Array that was never placed (one, holding the whole "
    "value).",
    _placement_missing)



def _numpy():
    import numpy

    return numpy, None


ARRAY_MODULE: ExtensionPoint = ExtensionPoint(
    "array_module", "() -> (module, gpu: int | None)",
    "The array module of this process's devices (numpy, or cupy when they are GPUs) and "
    "the GPU this rank's device arrays belong on (picked by the call; None for numpy), "
    "asked once by spmd.compiler.core.array_module.current() on first use.",
    _numpy)


def _eager_eval_default(prim, args, params):
    # Alone, the compiler has no array types but its own and no primitive whose
    # programs it cannot run: a higher-order primitive is evaluated as usual.
    from spmd.compiler.core import array as _array  # (it imports this module)

    kinds = sorted({type(a).__name__ for a in args
                    if type(a) is not _array.Array and isinstance(a, _array.Array)})
    if not kinds:
        return None
    raise ExtensionNotInstalledError(
        f"{prim.name} has an array of an upper layer among its arguments ({', '.join(kinds)}), "
        f"which that layer evaluates; {_HOW}")


EAGER_EVAL: ExtensionPoint = ExtensionPoint(
    "eager_eval", "(prim: Primitive, args: list, params: dict) -> list[Array] | None",
    "Evaluate an eager primitive that an upper layer may own: one with an array of an "
    "upper layer's subclass of Array among its arguments (a placed ShardedArray), or a "
    "higher-order one (its programs may hold that layer's equations, e.g. a shard_map "
    "whose results are not plain buffers).  Its results as Arrays, or None to evaluate "
    "it on the arguments' values (the primitive's impl).",
    _eager_eval_default)


# Every point, for the installer's check and the tests.
POINTS: tuple = (PVARY, PREDUCED, SUMMANDS, CONTEXT_KEY, PLAIN_SHARDING, PLAIN_SHARDS, ARRAY_MODULE, EAGER_EVAL)


# ----------------------------------------------------------------- the installer
# The function that fills every point, and who registered it.  ``spmd/__init__.py``
# (which Python runs before any submodule) registers it without importing anything
# above the compiler; the compiler holds it so that the layers below the front ends
# can run it without importing the front end.
_installer: list = [None, None]


def register_installer(fn: Callable[[], None], by: str) -> None:
    """Hold ``fn``, the installer of every point, for :func:`run_installer`.

    >>> register_installer(lambda: None, by="docs") is None   # doctest: +SKIP
    True
    """
    if not callable(fn):
        raise TypeError(f"register_installer: expected a function () -> None, got {fn!r}")
    _installer[0], _installer[1] = fn, by


def run_installer() -> bool:
    """Run the registered installer (it runs once; later calls return at once).

    The shard layer calls it as its package finishes loading, since CONTEXT_KEY at
    its default would let a cache be reused across meshes once the mesh context
    exists.  Returns False when no installer is registered: a layer loaded without
    ``spmd/__init__.py`` (the layer tests), whose points then keep their defaults.
    """
    fn = _installer[0]
    if fn is None:
        return False
    fn()
    return True
