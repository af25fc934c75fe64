"""Partitioning control flow: ``cond``, ``while`` and ``scan`` keep their operands'
splits through their bodies.

Each body is partitioned like the outer program (its own per-device program, traced
at local shapes, collectives inside where its rules need them).  A loop carry must
have one placement on entry and on every iteration's exit: starting from the
initial placements, the body is probed and each carry's placement reduced to what
the entry and the exit share (the common prefix of each dimension's axes, the
pending sum only where both hold it) until nothing changes; the body is then traced
once more, resharding its carries to that fixed point.  ``cond`` branches agree on
their outputs' placements the same way; the branch index and a ``while``'s
predicate are replicated, so every device takes the same branch and runs the same
number of iterations (collectives inside stay matched).  A ``scan``'s stacked
dimension is whole; its other dimensions keep their splits.
"""

from __future__ import annotations

from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.ops.control_cond import cond_p
from spmd.compiler.ops.control_programs import trace_closed
from spmd.compiler.ops.control_scan import scan_p
from spmd.compiler.ops.control_while import while_p
from spmd.compiler.core.trace import bind
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import Structural
from spmd.shard.partition.reshard import Context, plan, reshard


def _prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return tuple(a[:n])


def join(a: Placement, b: Placement) -> Placement:
    """The placement two others share (never more split than either)."""
    return Placement(tuple(_prefix(x, y) for x, y in zip(a.dims, b.dims)),
                     a.partial & b.partial)


def _local_aval(aval, pl, mesh):
    # Untyped, as the partitioned program (a partial-manual body's types are dropped).
    return aval.update(shape=pl.local_shape(aval.shape, mesh), vma=frozenset(),
                       reduced=frozenset())


def _trace_body(ev, closed: ClosedProgram, in_pls, out_target, ctx, box):
    """Partition ``closed`` (global) at local shapes given its inputs' placements.

    ``out_target``: per output a placement to reshard it to, or None to keep the one
    propagation gives; ``box`` receives the output placements."""
    from spmd.shard.partition.partitioner import Evaluator

    n = len(closed.consts)
    in_vars = closed.program.in_vars[n:]
    avals = [_local_aval(v.aval, pl, ev.mesh) for v, pl in zip(in_vars, in_pls)]

    def fun(*xs):
        inner = Evaluator(ev.mesh, ctx, manual=ev.manual)
        outs = inner.run(closed, list(zip(xs, in_pls)))
        res, pls = [], []
        for k, ((x, pl), want) in enumerate(zip(outs, out_target)):
            if want is not None and want != pl:
                ctx.reason = f"a carry or branch output {k} of a loop or cond"
                x = reshard(x, pl, want, ctx, f"output {k} of a control-flow body")
                pl = want
            res.append(x)
            pls.append(pl)
        box[:] = pls
        return res

    return trace_closed(fun, avals)


def _probe(ev, closed, in_pls):
    """The natural output placements of a body (its trace and notes are dropped)."""
    box: list = []
    _trace_body(ev, closed, in_pls, [None] * len(closed.out_avals),
                Context(ev.mesh, ev.ctx.forbid_gather_bytes), box)
    return box


def _free(src: Placement, dst: Placement, mesh) -> bool:
    """Whether going from ``src`` to ``dst`` needs no communication (slices, masks)."""
    return all(s.kind in ("slice", "mask") for s in plan(src, dst, (1,) * len(src.dims), 1,
                                                          mesh))


def _reshard_all(ev, vals, pls, wanted, what):
    return [reshard(x, p, w, ev.ctx, what) for x, p, w in zip(vals, pls, wanted)]


def _fixed_point(ev, body, fixed_pls, carry_pls, n_carry, after=()):
    """Carry placements that a body maps to themselves (up to resharding); the body's
    inputs are ``fixed_pls``, the carries, then ``after``."""
    carry_pls = list(carry_pls)
    # A body that splits its carries further (or leaves them as pending sums) without
    # needing communication to enter that state: try that placement first.
    out = _probe(ev, body, list(fixed_pls) + carry_pls + list(after))[:n_carry]
    raised = [o if _free(c, o, ev.mesh) else c for c, o in zip(carry_pls, out)]
    if raised != carry_pls:
        again = _probe(ev, body, list(fixed_pls) + raised + list(after))[:n_carry]
        if again == raised:
            return raised
    for _ in range(64):
        out = _probe(ev, body, list(fixed_pls) + carry_pls + list(after))[:n_carry]
        new = [join(c, o) for c, o in zip(carry_pls, out)]
        if new == carry_pls:
            return carry_pls
        carry_pls = new
    return [Placement.replicated(len(p.dims)) for p in carry_pls]


