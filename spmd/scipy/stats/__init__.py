"""``spmd.scipy.stats``: distributions' densities (as ``jax.scipy.stats``)."""

from spmd.scipy.stats import norm  # noqa: F401
