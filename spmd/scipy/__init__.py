"""``spmd.scipy``: the parts of ``jax.scipy`` that programs use most (``special``,
``linalg``, ``stats.norm``), composed from ``spmd.numpy`` and ``spmd.lax``."""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.scipy import linalg, special, stats  # noqa: F401
