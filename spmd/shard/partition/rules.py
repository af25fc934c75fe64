"""Propagation rules: how each primitive's output placements follow from its inputs'.

A rule is ``rule(pls, avals_in, avals_out, mesh, **params) -> (wanted, outs, params)``
or ``(wanted, outs, params, post)``: the placements the inputs must have (the
partitioner reshards them first), the placements of the outputs, the equation's
parameters for local shapes, and optionally ``post(outs, ctx) -> outs``, run on the
local results (e.g. the ``pmax`` finishing a max over a split dimension).
Each primitive's decision (a rule, or an explicit replication with its reason) is
registered in :data:`TABLE` at the bottom, keyed by the primitive object
(:mod:`spmd.shard.partition.registry`); a primitive without one is an error.

Pending sums (``Placement.partial``) pass through linear maps: a rule may keep them
only where the map is linear in the operands carrying them (a replicated operand of
a jointly linear map such as ``add`` is masked to device 0 to join them).
"""

from __future__ import annotations

import itertools

import numpy as np

from spmd.compiler.transforms.ad import stop_gradient_p
from spmd.compiler.transforms.remat import name_p
from spmd.compiler.transforms.custom import custom_lin_p
from spmd.compiler.engine.fusion import fused_p
from spmd.compiler.engine.rows import fused_rows_p
from spmd.compiler.ops import complex as cx, elementwise as ew, reduce as rd, structural as st
from spmd.compiler.ops import cumulative as cm
from spmd.compiler.ops.linalg import dot_general_p
from spmd.shard.partition import rules_explicit as typed
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import Propagate, Replicate, Unreachable
from spmd.shard.partition.reshard import cost as reshard_cost
from spmd.collectives import api as coll

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


# How pending sums pass through an elementwise map (the ``sums`` of elementwise_rule):
_SUMS = {
    "none": "no pending sum passes (nonlinear maps, comparisons)",
    "linear": "unary and linear (neg): the operand's sum passes",
    "convert": "a dtype conversion: the sum passes when no precision is lost (f16 -> f32)",
    "joint": "linear in all operands together (add, sub): a shared sum passes",
    "select": "select_n: linear in the cases together when the predicate is not a sum",
    "product": "bilinear (mul): sums over disjoint axes multiply out",
    "quotient": "linear in the numerator (div): its sum passes over a whole denominator",
}
_ELEMENTWISE_RULES: dict = {}


def elementwise_rule(sums: str = "none"):
    """The rule of an elementwise map: the most split full-rank operand decides the
    split (the others only slice); ``sums`` (a key of ``_SUMS``) says which pending
    sums pass through.

    >>> rule = elementwise_rule("joint")   # add's rule
    """
    if sums not in _SUMS:
        raise ValueError(f"elementwise_rule: sums={sums!r} is not one of {sorted(_SUMS)}")
    if sums not in _ELEMENTWISE_RULES:
        _ELEMENTWISE_RULES[sums] = _make_elementwise_rule(sums)
    return _ELEMENTWISE_RULES[sums]


def _make_elementwise_rule(sums: str):
    def rule(pls, avals_in, avals_out, mesh, **params):
        nd = len(avals_out[0].shape)
        full = [i for i, a in enumerate(avals_in) if len(a.shape) == nd]
        # The most split operand decides: the others only slice (no communication).
        best = max(full, key=lambda i: (_score(pls[i]), -i))
        dims = pls[best].dims
        used = frozenset(pls[best].axes)
        data = list(range(1, len(pls))) if sums == "select" else list(range(len(pls)))
        keep = [frozenset()] * len(pls)
        if _summable(avals_out[0]):
            if sums in ("linear", "convert"):
                # A conversion keeps sums when it loses no precision (f16 -> f32).
                ok = sums != "convert" or (
                    avals_in[0].dtype.kind in "fc" and avals_out[0].dtype.kind in "fc" and
                    avals_out[0].dtype.itemsize >= avals_in[0].dtype.itemsize)
                if ok and not (pls[0].partial & used):
                    keep[0] = pls[0].partial
            elif sums == "joint" or (sums == "select" and not pls[0].partial):
                p = joint_partial(pls, data, used)
                for i in data:
                    keep[i] = p
            elif sums == "product":
                keep = _product_partial(pls, data, used)
            elif sums == "quotient" and not pls[1].partial and not (pls[0].partial & used):
                keep[0] = pls[0].partial
        partial = frozenset().union(*keep)
        wanted = [Placement(dims if len(a.shape) == nd else ((),) * len(a.shape), k)
                  for a, k in zip(avals_in, keep)]
        return wanted, [Placement(dims, partial) for _ in avals_out], params

    rule.__name__ = f"elementwise_rule_{sums}"
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

    rule.__name__ = f"{reduce_name}_rule"
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


