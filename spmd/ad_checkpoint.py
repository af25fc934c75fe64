"""``spmd.ad_checkpoint``: rematerialisation (as ``jax.ad_checkpoint``)."""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.compiler.transforms.remat import (checkpoint, checkpoint_name, checkpoint_policies,  # noqa: F401
                                 print_saved_residuals, remat, saved_residuals)

# A front end: fill the compiler's extension points and install the array methods
# (spmd/_install.py; spmd/__init__.py is lazy, so this may be the first spmd import).
from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()
