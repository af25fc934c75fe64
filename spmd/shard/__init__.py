"""Layer 4: partition specs, shardings, sharded arrays, ``shard_map``."""

from spmd.shard.spec import NamedSharding, P, PartitionSpec  # noqa: F401
from spmd.shard.sharded import Shard, ShardedArray, SingleDeviceSharding  # noqa: F401
from spmd.shard.array import (device_put, make_array_from_callback,  # noqa: F401
                              visualize_array_sharding)
from spmd.shard.shard_map import shard_map  # noqa: F401
