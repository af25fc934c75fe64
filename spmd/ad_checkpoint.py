"""``spmd.ad_checkpoint``: rematerialisation (as ``jax.ad_checkpoint``)."""

from spmd.compiler.remat import (checkpoint, checkpoint_name, checkpoint_policies,  # noqa: F401
                                 print_saved_residuals, remat, saved_residuals)
