"""Layer 3: collective primitives and the communication backends.

``primitives`` defines the collectives with their typing, transpose and
batching rules; ``local`` is the in-process backend (devices simulated
together); ``api`` is what ``spmd.lax`` exports.
"""

from spmd.collectives.api import (all_gather, all_to_all, axis_index, axis_size,  # noqa: F401
                                  pcast, pmax, pmean, pmin, ppermute, psum, psum_scatter,
                                  pvary)
