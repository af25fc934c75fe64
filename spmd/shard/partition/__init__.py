"""The automatic partitioner behind ``jit(in_shardings=..., out_shardings=...)``."""

from spmd.compiler import trace as _trace
from spmd.shard.partition.api import (PartitionedJit, sharding_constraint_p,  # noqa: F401
                                      with_sharding_constraint)
from spmd.shard.partition.eager import run_sharded as _run_sharded
from spmd.shard.partition.partitioner import PartitionError, partition  # noqa: F401
from spmd.shard.partition.reshard import GatherTooLargeError  # noqa: F401

# Eager operations on sharded Arrays run through the partitioner.
_trace._sharded_eager_hook[0] = _run_sharded
