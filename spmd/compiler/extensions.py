"""The compiler's extension points: the behaviour that upper layers supply.

The compiler (layer 0) never imports the layers above it, yet two of its paths
need them: tracing a ``shard_map`` body inserts ``pvary`` (a collective), and an
eager operation on a sharded ``Array`` runs through the partitioner.  Each such
need is one :class:`ExtensionPoint` declared here, with its name, the signature of
the function that fills it, what it is for, and a default that keeps the compiler
working alone.  Nothing fills a point when a module is imported: one installer,
:func:`spmd._install.install_extensions`, called by ``spmd/__init__.py``, fills them
all, so this file and that one are the whole picture of the wiring.

| point | filled with | default |
| --- | --- | --- |
| :data:`PVARY` | ``spmd.collectives.api.pvary_traced`` | raises ExtensionNotInstalledError |
| :data:`SHARDED_EAGER` | ``spmd.shard.partition.eager.run_sharded`` | returns None (computed whole) |

Not yet moved here (issue 16): ``spmd.compiler.array_module.resolver`` (the array
module of the devices), still filled by ``spmd.launch.platform`` when imported.

>>> [p.name for p in POINTS]
['pvary', 'sharded_eager']
"""

from __future__ import annotations

from typing import Callable, Generic, Optional, TypeVar

from spmd.errors import SpmdError

F = TypeVar("F", bound=Callable)


class ExtensionNotInstalledError(SpmdError, RuntimeError):
    """An extension point was needed before ``spmd`` (which fills them all) was imported."""


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


def _pvary_missing(x, axes):
    raise ExtensionNotInstalledError(
        f"a value meets others varying along mesh axes {tuple(axes)} and needs pvary, which "
        "the collectives layer provides; `import spmd` (it installs the compiler's extension "
        "points) before tracing shard_map bodies")


PVARY: ExtensionPoint = ExtensionPoint(
    "pvary", "(x: Tracer, axes: tuple[str, ...]) -> Tracer",
    "Mark ``x`` as varying along ``axes`` (an explicit pvary equation, whose transpose is "
    "the psum reverse mode needs; JEP 17111).  Called when tracing a shard_map body, where "
    "an operand invariant along some axes meets one that varies along them.",
    _pvary_missing)

SHARDED_EAGER: ExtensionPoint = ExtensionPoint(
    "sharded_eager", "(prim: Primitive, args: list, params: dict) -> list | None",
    "Run an eager primitive whose arguments include an Array placed on a mesh; returns "
    "the outputs (placed by the partitioner), or None where it does not apply.",
    lambda prim, args, params: None)

# Every point, for the installer's check and the tests.
POINTS: tuple = (PVARY, SHARDED_EAGER)
