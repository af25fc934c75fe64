"""Propagation rules: how each primitive's output placements follow from its inputs'.

A rule is ``rule(pls, avals_in, avals_out, mesh, **params) -> (wanted, outs, params)``
or ``(wanted, outs, params, post)``: the placements the inputs must have (the
partitioner reshards them first), the placements of the outputs, the equation's
parameters for local shapes, and optionally ``post(outs, ctx) -> outs``, run on the
local results (e.g. the ``pmax`` finishing a max over a split dimension).
The rules are set on the primitives (``prim.partition``) by :func:`install`;
a primitive without a specific rule gets the replicating rule, which is always
correct (inputs gathered, every device computes the whole result).

Pending sums (``Placement.partial``) pass through linear maps: a rule may keep them
only where the map is linear in the operands carrying them (a replicated operand of
a jointly linear map such as ``add`` is masked to device 0 to join them).
"""

from __future__ import annotations

import itertools

import numpy as np

from spmd.compiler.primitives import PRIMITIVES
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.reshard import cost as reshard_cost

# Unary maps that commute with sums.
_LINEAR_UNARY = {"neg", "stop_gradient", "pvary", "convert_element_type", "real", "imag",
                 "conj"}
# Maps linear in all their operands together: f(sum x_i, sum y_i) = sum f(x_i, y_i).
_JOINT_LINEAR = {"add", "sub", "select_n"}


def _summable(aval) -> bool:
    """Only numbers can be pending sums (not bools)."""
    return aval.dtype.kind in "iufc"


def replicate_rule(pls, avals_in, avals_out, mesh, **params):
    """Everything replicated: correct for any primitive."""
    return ([Placement.replicated(len(a.shape)) for a in avals_in],
            [Placement.replicated(len(a.shape)) for a in avals_out], params)


def _score(pl: Placement) -> int:
    return len(pl.axes)


def joint_partial(pls, data, used=frozenset()) -> frozenset:
    """The pending sum a jointly linear map keeps: the one its operands ``data`` share
    (operands without it are masked), or none when they disagree or it meets ``used``."""
    ps = {pls[i].partial for i in data} - {frozenset()}
    if len(ps) != 1:
        return frozenset()
    p = next(iter(ps))
    return frozenset() if p & set(used) else p


def _product_partial(pls, data, used) -> list:
    """Per operand of a product: the pending sums it keeps.  Sums over disjoint axes
    multiply out ((sum_a x)(sum_b y) = sum_ab x_a y_b); overlapping ones are reduced."""
    kept, seen = [], set(used)
    for i in range(len(pls)):
        p = pls[i].partial if i in data else frozenset()
        if p and not (p & seen):
            kept.append(p)
            seen |= p
        else:
            kept.append(frozenset())
    return kept


def elementwise_rule(prim_name):
    def rule(pls, avals_in, avals_out, mesh, **params):
        nd = len(avals_out[0].shape)
        full = [i for i, a in enumerate(avals_in) if len(a.shape) == nd]
        # The most split operand decides: the others only slice (no communication).
        best = max(full, key=lambda i: (_score(pls[i]), -i))
        dims = pls[best].dims
        used = frozenset(pls[best].axes)
        data = list(range(1, len(pls))) if prim_name == "select_n" else list(range(len(pls)))
        keep = [frozenset()] * len(pls)
        if _summable(avals_out[0]):
            if prim_name in _LINEAR_UNARY:
                # A conversion keeps sums when it loses no precision (f16 -> f32).
                ok = prim_name != "convert_element_type" or (
                    avals_in[0].dtype.kind in "fc" and avals_out[0].dtype.kind in "fc" and
                    avals_out[0].dtype.itemsize >= avals_in[0].dtype.itemsize)
                if ok and not (pls[0].partial & used):
                    keep[0] = pls[0].partial
            elif prim_name in _JOINT_LINEAR and not (prim_name == "select_n"
                                                       and pls[0].partial):
                p = joint_partial(pls, data, used)
                for i in data:
                    keep[i] = p
            elif prim_name == "mul":
                keep = _product_partial(pls, data, used)
            elif prim_name == "div" and not pls[1].partial and not (pls[0].partial & used):
                keep[0] = pls[0].partial
        partial = frozenset().union(*keep)
        wanted = [Placement(dims if len(a.shape) == nd else ((),) * len(a.shape), k)
                  for a, k in zip(avals_in, keep)]
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
    """A split input dimension survives when it is the major part of an output
    dimension (or an output dimension is the major part of it) and the sizes divide."""
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


