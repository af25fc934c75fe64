"""The one installer of the compiler's extension points (and of the array methods).

The compiler declares what it needs from the layers above it
(:mod:`spmd.compiler.extensions`); :func:`install_extensions` calls the
``register()`` of each layer above it, in layer order (``spmd.launch``,
``spmd.collectives``, ``spmd.shard``: each fills the points it provides, and the
shard layer the partition decisions), then loads ``spmd.numpy``, whose import
installs the numpy operators and methods of ``Array`` and tracers
(``spmd/numpy/_methods.py``).  No module fills a point or another module's table
when it is imported, so each layer can be loaded and tested alone, and this file is
where a reader finds the wiring.

Who runs it (``spmd/__init__.py`` is lazy, so that ``import spmd.compiler`` loads
nothing above the compiler; see docs/architecture.md, "Loading lazily"):

- ``spmd/__init__.py`` registers it with the compiler
  (:func:`spmd.compiler.extensions.register_installer`): Python runs that file
  before any submodule, whatever the import;
- the shard layer runs it (:func:`spmd.compiler.extensions.run_installer`) at the
  end of ``spmd/shard/__init__.py``: every import that reaches the mesh context
  (``from spmd.shard.maps.shard_map import shard_map`` alone, a pickled placed array)
  fills the points before the shard layer can be used, so ``CONTEXT_KEY`` is never
  at its default while a mesh context can exist;
- every front-end package runs it when imported (``import spmd.numpy``,
  ``import spmd.lax``, ...), and the root's ``__getattr__`` before it hands out a
  name (``spmd.jit``, ``from spmd import shard_map``);
- an ``Array`` unpickled in a fresh process runs it (``Array.__setstate__``).

It runs once; a call made while it runs in the same thread (an import it triggers
comes back to it) returns at once, and the outer call finishes the work before any
user code runs; a call from another thread waits for it (``spmd._install_run``).

Threads.  ``import spmd.shard.call.jit`` does not wait for a package ``spmd.shard`` that
another thread is still loading (Python imports the parent only when it is not in
``sys.modules`` at all): two threads would load the layer's modules at once, each in
its own order, and where those modules import each other the import system hands one
of them a partly run module (``cannot import name 'Jit' from partially initialized
module``, about one run in a hundred of ``tests/test_install.py``).  ``import
spmd.shard`` itself does wait.  So every public way in imports it first: the root's
``__getattr__`` (for all but the lower layers' modules, which load alone) and the
first spmd import of each front end (``spmd.numpy``, ``spmd.lax``, ...).  The thread
that loads it loads the shard layer and, through it, the layers below; the others
wait until it is whole.

>>> import spmd
>>> spmd.jit and None   # any public name runs the installer
>>> from spmd.compiler import extensions
>>> extensions.PVARY.installed_by
'spmd.collectives.api'
"""

from __future__ import annotations

import importlib
import importlib._bootstrap
import sys
import time

from spmd.compiler import extensions

# The import system's deadlock error (private; a RuntimeError in 3.9..3.13).  Where an
# interpreter lacks it, a class nothing raises: a deadlock then propagates, loudly.
_DEADLOCK = (getattr(importlib._bootstrap, "_DeadlockError", None)
             or type("_NoDeadlockError", (Exception,), {}))

# "idle", "running" (re-entrant calls return), "filled" (points filled; spmd.numpy,
# which installs the methods, still loading in some thread), "done" (both).
_state: list = ["idle"]


def install_extensions() -> None:
    """Fill every extension point of the compiler and load the array methods (once).

    Threads: the work runs as the import of ``spmd._install_run``, so Python's
    per-module import lock orders it.  Another thread that asks while it runs waits
    until it is done (it used to return at once and could trace with ``Array``
    operators not yet installed); the running thread's own re-entrant calls return
    at once, and so does a call whose wait would close a cycle of import locks.
    """
    if _state[0] == "done":
        return
    try:
        importlib.import_module("spmd._install_run")
        if not _methods_installed():
            # Points filled, but spmd.numpy, which installs the methods, is loading:
            # wait for the thread that loads it.  The import system hands back the
            # partial module instead of waiting when the wait would close a cycle of
            # import locks (or this thread is the one loading it): then return, and
            # the outer call finishes (and :func:`install_and_wait` checks).
            importlib.import_module("spmd.numpy")
    except _DEADLOCK:
        # This thread holds an import lock the running installer waits for (it is
        # importing spmd.numpy, whose methods it has just installed itself): return
        # as a re-entrant call does; the installer finishes once this import does.
        return
    if _methods_installed() and _state[0] == "filled":
        _state[0] = "done"


def install_and_wait(what: str, retries: int = 200, pause: float = 0.01) -> None:
    """:func:`install_extensions`, for a caller that holds no spmd import lock.

    Before user code gets a public name (``spmd.jit``), the methods must be on the
    classes.  A call can return early when another thread is mid-install (above);
    from a thread that holds no spmd import lock the next try waits instead, so a
    few tries settle it.  Raises ImportError naming ``what`` if they never do.
    """
    for _ in range(retries):
        install_extensions()
        if _state[0] == "done":
            return
        time.sleep(pause)
    raise ImportError(f"{what}: the array methods of spmd were not installed while other "
                      f"threads kept importing spmd (state {_state[0]!r}); import spmd.numpy "
                      "in one thread before starting the others")


def _methods_installed() -> bool:
    methods = sys.modules.get("spmd.numpy._methods")
    return bool(methods is not None and getattr(methods, "INSTALLED", False))


def run_once() -> None:
    """The work of :func:`install_extensions` (run by importing ``spmd._install_run``)."""
    if _state[0] != "idle":
        return
    _state[0] = "running"
    try:
        _fill_points()
        # The operators and methods of Array and tracers; a no-op import while
        # spmd.numpy itself is loading (it installs them as it finishes).  While
        # another thread loads it, the import may hand back the partial module
        # (a cycle of import locks): the state then waits in "filled" until the
        # methods are on the classes (`install_extensions`).
        import spmd.numpy  # noqa: F401
    except BaseException:
        _state[0] = "idle"  # a failed import: the next attempt says why again
        raise
    _state[0] = "done" if _methods_installed() else "filled"


def _fill_points() -> None:
    """Each layer above the compiler fills what it provides (its ``register()``), in
    layer order; then every point must be filled."""
    import spmd.collectives
    import spmd.launch
    import spmd.shard

    for layer in (spmd.launch, spmd.collectives, spmd.shard):
        layer.register()
    left = [p.name for p in extensions.POINTS if p.installed_by is None]
    if left:  # a point declared without a layer that fills it
        raise RuntimeError(f"install_extensions: extension points left at their default: "
                           f"{left}; fill them in the register() of the layer that "
                           "provides them")
