"""``spmd.parallel``: parallelism strategies written on ``shard_map`` and the collectives
(issue 29): pipelines (:func:`pipeline`, the GPipe schedule), context parallelism
(:func:`ring_attention`) and expert parallelism (:func:`moe`)."""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.parallel.moe import moe, moe_capacity  # noqa: F401
from spmd.parallel.pipeline import gpipe_bubble, pipeline  # noqa: F401
from spmd.parallel.ring_attention import (ring_attention, zigzag_order,  # noqa: F401
                                          zigzag_restore)

__all__ = ["gpipe_bubble", "moe", "moe_capacity", "pipeline", "ring_attention",
           "zigzag_order", "zigzag_restore"]

from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()
