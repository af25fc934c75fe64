"""Layer 3: collective primitives and the communication backends.

``primitives`` defines the collectives with their typing, transpose and
batching rules; ``local`` is the in-process backend (devices simulated
together); ``api`` is what ``spmd.lax`` exports.
"""

from spmd.collectives.api import (all_gather, all_gather_invariant, all_to_all,  # noqa: F401
                                  axis_index, axis_size, pcast, pmax, pmean, pmin, ppermute, psum, psum_scatter,
                                  pvary)
from spmd.collectives import api as _api  # noqa: E402
from spmd.compiler import extensions as _extensions  # noqa: E402


def register() -> None:
    """Fill the compiler's extension points this layer provides (the varying-axes
    casts and the summands of a sum); called once, by the wiring (``spmd/_install.py``).

    >>> from spmd.compiler import extensions
    >>> extensions.PVARY.installed_by
    'spmd.collectives.api'
    """
    _extensions.PVARY.install(_api.pvary_traced, by="spmd.collectives.api")
    _extensions.PREDUCED.install(_api.preduced_traced, by="spmd.collectives.api")
    _extensions.SUMMANDS.install(_api.as_summands, by="spmd.collectives.primitives")
