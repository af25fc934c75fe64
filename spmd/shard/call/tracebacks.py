"""Traceback filtering: an error raised under ``spmd.jit``, ``shard_map`` or ``grad``
shows the user's frames, not spmd's.

A shape mismatch in ``x @ y`` inside a jitted function is raised while spmd traces
it, dozens of frames below the user's call; the user needs two of them: their call
and their ``x @ y``.  Each public entry point is an *API boundary*: when an exception
leaves it, the outermost boundary on the stack rebuilds the exception's traceback
without the frames of spmd's own files (and of the code spmd generates), as JAX does,
and re-raises the same exception object: its type, message and cause are never
changed.  The setting is JAX's, ``spmd.config.update("jax_traceback_filtering", mode)``
(or ``"traceback_filtering"``) or the environment variable ``JAX_TRACEBACK_FILTERING``
(``SPMD_TRACEBACK_FILTERING`` first), with JAX's modes:

- ``"off"``: the traceback as raised;
- ``"quiet_remove_frames"``: spmd's frames removed, and a note on the exception says
  so and how to see them;
- ``"remove_frames"``: spmd's frames removed, and the whole traceback attached as the
  exception's ``__cause__`` (an :class:`UnfilteredStackTrace`, printed above it);
- ``"tracebackhide"``: the traceback kept whole, spmd's frames marked
  ``__tracebackhide__`` (which IPython and pytest hide);
- ``"auto"`` (the default): ``"tracebackhide"`` under IPython, else
  ``"quiet_remove_frames"``.

When no user frame lies below the boundary (spmd checked an argument, or failed
itself), the frame that raised is kept, so the traceback still ends where the error
came from.

>>> spmd.jit(lambda x, y: x @ y)(np.ones((2, 3)), np.ones((2, 3)))  # doctest: +SKIP
Traceback (most recent call last):
  File "train.py", line 9, in <module>
    step(x, y)
  File "train.py", line 5, in <lambda>
    return x @ y
ShapeError: dot_general: ...
"""

from __future__ import annotations

import functools
import os
import sys
import types

from spmd.config import config

# spmd's files: the package's folder (this file is spmd/shard/call/tracebacks.py).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_GENERATED = "<spmd:"  # the file name of the code spmd generates (spmd.compiler.engine)

NOTE = ("--------------------\nFor simplicity, spmd has removed its internal frames from the "
        "traceback of this exception. Set JAX_TRACEBACK_FILTERING=off (or "
        "spmd.config.update('jax_traceback_filtering', 'off')) to include them.")

# The code objects of the boundaries' frames: an exception leaving a boundary with
# another boundary above it on the stack is left for that one to filter, once.
_BOUNDARIES: set = set()


class UnfilteredStackTrace(Exception):
    """The whole traceback of an exception whose frames were filtered (mode
    ``"remove_frames"``): attached as its ``__cause__``, so it prints above it."""


def register(fun):
    """Mark ``fun`` (a function whose body catches ``Exception`` and calls
    :func:`filter_exception` before a bare ``raise``) as an API boundary; returns it.
    For a hot path, where a wrapper's extra call would cost: an inline ``try`` costs
    nothing until something is raised.

    >>> register(Jit.__call__)  # doctest: +SKIP
    """
    _BOUNDARIES.add(getattr(fun, "__func__", fun).__code__)
    return fun


def api_boundary(fun):
    """Wrap ``fun``, a public entry point: an exception leaving it is filtered (see the
    module docstring) and re-raised unchanged otherwise.

    >>> @api_boundary
    ... def wrapped(*args): ...
    """
    @functools.wraps(fun)
    def boundary(*args, **kwargs):
        try:
            return fun(*args, **kwargs)
        except Exception as e:
            filter_exception(e)
            raise  # (bare: the frame of this wrapper is not added to the traceback)

    return boundary


register(api_boundary(lambda: None))  # the code of every api_boundary wrapper


def filter_exception(e: BaseException) -> None:
    """Filter ``e``'s traceback as the mode says, in place; called by a boundary's
    ``except`` right before it re-raises ``e`` (its caller's frame is the boundary's)."""
    mode = _mode()
    if mode == "off" or e.__traceback__ is None or _outer_boundary(sys._getframe(2)):
        return
    tb = e.__traceback__
    if mode == "tracebackhide":
        while tb is not None:
            if _internal(tb.tb_frame.f_code.co_filename):
                tb.tb_frame.f_locals["__tracebackhide__"] = True
            tb = tb.tb_next
        return
    e.__traceback__ = _filtered(tb)
    if mode == "quiet_remove_frames":
        if NOTE not in getattr(e, "__notes__", ()):
            e.add_note(NOTE)
    elif not isinstance(e.__cause__, UnfilteredStackTrace):  # (filtered once only)
        whole = UnfilteredStackTrace(
            f"{type(e).__name__}: {e}\n\nThe stack trace above includes spmd's internal "
            "frames; the one below, of the same exception, excludes them.\n"
            "--------------------").with_traceback(tb)
        whole.__cause__, whole.__context__ = e.__cause__, e.__context__
        whole.__suppress_context__ = e.__suppress_context__
        e.__cause__ = whole


def _mode() -> str:
    mode = config.traceback_filtering
    if mode == "auto":
        # IPython hides frames marked __tracebackhide__ and keeps the rest for %debug.
        shell = getattr(sys.modules.get("IPython"), "get_ipython", None)
        return "tracebackhide" if shell is not None and shell() is not None \
            else "quiet_remove_frames"
    return mode


def _outer_boundary(frame) -> bool:
    while frame is not None:
        if frame.f_code in _BOUNDARIES:
            return True
        frame = frame.f_back
    return False


@functools.lru_cache(maxsize=4096)
def _internal(filename: str) -> bool:
    return filename.startswith(_GENERATED) or os.path.abspath(filename).startswith(_PACKAGE)


def _filtered(tb):
    """The traceback ``tb`` without spmd's frames; when that leaves none, its last
    frame (where spmd raised), so that it still shows where the error came from."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    kept = [t for t in entries if not _internal(t.tb_frame.f_code.co_filename)] \
        or entries[-1:]
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out
