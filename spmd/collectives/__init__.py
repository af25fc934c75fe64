"""Layer 3: collective primitives and the communication backends.

``primitives`` defines the collectives with their typing, transpose and
batching rules; ``local`` is the in-process backend (devices simulated
together); ``api`` is what ``spmd.lax`` exports.
"""

from spmd.collectives.api import (all_gather, all_gather_invariant, all_to_all,  # noqa: F401
                                  axis_index, axis_size, pcast, pmax, pmean, pmin, ppermute, psum, psum_scatter,
                                  pvary)
