"""Partition decisions of the matrix factorizations and special functions.

The factorizations (``cholesky``, ``linalg_solve``, ``slogdet``, ``qr``, ``eigh``,
``svd``) act on the trailing two dimensions of their first operand and map
over the leading (batch) dimensions: a batch dimension keeps its split, the
matrix dimensions are gathered (a factorization couples every element of its
matrix).  Where the operands' or results' leading dimensions are not that batch
(``solve`` with a broadcast right-hand side), everything is computed whole.

The special functions (``erf``, ``erf_inv``, ``lgamma``, ``digamma``,
``polygamma``) are elementwise.
"""

from __future__ import annotations

from spmd.compiler.ops import linalg_decomp as ld
from spmd.compiler.ops import special as sp
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import Propagate
from spmd.shard.partition import rules_explicit as typed
from spmd.shard.partition.rules import elementwise, replicate_rule


def batched_matrix_rule(pls, avals_in, avals_out, mesh, **params):
    """Split only the batch dimensions (all but the trailing two of operand 0)."""
    batch_shape = tuple(avals_in[0].shape[:-2])
    nb = len(batch_shape)
    if nb == 0 or any(tuple(a.shape[:nb]) != batch_shape for a in (*avals_in, *avals_out)):
        return replicate_rule(pls, avals_in, avals_out, mesh, **params)
    dims = tuple(pls[0].dims[:nb])
    wanted = [Placement(dims + ((),) * (len(a.shape) - nb)) for a in avals_in]
    outs = [Placement(dims + ((),) * (len(a.shape) - nb)) for a in avals_out]
    return wanted, outs, params


# Explicit mode types them only whole (a typed batch split is not yet declared).
TABLE = {
    **{p: Propagate(batched_matrix_rule, explicit=typed.whole_only(p.name))
       for p in (ld.cholesky_p, ld.solve_p, ld.slogdet_p, ld.qr_p, ld.eigh_p, ld.svd_p)},
    **{p: elementwise("none")
       for p in (sp.erf_p, sp.erfc_p, sp.erf_inv_p, sp.lgamma_p, sp.digamma_p,
                 sp.polygamma_p)},
}
