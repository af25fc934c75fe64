"""The automatic partitioner behind ``jit(in_shardings=..., out_shardings=...)``."""

from spmd.shard.partition.api import sharding_constraint_p, with_sharding_constraint  # noqa: F401
from spmd.shard.partition.partitioner import PartitionError, partition  # noqa: F401
from spmd.shard.partition.reshard import GatherTooLargeError  # noqa: F401
