"""Layer 4: partition specs, shardings, sharded arrays, ``shard_map``."""

from spmd.shard.spec import NamedSharding, P, PartitionSpec  # noqa: F401
from spmd.shard.array import (Shard, SingleDeviceSharding, device_put,  # noqa: F401
                              make_array_from_callback, visualize_array_sharding)
from spmd.shard.shard_map import shard_map  # noqa: F401
