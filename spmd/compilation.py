"""Where programs compile, and what they keep: JAX's :func:`default_backend`,
:func:`clear_caches` and :func:`named_scope`.

>>> spmd.default_backend()
'cpu'
>>> spmd.clear_caches()     # every jitted function traces again on its next call
"""

from __future__ import annotations

import contextlib
import gc
import threading

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.compiler.core.jit import JitFunction
from spmd.mesh import local_devices
from spmd.shard.call.jit import Jit

__all__ = ["clear_caches", "default_backend", "name_stack", "named_scope"]


def default_backend() -> str:
    """The platform of this process's devices: ``'cpu'`` (simulated devices, or a CPU
    per rank) or ``'gpu'``, as ``jax.default_backend``.

    >>> spmd.default_backend()
    'cpu'
    """
    return local_devices()[0].platform


def clear_caches() -> None:
    """Drop every jitted function's traced programs and compiled code, as
    ``jax.clear_caches``: each traces and compiles again on its next call.

    spmd keeps no registry of its jitted functions (a jit's caches live on the
    function object and go with it), so this finds them among the live objects: a
    pass over the heap, fine for a call made between phases of a program.

    >>> f = spmd.jit(lambda x: x + 1); f(1.0)
    >>> spmd.clear_caches()     # f(1.0) traces again
    """
    for obj in gc.get_objects():
        # (the shard layer's eager-op jits are among them: their plans go too)
        if isinstance(obj, (Jit, JitFunction)):
            obj.clear_cache()


_scopes = threading.local()


def name_stack() -> str:
    """The names of the :func:`named_scope` blocks entered in this thread, outermost
    first, joined by ``/`` (``''`` outside every block).

    >>> with spmd.named_scope("block"), spmd.named_scope("attn"):
    ...     spmd.compilation.name_stack()
    'block/attn'
    """
    return "/".join(getattr(_scopes, "names", ()))


@contextlib.contextmanager
def named_scope(name: str):
    """Within the block, operations belong to the scope ``name`` (nested blocks join
    their names with ``/``), as ``jax.named_scope``.  spmd's printed programs and
    profiles do not show the names yet; the block changes nothing of the program, so
    code written with it traces, differentiates and runs as without it.

    >>> with spmd.named_scope("mlp"):
    ...     y = snp.tanh(x @ w)      # doctest: +SKIP
    """
    if not isinstance(name, str):
        # TypeError, as JAX raises (a wrong type, not a wrong value)
        raise TypeError(f"named_scope: name must be a str, got {name!r}")
    names = getattr(_scopes, "names", ())
    _scopes.names = names + (name,)
    try:
        yield
    finally:
        _scopes.names = names
