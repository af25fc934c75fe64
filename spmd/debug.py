"""``spmd.debug``: printing values, and calling host functions, from inside transformed
code (``jax.debug``).  The public path; the code is in :mod:`spmd.host.debug`."""

from spmd.host.debug import (callback, debug_print_p, effects_barrier,  # noqa: F401
                             print, visualize_array_sharding)
