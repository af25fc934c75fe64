"""Propagation rules for slicing, indexing, padding, concatenation and sorting.

The common pattern: dimensions the primitive reads across (sliced, padded, indexed,
sorted, scanned) must be whole on each device; every other dimension keeps its
split, which the output inherits.  Parameters naming sizes of split dimensions are
rewritten for the local block.
"""

from __future__ import annotations

from spmd.compiler.ops import indexing as ix
from spmd.compiler.ops import cumulative as cm
from spmd.compiler.ops import slicing as sm
from spmd.compiler.ops.sort import sort_p
from spmd.shard.partition import rules_explicit as typed
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import Propagate
from spmd.shard.partition.rules import _score, joint_partial, replicate_rule


def _keep_except(pl: Placement, whole) -> tuple:
    return tuple(() if d in whole else a for d, a in enumerate(pl.dims))


def _axes_of(dims) -> frozenset:
    return frozenset(a for d in dims for a in d)


def _unsplit_dims_rule(dims_of, linear: bool):
    """Dimensions named by ``dims_of(params, avals)`` must be whole; the others keep
    their split, which the output inherits (shape-preserving primitives, one operand
    plus replicated scalars).  ``linear``: a pending sum passes through."""
    def rule(pls, avals_in, avals_out, mesh, **params):
        pl = pls[0]
        if len(avals_out[0].shape) != len(pl.dims):
            return replicate_rule(pls, avals_in, avals_out, mesh, **params)
        dims = _keep_except(pl, set(dims_of(params, avals_in)))
        p = pl.partial if linear and not (pl.partial & _axes_of(dims)) else frozenset()
        wanted = [Placement(dims, p)] + [Placement.replicated(len(a.shape))
                                         for a in avals_in[1:]]
        return wanted, [Placement(dims, p) for _ in avals_out], params

    return rule


def _whole(*names):
    return lambda params, avals: [d for n in names for d in _as_tuple(params.get(n))]


def _as_tuple(v):
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def slice_rule(pls, avals_in, avals_out, mesh, *, start_indices, limit_indices, strides):
    """Sliced dimensions whole; dimensions taken entirely keep their split."""
    (pl,), (av,) = pls, avals_in
    st = strides or (1,) * len(av.shape)
    whole = {d for d, (s, e, k) in enumerate(zip(start_indices, limit_indices, st))
             if (s, e, k) != (0, av.shape[d], 1)}
    dims = _keep_except(pl, whole)
    opl = Placement(dims, pl.partial)
    local = opl.local_shape(av.shape, mesh)
    limits = tuple(local[d] if dims[d] else e for d, e in enumerate(limit_indices))
    return [opl], [opl], {"start_indices": start_indices, "limit_indices": limits,
                          "strides": strides}


def pad_rule(pls, avals_in, avals_out, mesh, *, padding_config):
    """Padded dimensions whole; a pending sum passes when the padding value shares it."""
    pl = pls[0]
    whole = {d for d, c in enumerate(padding_config) if tuple(c) != (0, 0, 0)}
    dims = _keep_except(pl, whole)
    p = joint_partial(pls, [0, 1], _axes_of(dims))
    return [Placement(dims, p), Placement((), p)], [Placement(dims, p)], \
        {"padding_config": padding_config}


def concatenate_rule(pls, avals_in, avals_out, mesh, *, dimension):
    base = max(pls, key=_score)
    dims = _keep_except(base, {dimension})
    p = joint_partial(pls, range(len(pls)), _axes_of(dims))
    pl = Placement(dims, p)
    return [pl] * len(pls), [pl], {"dimension": dimension}


def sort_rule(pls, avals_in, avals_out, mesh, *, dimension, **params):
    """Sorted along one dimension: it is whole; the others keep the most split operand's."""
    dims = _keep_except(max(pls, key=_score), {dimension})
    return [Placement(dims)] * len(pls), [Placement(dims)] * len(avals_out), \
        {"dimension": dimension, **params}


def dynamic_slice_rule(pls, avals_in, avals_out, mesh, *, slice_sizes):
    """Dimensions taken entirely keep their split (the start is clamped to 0 there,
    globally and locally); the others are whole.  Starts are replicated scalars."""
    pl, av = pls[0], avals_in[0]
    whole = {d for d, s in enumerate(slice_sizes) if s != av.shape[d]}
    dims = _keep_except(pl, whole)
    opl = Placement(dims, pl.partial)
    return [opl] + [Placement(())] * (len(pls) - 1), [opl], \
        {"slice_sizes": opl.local_shape(slice_sizes, mesh)}


