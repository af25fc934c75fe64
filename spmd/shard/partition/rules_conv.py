"""Partition rule of ``conv_general_dilated`` (layout NC.../OI.../NC..., see
:mod:`spmd.compiler.ops.conv`): batch and feature splits, no spatial ones.

- the batch ``N`` split: each device convolves its examples (no communication);
- the output features ``O`` split (the kernel's first dimension): each device
  computes its output channels;
- the input features ``C`` split (``C`` of the input with ``I`` of the kernel):
  each device sums over its channels, leaving a pending sum over those axes;
- grouped convolutions (``feature_group_count = G``) split whole groups: ``C``
  and ``O`` over the same axes, whose size divides ``G``; each device runs
  ``G / size`` groups.

Spatial dimensions are gathered (a split would need halo exchanges).  Among the
choices keeping the operands' splits, the rule takes the one using the most
devices, then the one whose reshards send the fewest bytes.
"""

from __future__ import annotations

import itertools

from spmd.compiler.ops.conv import conv_p
from spmd.shard.partition import rules_explicit as typed
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import Propagate
from spmd.shard.partition.reshard import cost as reshard_cost


def _options(*dims):
    """Distinct candidate axis tuples (always including no split)."""
    out = []
    for d in dims + ((),):
        if d not in out:
            out.append(d)
    return out


def _candidates(lhs, rhs, G, B):
    """``(n, c, o, groups_split)`` tuples: the axes of the batch, input features and
    output features (for grouped convolutions ``c == o``, the groups' axes)."""
    ns = _options(lhs.dims[0]) if B == 1 else [()]
    if G == 1:
        for n, o, c in itertools.product(ns, _options(rhs.dims[0]),
                                         _options(lhs.dims[1], rhs.dims[1])):
            yield n, c, o, False
    else:
        for n, g in itertools.product(ns, _options(lhs.dims[1], rhs.dims[0])):
            yield n, g, g, True


def conv_rule(pls, avals_in, avals_out, mesh, *, feature_group_count, batch_group_count,
              **params):
    lhs, rhs = pls
    la, ra = avals_in
    (out_aval,) = avals_out
    G, B = feature_group_count, batch_group_count
    spatial = ((),) * (len(la.shape) - 2)
    best = None
    for k, (n, c, o, grouped) in enumerate(_candidates(lhs, rhs, G, B)):
        axes = [a for t in ((n, c) if grouped else (n, c, o)) for a in t]
        if len(set(axes)) != len(axes):
            continue
        size = mesh.axis_size(c) if c else 1
        if grouped and G % size:
            continue
        wl = Placement((n, c) + spatial)
        wr = Placement((o, () if grouped else c) + spatial)
        partial = frozenset() if grouped else frozenset(c)
        opl = Placement((n, o) + spatial, partial)
        devices = mesh.axis_size(tuple(axes)) if axes else 1
        sent = reshard_cost(la.shape, la.dtype.itemsize, lhs, wl, mesh) + \
            reshard_cost(ra.shape, ra.dtype.itemsize, rhs, wr, mesh) + \
            reshard_cost(out_aval.shape, out_aval.dtype.itemsize, opl, opl.without_partial(),
                         mesh)
        score = (-devices, sent, k)
        if best is None or score < best[0]:
            local_g = G // size if grouped else G
            best = (score, wl, wr, opl, local_g)
    _, wl, wr, opl, local_g = best
    return [wl, wr], [opl], {**params, "feature_group_count": local_g,
                             "batch_group_count": B}


# Explicit mode types a convolution only whole (a typed split is not yet declared).
TABLE = {conv_p: Propagate(conv_rule, explicit=typed.whole_only("conv_general_dilated"))}
