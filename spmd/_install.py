"""The one installer of the compiler's extension points.

The compiler declares what it needs from the layers above it
(:mod:`spmd.compiler.extensions`); this function, called once by
``spmd/__init__.py``, fills every point from the layer that provides it.  No
module fills a point when it is imported, so each layer can be loaded and
tested alone, and this file is where a reader finds the wiring.

>>> import spmd
>>> from spmd.compiler import extensions
>>> extensions.PVARY.installed_by
'spmd.collectives.api'
"""

from __future__ import annotations

from spmd.compiler import extensions


def install_extensions() -> None:
    """Fill every extension point of the compiler (idempotent)."""
    from spmd.collectives.api import pvary_traced
    from spmd.launch.platform import resolve_array_module
    from spmd.shard.fastcall import first_call
    from spmd.shard.mesh_context import get_mesh
    from spmd.shard.sharded import plain_sharding, plain_shards

    extensions.PVARY.install(pvary_traced, by="spmd.collectives.api")
    extensions.ARRAY_MODULE.install(resolve_array_module, by="spmd.launch.platform")
    extensions.CONTEXT_KEY.install(get_mesh, by="spmd.shard.mesh_context")
    extensions.PLAIN_SHARDING.install(plain_sharding, by="spmd.shard.sharded")
    extensions.PLAIN_SHARDS.install(plain_shards, by="spmd.shard.sharded")
    extensions.EAGER_CALL.install(first_call, by="spmd.shard.fastcall")
    left = [p.name for p in extensions.POINTS if p.installed_by is None]
    if left:  # a point declared without a line above
        raise RuntimeError(f"install_extensions: extension points left at their default: "
                           f"{left}; fill them here")
