"""Partition decision of the attention kernel's three primitives.

Attention maps over the batch and the heads: each batch element and query head reads
only its own key/value head.  So the batch dimension keeps its split, and the heads
keep theirs where the key/value heads can follow (as many as the query heads, or a
number the split divides: a device's query heads then read only its own key/value
heads; one key/value head is read whole by every device).  The sequence and head-size
dimensions are whole.  Where key/value heads (or a bias's broadcast batch or head
dimension) are whole while the query heads (or batch) are split, their cotangents
are a pending sum over those axes.

The same placements are the explicit-sharding types (``explicit_rule``).
"""

from __future__ import annotations

from typing import Callable

from spmd.compiler.ops import attention as at
from spmd.errors import ShardingTypeError
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import Propagate
from spmd.shard.partition.rules_explicit import RESHARD, show


def placements(prim, q_dims, avals_in, avals_out, mesh, params):
    """``(wanted, outs)``: the operands' placements and the results', from q's dims."""
    B, T, N, H = avals_in[0].shape
    K = avals_in[1].shape[2]
    b, n = q_dims[0], q_dims[2]
    size = mesh.axis_size(n) if n else 1
    if n and (N % size or (K != 1 and K % size)):
        n = ()  # the key/value heads cannot follow the query heads' split
    kn = n if K != 1 else ()
    bias = avals_in[3] if params["has_bias"] else None

    def of(kind, aval):
        if kind == "q":
            return Placement((b, (), n, ()))
        if kind == "kv":
            return Placement((b, (), kn, ()), frozenset(n) - frozenset(kn)
                             if aval is None else frozenset())
        if kind == "lse":
            return Placement((b, n, ()))
        shape = aval.shape
        return Placement((b if shape[0] == B else (), n if shape[1] == N else (), (), ()))

    ins_k, outs_k = at.layouts(prim, params)
    wanted = [of(k, a) for k, a in zip(ins_k, avals_in)]
    outs = []
    for k, a in zip(outs_k, avals_out):
        if k == "kv":  # a key/value cotangent: summed over the query heads' split
            outs.append(of("kv", None))
        elif k == "dbias":
            pl = of("bm", bias)
            # Summed over the splits of the dimensions the bias broadcasts along (not
            # where the bias has them whole: a dimension of size 1 everywhere).
            pending = (frozenset(b) if bias.shape[0] == 1 != B else frozenset()) | \
                (frozenset(n) if bias.shape[1] == 1 != N else frozenset())
            outs.append(Placement(pl.dims, pending))
        else:
            outs.append(of(k, a))
    return wanted, outs


def _rule(prim):
    def rule(pls, avals_in, avals_out, mesh, **params):
        wanted, outs = placements(prim, pls[0].dims, avals_in, avals_out, mesh, params)
        return wanted, outs, params
    rule.__name__ = f"{prim.name}_rule"
    return rule


def explicit_rule(prim) -> Callable:
    """The attention kernel's primitives: the batch and head dimensions keep their
    splits (the key/value heads following the query heads'); the others are whole."""
    def rule(avals_in, types_in, avals_out, mesh, params):
        wanted, outs = placements(prim, types_in[0].dims, avals_in, avals_out, mesh, params)
        for i, (w, t) in enumerate(zip(wanted, types_in)):
            if t.dims != w.dims:
                raise ShardingTypeError(
                    f"dot_product_attention: operand {i} is sharded {show(t)} where, with "
                    f"the query sharded {show(types_in[0])}, it must be {show(w)}: only the "
                    "batch and head dimensions may be split (query and key/value heads "
                    f"alike); {RESHARD}")
        if any(o.partial for o in outs):
            raise ShardingTypeError(
                "dot_product_attention: the key/value (or bias) cotangent would be a "
                "pending sum over the query heads' or batch's axes, which explicit mode "
                "does not type; split the key/value heads as the query heads, or "
                f"replicate the heads; {RESHARD}")
        return outs
    rule.__name__ = f"attention({prim.name})"
    return rule


TABLE = {p: Propagate(_rule(p), explicit=explicit_rule(p))
         for p in (at.attention_p, at.attention_tangent_p, at.attention_grad_p)}