def dynamic_update_slice_rule(pls, avals_in, avals_out, mesh):
    """Dimensions the update covers entirely keep the operand's split (on both)."""
    x, u = avals_in[:2]
    base = pls[0] if _score(pls[0]) >= _score(pls[1]) else pls[1]
    dims = tuple(a if x.shape[d] == u.shape[d] else () for d, a in enumerate(base.dims))
    p = joint_partial(pls, [0, 1], _axes_of(dims))
    return [Placement(dims, p), Placement(dims, p)] + [Placement(())] * (len(pls) - 2), \
        [Placement(dims, p)], {}


def gather_rule(pls, avals_in, avals_out, mesh, *, axes, mode, fill_value):
    """Indexed dimensions whole; the index arrays' split becomes the leading (batch)
    dimensions of the result, the operand's other dimensions keep theirs."""
    x, idx = pls[0], pls[1:]
    bdims = max(idx, key=_score).dims
    used = set(_axes_of(bdims))
    rest = []
    for d, a in enumerate(x.dims):
        if d in axes:
            continue
        a = a if not (set(a) & used) else ()
        used |= set(a)
        rest.append(a)
    it = iter(rest)
    xdims = tuple(() if d in axes else next(it) for d in range(len(x.dims)))
    linear = fill_value in (None, 0) or mode == "clip"
    p = x.partial if linear and not (x.partial & used) else frozenset()
    return [Placement(xdims, p)] + [Placement(bdims)] * len(idx), \
        [Placement(tuple(bdims) + tuple(rest), p)], \
        {"axes": axes, "mode": mode, "fill_value": fill_value}


def scatter_rule(pls, avals_in, avals_out, mesh, *, axes, mode):
    """Indexed dimensions whole, the others keep the operand's split (the updates'
    trailing dimensions follow it).  An ``add`` scatter may keep its updates' batch
    dimensions split: each device adds its own updates, leaving a pending sum over
    those axes (the operand joins it, masked to device 0)."""
    x, u, idx = pls[0], pls[1], pls[2:]
    xa, ua = avals_in[:2]
    nb = len(ua.shape) - (len(xa.shape) - len(axes))
    xdims = _keep_except(x, set(axes))
    rest = tuple(a for d, a in enumerate(xdims) if d not in axes)
    used = _axes_of(xdims)
    bdims = ((),) * nb
    if mode == "add":
        cand = max([Placement(u.dims[:nb])] + [Placement(i.dims) for i in idx], key=_score)
        if not (_axes_of(cand.dims) & used):
            bdims = tuple(cand.dims)
    baxes = _axes_of(bdims)
    p = frozenset()
    if mode in ("add", "set"):
        p = joint_partial(pls, [0, 1], used | baxes)
    if baxes:
        if x.partial - p or u.partial - p:  # other pending sums: reduce them first
            p = frozenset()
        p_out = p | baxes
        return ([Placement(xdims, p_out), Placement(bdims + rest, p)] +
                [Placement(bdims)] * len(idx), [Placement(xdims, p_out)],
                {"axes": axes, "mode": mode})
    return ([Placement(xdims, p), Placement(bdims + rest, p)] +
            [Placement.replicated(nb)] * len(idx), [Placement(xdims, p)],
            {"axes": axes, "mode": mode})


_KEEP = typed.same_as_operand  # explicit: the operand's type, while its axes divide
_INTO = typed.operand_only      # explicit: an update into the first operand keeps its type

TABLE = {
    sm.slice_p: Propagate(slice_rule, explicit=_KEEP),
    sm.pad_p: Propagate(pad_rule, explicit=_KEEP),
    sm.concatenate_p: Propagate(concatenate_rule, explicit=typed.concatenate),
    sort_p: Propagate(sort_rule, explicit=_KEEP),
    ix.dynamic_slice_p: Propagate(dynamic_slice_rule, explicit=_KEEP),
    ix.dynamic_update_slice_p: Propagate(dynamic_update_slice_rule, explicit=_INTO),
    ix.gather_p: Propagate(gather_rule, explicit=typed.gather),
    ix.scatter_p: Propagate(scatter_rule, explicit=_INTO),
    cm.cumsum_p: Propagate(_unsplit_dims_rule(_whole("axis"), linear=True), explicit=_KEEP),
    cm.cumprod_p: Propagate(_unsplit_dims_rule(_whole("axis"), linear=False), explicit=_KEEP),
    cm.cummax_p: Propagate(_unsplit_dims_rule(_whole("axis"), linear=False), explicit=_KEEP),
    cm.cummin_p: Propagate(_unsplit_dims_rule(_whole("axis"), linear=False), explicit=_KEEP),
    sm.rev_p: Propagate(_unsplit_dims_rule(_whole("dimensions"), linear=True), explicit=_KEEP),
}
