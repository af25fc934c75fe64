"""Layer 4: partition specs, shardings, sharded arrays, ``shard_map``."""

from spmd.shard.arrays.spec import NamedSharding, P, PartitionSpec  # noqa: F401
from spmd.shard.arrays.sharded import Shard, ShardedArray, SingleDeviceSharding  # noqa: F401
from spmd.shard.arrays.placing import (device_put, make_array_from_callback,  # noqa: F401
                              visualize_array_sharding)
from spmd.shard.maps.shard_map import shard_map  # noqa: F401
# The call path, which holds shard_map's execution rules (and fills EAGER_EVAL).
from spmd.shard.call import dispatch as _dispatch  # noqa: F401,E402

# The last line of the shard layer: fill the compiler's extension points (through the
# installer that spmd/__init__.py registered with the compiler, since this layer
# must not import the front end).  Every import that makes the mesh context usable
# passes here, so CONTEXT_KEY never stays at its default while a mesh can be set.
from spmd.compiler import extensions as _extensions  # noqa: E402

_extensions.run_installer()
