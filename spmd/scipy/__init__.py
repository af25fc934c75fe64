"""``spmd.scipy``: the parts of ``jax.scipy`` that programs use most (``special``,
``linalg``, ``stats.norm``), composed from ``spmd.numpy`` and ``spmd.lax``."""

from spmd.scipy import linalg, special, stats  # noqa: F401
