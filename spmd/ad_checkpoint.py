"""``spmd.ad_checkpoint``: rematerialisation (as ``jax.ad_checkpoint``)."""

from spmd.compiler.remat import (checkpoint, checkpoint_policies, remat,  # noqa: F401
                                 saved_residuals)