def _reduce_keep_rule(pls, avals_in, avals_out, mesh, *, axes, **params):
    """Reduced dimensions whole (gathered); the others keep their split."""
    (pl,) = pls
    dims = tuple(() if d in axes else a for d, a in enumerate(pl.dims))
    out = tuple(a for d, a in enumerate(dims) if d not in axes)
    return [Placement(dims)], [Placement(out)], {"axes": axes, **params}


def _extremum_rule(reduce_name):
    """max/min over a split dimension: reduce the local block, then ``pmax``/``pmin``
    the (smaller) result instead of gathering the operand."""
    def rule(pls, avals_in, avals_out, mesh, *, axes):
        from spmd.collectives import api as coll

        (pl,) = pls
        reduced = tuple(a for a in mesh.axis_names if any(a in pl.dims[d] for d in axes))
        out = tuple(a for d, a in enumerate(pl.dims) if d not in axes)
        if not reduced:
            return [Placement(pl.dims)], [Placement(out)], {"axes": axes}
        fn = coll.pmax if reduce_name == "reduce_max" else coll.pmin
        n = mesh.axis_size(reduced)

        def post(outs, ctx):
            (o,) = outs
            nbytes = int(np.prod(np.shape(o), dtype=np.int64)) * np.dtype(o.dtype).itemsize
            r = fn(o, reduced)
            ctx.note("pmax" if reduce_name == "reduce_max" else "pmin", r,
                     2 * nbytes * (n - 1) // n)
            return [r]

        return [Placement(pl.dims)], [Placement(out)], {"axes": axes}, post

    return rule


# ------------------------------------------------------------------ dot_general

def _dot_assign(order, prefer_rhs, groups, lhs, rhs, nl, nr):
    """Give each dimension group the axes of one operand, in ``order``, skipping axes
    already used; returns (lhs dims, rhs dims, contraction axes)."""
    used: set = set()
    ldims, rdims = [()] * nl, [()] * nr
    contracted: set = set()
    for kind in order:
        for i, j in groups[kind]:
            options = []
            if i is not None:
                options.append(lhs.dims[i])
            if j is not None:
                options.insert(1 if not prefer_rhs else 0, rhs.dims[j])
            axes = next((o for o in options if o and not (set(o) & used)), ())
            used |= set(axes)
            if i is not None:
                ldims[i] = axes
            if j is not None:
                rdims[j] = axes
            if kind == "c":
                contracted |= set(axes)
    return tuple(ldims), tuple(rdims), frozenset(contracted), frozenset(used)


def dot_general_rule(pls, avals_in, avals_out, mesh, *, dimension_numbers, **params):
    """Among the ways of keeping the operands' splits (batch, free and contracted
    dimensions; a split contracted dimension leaves a pending sum), take the one that
    uses the most devices, then the one whose inserted collectives (resharding the
    operands, reducing the pending sum) send the fewest bytes."""
    (lc, rc), (lb, rb) = dimension_numbers
    lhs, rhs = pls
    la, ra = avals_in
    lf = [i for i in range(len(la.shape)) if i not in lc and i not in lb]
    rf = [i for i in range(len(ra.shape)) if i not in rc and i not in rb]
    groups = {"b": list(zip(lb, rb)), "lf": [(i, None) for i in lf],
              "rf": [(None, j) for j in rf], "c": list(zip(lc, rc))}
    out_aval = avals_out[0]
    best, seen = None, set()
    for k, (order, prefer_rhs) in enumerate(itertools.product(
            itertools.permutations(("b", "lf", "rf", "c")), (False, True))):
        ldims, rdims, contracted, used = _dot_assign(order, prefer_rhs, groups, lhs, rhs,
                                                     len(la.shape), len(ra.shape))
        lp = lhs.partial if not (lhs.partial & used) else frozenset()
        rp = rhs.partial if not (rhs.partial & used) else frozenset()
        variants = [(lp, frozenset()), (frozenset(), rp)] if lp & rp else [(lp, rp)]
        for lp_, rp_ in variants:
            key = (ldims, rdims, lp_, rp_)
            if key in seen:
                continue
            seen.add(key)
            wl, wr = Placement(ldims, lp_), Placement(rdims, rp_)
            out = tuple(ldims[i] for i in lb) + tuple(ldims[i] for i in lf) + \
                tuple(rdims[j] for j in rf)
            opl = Placement(out, contracted | lp_ | rp_)
            devices = mesh.axis_size(tuple(used)) if used else 1
            sent = reshard_cost(la.shape, la.dtype.itemsize, lhs, wl, mesh) + \
                reshard_cost(ra.shape, ra.dtype.itemsize, rhs, wr, mesh) + \
                reshard_cost(out_aval.shape, out_aval.dtype.itemsize, opl,
                             opl.without_partial(), mesh)
            score = (-devices, sent, k)
            if best is None or score < best[0]:
                best = (score, wl, wr, opl)
    _, wl, wr, opl = best
    return [wl, wr], [opl], {"dimension_numbers": dimension_numbers, **params}


# ------------------------------------------------------------------ the table

def iota_rule(pls, avals_in, avals_out, mesh, **params):
    return [], [Placement.replicated(len(avals_out[0].shape))], params


def squeeze_rule(pls, avals_in, avals_out, mesh, *, dimensions):
    (pl,) = pls
    dims = tuple(() if d in dimensions else a for d, a in enumerate(pl.dims))
    out = tuple(a for d, a in enumerate(dims) if d not in dimensions)
    return [Placement(dims, pl.partial)], [Placement(out, pl.partial)], \
        {"dimensions": dimensions}


def _rules() -> dict:
    from spmd.shard.partition import rules_conv, rules_index as ri
    from spmd.shard.partition import rules_random as rr

    return {
        "broadcast_in_dim": broadcast_in_dim_rule,
        "reshape": reshape_rule,
        "transpose": transpose_rule,
        "reduce_sum": reduce_sum_rule,
        "reduce_max": _extremum_rule("reduce_max"),
        "reduce_min": _extremum_rule("reduce_min"),
        "reduce_prod": _reduce_keep_rule,
        "reduce_and": _reduce_keep_rule,
        "reduce_or": _reduce_keep_rule,
        "argmax": _reduce_keep_rule,
        "argmin": _reduce_keep_rule,
        "dot_general": dot_general_rule,
        "iota": iota_rule,
        "squeeze": squeeze_rule,
        **ri.RULES,
        **rr.RULES,
        **rules_conv.RULES,
    }


ELEMENTWISE = {
    "neg", "exp", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "sinh",
    "cosh", "asin", "acos", "atan", "sqrt", "rsqrt", "abs", "sign", "floor", "ceil", "round",
    "is_finite", "not", "add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "and",
    "or", "xor", "eq", "ne", "lt", "le", "gt", "ge", "select_n", "convert_element_type",
    "integer_pow", "stop_gradient", "pvary", "real", "imag", "conj", "clamp", "erf",
    "erf_inv", "lgamma", "digamma", "cbrt", "nextafter", "square", "exp2", "population_count",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "reduce_precision",
    "threefry2x32", "random_unit_float",
}

def _sources() -> dict:
    from spmd.shard.partition import rules_random as rr

    return rr.SOURCES


# Primitives without array operands of their output's shape that compute only the
# block wanted of them (see rules_random): name -> source(ev, eqn, vals, pls, spec).
SOURCES = _sources()

_installed = [0]


def install() -> None:
    """Give every registered primitive a partition rule (specific or replicating);
    cheap when no primitive was registered since the last call."""
    if _installed[0] == len(PRIMITIVES):
        return
    table = _rules()
    for name, prim in PRIMITIVES.items():
        if prim.partition is not None:
            continue
        if name in table:
            prim.def_partition(table[name])
        elif name in ELEMENTWISE:
            prim.def_partition(elementwise_rule(name))
        else:
            prim.def_partition(replicate_rule)
    _installed[0] = len(PRIMITIVES)
