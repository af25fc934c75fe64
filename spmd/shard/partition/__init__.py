"""The automatic partitioner behind ``jit(in_shardings=..., out_shardings=...)``."""

from spmd.shard.partition.api import (PartitionedJit, sharding_constraint_p,  # noqa: F401
                                      with_sharding_constraint)
from spmd.shard.partition.partitioner import PartitionError, partition  # noqa: F401
from spmd.shard.partition.reshard import GatherTooLargeError  # noqa: F401
