"""``spmd.experimental``: the names JAX keeps under ``jax.experimental``.

- :func:`io_callback`: a host function with side effects inside transformed code
  (:mod:`spmd.host.callback`).

>>> from spmd.experimental import io_callback
"""

from __future__ import annotations

from spmd.host.callback import io_callback  # noqa: F401

__all__ = ["io_callback"]
