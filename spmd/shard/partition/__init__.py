"""The automatic partitioner behind ``jit(in_shardings=..., out_shardings=...)``."""

from spmd.shard.partition.api import sharding_constraint_p, with_sharding_constraint  # noqa: F401
from spmd.shard.partition.partitioner import PartitionError, partition  # noqa: F401
from spmd.shard.partition.reshard import GatherTooLargeError  # noqa: F401
from spmd.shard.partition import control, registry, rules, rules_attention  # noqa: E402
from spmd.shard.partition import rules_collectives, rules_conv, rules_index  # noqa: E402
from spmd.shard.partition import rules_linalg, rules_random  # noqa: E402
from spmd.shard.partition import partitioner as _partitioner  # noqa: E402

# Every module that declares partition decisions, each in its ``TABLE``.
DECLARING = (rules, rules_index, rules_linalg, rules_conv, rules_random, rules_attention,
             rules_collectives, control, _partitioner)


def register() -> None:
    """Fill the decision registry from every declaring module's ``TABLE`` (idempotent;
    :func:`spmd.shard.register` calls it, from the wiring in ``spmd/_install.py``).

    >>> from spmd.shard import partition
    >>> partition.register()          # again: nothing changes
    >>> from spmd.compiler.ops.elementwise import tanh_p
    >>> type(partition.registry.decision(tanh_p)).__name__
    'Propagate'
    """
    for module in DECLARING:
        registry.register_all(module.TABLE)
