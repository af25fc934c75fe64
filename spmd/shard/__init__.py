from spmd.shard.shard_map import shard_map  # noqa: F401
