"""Layer 4: partition specs, shardings, sharded arrays, ``shard_map``.

Its folders: placed arrays (``arrays/``), the call path (``call/``), ``shard_map`` and
its kin (``maps/``), explicit sharding (``explicit/``) and the partitioner
(``partition/``).  What it provides to the layers below it fills in :func:`register`,
which the wiring (``spmd/_install.py``) calls.
"""

from spmd.compiler import extensions as _extensions
from spmd.shard.arrays.spec import NamedSharding, P, PartitionSpec  # noqa: F401
from spmd.shard.arrays.sharded import Shard, ShardedArray, SingleDeviceSharding  # noqa: F401
from spmd.shard.arrays.placing import (device_put, make_array_from_callback,  # noqa: F401
                                       visualize_array_sharding)
from spmd.shard.maps.shard_map import shard_map  # noqa: F401
from spmd.shard import partition as _partition
from spmd.shard.arrays import sharded as _sharded
from spmd.shard.call import dispatch as _dispatch
from spmd.shard.call import jit as _jit
from spmd.shard.call import tracebacks as _tracebacks
from spmd.shard.explicit import mesh_context as _mesh_context
from spmd.shard.arrays import memory as _memory
from spmd.mesh.devices import MEMORY_STATS as _MEMORY_STATS


def register() -> None:
    """Fill what this layer provides to the layers below: the compiler's extension
    points for the mesh context, placed values and eager evaluation, and the partition
    decisions.  Called once, by the wiring (``spmd/_install.py``).

    >>> from spmd.compiler import extensions
    >>> extensions.EAGER_EVAL.installed_by
    'spmd.shard.call.dispatch'
    """
    _extensions.CONTEXT_KEY.install(_mesh_context.context_key,
                                    by="spmd.shard.explicit.mesh_context")
    _extensions.PLAIN_SHARDING.install(_sharded.plain_sharding, by="spmd.shard.arrays.sharded")
    _extensions.PLAIN_SHARDS.install(_sharded.plain_shards, by="spmd.shard.arrays.sharded")
    _extensions.EAGER_EVAL.install(_dispatch.eval_primitive, by="spmd.shard.call.dispatch")
    _partition.register()
    _MEMORY_STATS[0] = _memory.stats
    _tracebacks.register(_jit.Jit.__call__)  # (its try is inline: the hot path)


# The last line of the shard layer: run the wiring (through the installer that
# spmd/__init__.py registered with the compiler, since this layer must not import the
# front end).  Every import that makes the mesh context usable passes here, so
# CONTEXT_KEY never stays at its default while a mesh can be set.
_extensions.run_installer()
