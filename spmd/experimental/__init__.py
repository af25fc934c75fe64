"""``spmd.experimental``: the names JAX keeps under ``jax.experimental``.

- :func:`io_callback`: a host function with side effects inside transformed code
  (:mod:`spmd.host.callback`).
- :mod:`spmd.experimental.mesh_utils`: ``create_device_mesh``,
  ``create_hybrid_device_mesh``.
- :mod:`spmd.experimental.shard_map`: the older ``shard_map`` path and signature
  (``check_rep=``, ``auto=``).
- :mod:`spmd.experimental.multihost_utils`: ``process_allgather``,
  ``broadcast_one_to_all``, ``sync_global_devices``.

>>> from spmd.experimental import io_callback, mesh_utils, multihost_utils
>>> from spmd.experimental.shard_map import shard_map
"""

from __future__ import annotations

from spmd.host.callback import io_callback  # noqa: F401
from spmd.experimental import mesh_utils, multihost_utils, shard_map  # noqa: F401

__all__ = ["io_callback", "mesh_utils", "multihost_utils", "shard_map"]
