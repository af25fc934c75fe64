"""Propagation rules: how each primitive's output placements follow from its inputs'.

A rule is ``rule(pls, avals_in, avals_out, mesh, **params) -> (wanted, outs, params)``:
the placements the inputs must have (the partitioner reshards them first), the
placements of the outputs, and the equation's parameters for local shapes.
The rules are set on the primitives (``prim.partition``) by :func:`install`;
a primitive without a specific rule gets the replicating rule, which is always
correct (inputs gathered, every device computes the whole result).
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.primitives import PRIMITIVES
from spmd.shard.partition.placement import Placement

_LINEAR_ELEMENTWISE = {"add", "sub", "neg", "convert_element_type", "select_n", "stop_gradient",
                       "pvary"}


def _local(shape, pl: Placement, mesh) -> tuple:
    return pl.local_shape(shape, mesh)


def replicate_rule(pls, avals_in, avals_out, mesh, **params):
    """Everything replicated: correct for any primitive."""
    return ([Placement.replicated(len(a.shape)) for a in avals_in],
            [Placement.replicated(len(a.shape)) for a in avals_out], params)


def _score(pl: Placement) -> int:
    return len(pl.axes)


def elementwise_rule(prim_name):
    def rule(pls, avals_in, avals_out, mesh, **params):
        full = [i for i, a in enumerate(avals_in) if a.shape != () or
                avals_out[0].shape == ()]
        if not full:
            return [p for p in pls], [Placement.replicated(len(avals_out[0].shape))], params
        # The most split operand decides: the others only slice (no communication).
        best = max(full, key=lambda i: (_score(pls[i]), -i))
        dims = pls[best].dims
        partials = {pls[i].partial for i in full}
        partial = frozenset()
        if len(partials) == 1 and next(iter(partials)):
            p = next(iter(partials))
            scalars_ok = all(not pls[i].partial for i in range(len(pls)) if i not in full)
            if prim_name in _LINEAR_ELEMENTWISE and scalars_ok and \
                    not (prim_name == "select_n" and pls[0].partial):
                partial = p
        elif prim_name in ("mul", "div") and len(full) == 2:
            a, b = (pls[i] for i in full)
            if a.partial and not b.partial and (prim_name == "mul" or full[0] == 0):
                partial = a.partial
            elif b.partial and not a.partial and prim_name == "mul":
                partial = b.partial
        wanted = []
        for i, (pl, av) in enumerate(zip(pls, avals_in)):
            if av.shape == () and avals_out[0].shape != ():
                wanted.append(Placement((), pl.partial & partial))
            else:
                wanted.append(Placement(dims, pl.partial & partial))
        return wanted, [Placement(dims, partial) for _ in avals_out], params

    return rule


def broadcast_in_dim_rule(pls, avals_in, avals_out, mesh, *, shape, broadcast_dimensions):
    (pl,), (av,) = pls, avals_in
    out = [()] * len(shape)
    in_dims = []
    for i, d in enumerate(broadcast_dimensions):
        if av.shape[i] == shape[d]:
            out[d] = pl.dims[i]
            in_dims.append(pl.dims[i])
        else:
            in_dims.append(())
    opl = Placement(tuple(out), pl.partial)
    return ([Placement(tuple(in_dims), pl.partial)], [opl],
            {"shape": opl.local_shape(shape, mesh), "broadcast_dimensions": broadcast_dimensions})


def reshape_rule(pls, avals_in, avals_out, mesh, *, new_sizes):
    (pl,), (av,) = pls, avals_in
    ins, outs = list(av.shape), list(new_sizes)
    out = [()] * len(outs)
    keep = [()] * len(ins)
    for d, axes in enumerate(pl.dims):
        if not axes:
            continue
        pre = int(np.prod(ins[:d], dtype=np.int64))
        n = mesh.axis_size(axes)
        for e in range(len(outs)):
            if int(np.prod(outs[:e], dtype=np.int64)) == pre and outs[e] % n == 0 and \
                    outs[e] > 1 and not out[e]:
                out[e] = axes
                keep[d] = axes
                break
    opl = Placement(tuple(out), pl.partial)
    return [Placement(tuple(keep), pl.partial)], [opl], {"new_sizes": opl.local_shape(
        new_sizes, mesh)}


def transpose_rule(pls, avals_in, avals_out, mesh, *, permutation):
    (pl,) = pls
    return [pl], [Placement(tuple(pl.dims[p] for p in permutation), pl.partial)], \
        {"permutation": permutation}


def reduce_sum_rule(pls, avals_in, avals_out, mesh, *, axes):
    (pl,) = pls
    summed = frozenset(a for d in axes for a in pl.dims[d])
    out = tuple(a for d, a in enumerate(pl.dims) if d not in axes)
    return [pl], [Placement(out, pl.partial | summed)], {"axes": axes}


def _unsplit_dims_rule(dims_of):
    """Dimensions named by ``dims_of(params, avals)`` must be whole; others keep
    their split, which the output inherits (for shape-preserving primitives)."""
    def rule(pls, avals_in, avals_out, mesh, **params):
        (pl,) = pls[:1]
        whole = set(dims_of(params, avals_in))
        dims = tuple(() if d in whole else a for d, a in enumerate(pl.dims))
        if len(avals_out[0].shape) != len(dims):
            return replicate_rule(pls, avals_in, avals_out, mesh, **params)
        wanted = [Placement(dims)] + [Placement.replicated(len(a.shape)) for a in avals_in[1:]]
        return wanted, [Placement(dims) for _ in avals_out], params

    return rule


def _reduce_keep_rule(pls, avals_in, avals_out, mesh, *, axes, **params):
    (pl,) = pls
    dims = tuple(() if d in axes else a for d, a in enumerate(pl.dims))
    out = tuple(a for d, a in enumerate(dims) if d not in axes)
    return [Placement(dims)], [Placement(out)], {"axes": axes, **params}


def dot_general_rule(pls, avals_in, avals_out, mesh, *, dimension_numbers, **params):
    (lc, rc), (lb, rb) = dimension_numbers
    lhs, rhs = pls
    la, ra = avals_in
    lf = [i for i in range(len(la.shape)) if i not in lc and i not in lb]
    rf = [i for i in range(len(ra.shape)) if i not in rc and i not in rb]
    used: set = set()
    ldims, rdims = [()] * len(la.shape), [()] * len(ra.shape)
    # Batch dimensions first (data parallelism), then free dims, then contraction.
    batch = []
    for i, j in zip(lb, rb):
        axes = lhs.dims[i] or rhs.dims[j]
        axes = axes if not (set(axes) & used) else ()
        used |= set(axes)
        ldims[i] = rdims[j] = axes
        batch.append(axes)
    for i in lf:
        axes = lhs.dims[i] if not (set(lhs.dims[i]) & used) else ()
        used |= set(axes)
        ldims[i] = axes
    for j in rf:
        axes = rhs.dims[j] if not (set(rhs.dims[j]) & used) else ()
        used |= set(axes)
        rdims[j] = axes
    partial = set()
    for i, j in zip(lc, rc):
        axes = lhs.dims[i] or rhs.dims[j]
        axes = axes if not (set(axes) & used) else ()
        used |= set(axes)
        ldims[i] = rdims[j] = axes
        partial |= set(axes)
    # A pending sum passes through one operand of a bilinear map, not both.
    lp, rp = lhs.partial, rhs.partial
    if lp and rp:
        rp = frozenset()
    if (lp | rp) & (used | partial):
        lp = rp = frozenset()
    out = tuple(batch) + tuple(ldims[i] for i in lf) + tuple(rdims[j] for j in rf)
    return ([Placement(tuple(ldims), lp), Placement(tuple(rdims), rp)],
            [Placement(out, frozenset(partial) | lp | rp)],
            {"dimension_numbers": dimension_numbers, **params})


def iota_rule(pls, avals_in, avals_out, mesh, **params):
    return [], [Placement.replicated(len(avals_out[0].shape))], params


def squeeze_rule(pls, avals_in, avals_out, mesh, *, dimensions):
    (pl,) = pls
    out = tuple(a for d, a in enumerate(pl.dims) if d not in dimensions)
    return [pl], [Placement(out, pl.partial)], {"dimensions": dimensions}


def concatenate_rule(pls, avals_in, avals_out, mesh, *, dimension):
    base = max(pls, key=_score)
    dims = tuple(() if d == dimension else a for d, a in enumerate(base.dims))
    pl = Placement(dims)
    return [pl] * len(pls), [pl], {"dimension": dimension}


def _whole(*names):
    return lambda params, avals: [d for n in names for d in _as_tuple(params.get(n))]


def _as_tuple(v):
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _changed_dims(params, avals):
    shape = avals[0].shape
    if "start_indices" in params:
        strides = params.get("strides") or (1,) * len(shape)
        return [d for d, (s, l, st) in enumerate(zip(params["start_indices"],
                                                      params["limit_indices"], strides))
                if (s, l, st) != (0, shape[d], 1)]
    return [d for d, (lo, hi, it) in enumerate(params["padding_config"]) if (lo, hi, it) !=
            (0, 0, 0)]


_RULES = {
    "broadcast_in_dim": broadcast_in_dim_rule,
    "reshape": reshape_rule,
    "transpose": transpose_rule,
    "reduce_sum": reduce_sum_rule,
    "reduce_max": _reduce_keep_rule,
    "reduce_min": _reduce_keep_rule,
    "reduce_prod": _reduce_keep_rule,
    "reduce_and": _reduce_keep_rule,
    "reduce_or": _reduce_keep_rule,
    "argmax": _reduce_keep_rule,
    "argmin": _reduce_keep_rule,
    "dot_general": dot_general_rule,
    "iota": iota_rule,
    "squeeze": squeeze_rule,
    "concatenate": concatenate_rule,
    "cumsum": _unsplit_dims_rule(_whole("axis")),
    "cumprod": _unsplit_dims_rule(_whole("axis")),
    "cummax": _unsplit_dims_rule(_whole("axis")),
    "cummin": _unsplit_dims_rule(_whole("axis")),
    "rev": _unsplit_dims_rule(_whole("dimensions")),
    "slice": _unsplit_dims_rule(_changed_dims),
}

ELEMENTWISE = {
    "neg", "exp", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "sinh",
    "cosh", "asin", "acos", "atan", "sqrt", "rsqrt", "abs", "sign", "floor", "ceil", "round",
    "is_finite", "not", "add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "and",
    "or", "xor", "eq", "ne", "lt", "le", "gt", "ge", "select_n", "convert_element_type",
    "integer_pow", "stop_gradient",
}


def install() -> None:
    """Give every registered primitive a partition rule (specific or replicating)."""
    for name, prim in PRIMITIVES.items():
        if prim.partition is not None:
            continue
        if name in _RULES:
            prim.def_partition(_RULES[name])
        elif name in ELEMENTWISE:
            prim.def_partition(elementwise_rule(name))
        else:
            prim.def_partition(replicate_rule)