def _keeping_reason(fn):
    """``fn`` as a Structural decision's function; the evaluator's current reason (the
    equation being partitioned) survives the bodies' equations."""
    def partition(ev, eqn, vals, pls):
        reason = ev.ctx.reason
        outs = fn(ev, eqn, vals, pls)
        ev.ctx.reason = reason
        return outs

    partition.__name__ = f"partition{fn.__name__}"
    return partition


def _cond(ev, eqn, vals, pls):
    branches = eqn.params["branches"]
    idx = reshard(vals[0], pls[0], Placement(()), ev.ctx, "the branch index of cond")
    ops, op_pls = vals[1:], pls[1:]
    natural = [_probe(ev, br, op_pls) for br in branches]
    target = natural[0]
    for other in natural[1:]:
        target = [join(a, b) for a, b in zip(target, other)]
    local = []
    for br in branches:
        box: list = []
        local.append(_trace_body(ev, br, op_pls, target, ev.ctx, box))
    outs = bind(eqn.primitive, idx, *ops, branches=tuple(local))
    return list(zip(outs, target))


def _while(ev, eqn, vals, pls):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cc, bc, carry = vals[:nc], vals[nc:nc + nb], vals[nc + nb:]
    cc_pls, bc_pls, carry_pls = pls[:nc], pls[nc:nc + nb], pls[nc + nb:]
    body, cond = p["body_program"], p["cond_program"]
    fixed = _fixed_point(ev, body, bc_pls, carry_pls, len(carry))
    carry = _reshard_all(ev, carry, carry_pls, fixed, "an initial carry of while")
    box: list = []
    local_body = _trace_body(ev, body, list(bc_pls) + fixed, fixed, ev.ctx, box)
    local_cond = _trace_body(ev, cond, list(cc_pls) + fixed, [Placement(())], ev.ctx, box)
    outs = bind(eqn.primitive, *cc, *bc, *carry, cond_program=local_cond,
                body_program=local_body, cond_nconsts=nc, body_nconsts=nb)
    return list(zip(outs, fixed))


def _scan(ev, eqn, vals, pls):
    p = eqn.params
    nc, ncar = p["num_consts"], p["num_carry"]
    consts, carry, xs = vals[:nc], vals[nc:nc + ncar], vals[nc + ncar:]
    c_pls, carry_pls, x_pls = pls[:nc], pls[nc:nc + ncar], pls[nc + ncar:]
    # The scanned dimension is whole; each slice keeps the other dimensions' splits.
    x_want = [Placement(((),) + tuple(pl.dims[1:]), pl.partial) for pl in x_pls]
    xs = _reshard_all(ev, xs, x_pls, x_want, "an xs operand of scan")
    slice_pls = [Placement(tuple(pl.dims[1:]), pl.partial) for pl in x_want]
    body = p["program"]
    fixed = _fixed_point(ev, body, list(c_pls), carry_pls, ncar, slice_pls)
    carry = _reshard_all(ev, carry, carry_pls, fixed, "an initial carry of scan")
    box: list = []
    n_y = len(body.out_avals) - ncar
    first = len(ev.ctx.notes)
    local = _trace_body(ev, body, list(c_pls) + fixed + slice_pls, fixed + [None] * n_y,
                        ev.ctx, box)
    # The body's collectives run once per iteration.
    ev.ctx.notes[first:] = [n._replace(bytes_sent=n.bytes_sent * p["length"],
                                       reason=f"{n.reason} (x{p['length']} in scan)")
                            for n in ev.ctx.notes[first:]]
    outs = bind(eqn.primitive, *consts, *carry, *xs, program=local, num_consts=nc,
                num_carry=ncar, length=p["length"], reverse=p["reverse"])
    y_pls = [Placement(((),) + tuple(pl.dims), pl.partial) for pl in box[ncar:]]
    return list(zip(outs, fixed + y_pls))


TABLE = {
    cond_p: Structural(_keeping_reason(_cond)),
    while_p: Structural(_keeping_reason(_while)),
    scan_p: Structural(_keeping_reason(_scan)),
}