# ------------------------------------------------------------------ the table

def elementwise(sums: str = "none", explicit=typed.broadcasting) -> Propagate:
    """The decision of an elementwise map: its rule, an input of the output's shape takes
    the output's spec, and its explicit types are the splits its operands agree on.

    >>> elementwise("joint").specs_flow_back   # add's decision
    True
    """
    return Propagate(elementwise_rule(sums), specs_flow_back=True, explicit=explicit)


def _table() -> dict:
    ops = [ew.exp_p, ew.log_p, ew.log1p_p, ew.expm1_p, ew.tanh_p, ew.logistic_p, ew.sin_p,
           ew.cos_p, ew.tan_p, ew.sinh_p, ew.cosh_p, ew.arcsin_p, ew.arccos_p, ew.arctan_p,
           ew.sqrt_p, ew.rsqrt_p, ew.abs_p, ew.sign_p, ew.floor_p, ew.ceil_p, ew.round_p,
           ew.is_finite_p, ew.not_p, ew.rem_p, ew.pow_p, ew.max_p, ew.min_p, ew.atan2_p,
           ew.and_p, ew.or_p, ew.xor_p, ew.eq_p, ew.ne_p, ew.lt_p, ew.le_p, ew.gt_p, ew.ge_p,
           ew.integer_pow_p]
    table = {p: elementwise("none") for p in ops}
    table.update({
        ew.neg_p: elementwise("linear"),
        stop_gradient_p: elementwise("linear"),
        name_p: elementwise("linear"),  # checkpoint_name: the identity
        ew.convert_p: elementwise("convert"),
        ew.add_p: elementwise("joint"),
        ew.sub_p: elementwise("joint"),
        ew.select_n_p: elementwise("select", typed.select),  # its cases must agree
        ew.mul_p: elementwise("product"),
        ew.div_p: elementwise("quotient"),
        # complex parts: linear over the reals, so partial sums pass through them
        cx.real_p: elementwise("linear"),
        cx.imag_p: elementwise("linear"),
        cx.conj_p: elementwise("linear"),
        cx.complex_p: elementwise("joint"),
        st.broadcast_in_dim_p: Propagate(broadcast_in_dim_rule),
        st.reshape_p: Propagate(reshape_rule, explicit=typed.reshape),
        st.transpose_p: Propagate(transpose_rule),
        st.squeeze_p: Propagate(squeeze_rule),
        st.iota_p: Propagate(iota_rule),
        rd.reduce_sum_p: Propagate(reduce_sum_rule),
        rd.reduce_max_p: Propagate(_extremum_rule("reduce_max")),
        rd.reduce_min_p: Propagate(_extremum_rule("reduce_min")),
        cm.reduce_prod_p: Propagate(_reduce_keep_rule),
        rd.reduce_and_p: Propagate(_reduce_keep_rule),
        rd.reduce_or_p: Propagate(_reduce_keep_rule),
        rd.argmax_p: Propagate(_reduce_keep_rule),
        rd.argmin_p: Propagate(_reduce_keep_rule),
        dot_general_p: Propagate(dot_general_rule, explicit=typed.dot_general),
        custom_lin_p: Replicate(
            "the linear part of a linearized custom_vjp function: an opaque Python backward "
            "rule over saved residuals, which no placement can be read from",
            explicit=typed.untyped),
        fused_p: Unreachable(
            "the fusion pass (spmd.compiler.engine.fusion) makes elementwise kernels out of "
            "per-device programs as they are compiled, after partitioning"),
        fused_rows_p: Unreachable(
            "the row-kernel pass (spmd.compiler.engine.rows) makes compiled loops out of "
            "per-device programs as they are compiled, after partitioning"),
    })
    return table


TABLE = _table()
