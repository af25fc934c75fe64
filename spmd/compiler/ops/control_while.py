"""Control flow: the ``while`` primitive.

``while`` operands are ``cond consts, body consts, init carries``; it applies the
body program to the carries while the cond program returns True, and its results
are the final carries.  As ``scan`` (:mod:`spmd.compiler.ops.control_scan`), the
implementation runs the compiled body in a Python loop
(:mod:`spmd.compiler.ops.loop_runs`), and the rules that change which carries hold
tangents, a batch axis, unknown values or varying mesh axes iterate to a fixed
point.  Reverse mode does not go through a while loop (the number of iterations is
not known when it is traced); forward mode does.
"""

from __future__ import annotations

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import instantiate
from spmd.compiler.core.avals import tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Program, Var
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.manual_types import ManualTypeError
from spmd.compiler.core.program_vma import program_types, program_vma
from spmd.compiler.core.trace import eval_program, get_aval
from spmd.compiler.ops import elementwise, loop_runs, reduce, structural
from spmd.compiler.ops.control_programs import (batch_program, carry_fixpoint, cast_to,
                                                check_avals, dce_closed, drop_inputs,
                                                has_tangent, interleave_order, jvp_program,
                                                or_each, permute, split_groups, trace_closed,
                                                zero_tangent)
from spmd.errors import ArgumentError, ProgramTypeError
# A module, not names: batching imports spmd.compiler.ops, so importing it first loads
# this module while batching is half made.
from spmd.compiler.transforms import batching


while_p = Primitive("while", traits=(), multiple_results=True, higher_order=True)


def while_bind(*args, cond_program, body_program, cond_nconsts, body_nconsts):
    return while_p.bind(*args, cond_program=cond_program, body_program=body_program,
                        cond_nconsts=int(cond_nconsts), body_nconsts=int(body_nconsts))


@while_p.def_impl
def _while_impl(xp, *args, cond_program, body_program, cond_nconsts, body_nconsts):
    run = loop_runs.while_runner(xp, cond_program, body_program, cond_nconsts,
                                 body_nconsts)[0]
    return run(*args)


def _while_donated(xp, donated, *, cond_program, body_program, cond_nconsts, body_nconsts):
    """The while loop with the initial carries at ``donated`` handed over (see
    ``control_scan._scan_donated``)."""
    return loop_runs.while_runner(xp, cond_program, body_program, cond_nconsts,
                                  body_nconsts, given=frozenset(donated))


while_p.rules.donated_impl = _while_donated


@while_p.def_abstract_eval
def _while_abstract_eval(*avals, cond_program, body_program, cond_nconsts, body_nconsts):
    cc, bc, carry = split_groups(avals, cond_nconsts, body_nconsts)
    check_avals("while", "the cond operands", cc + carry, cond_program.in_avals)
    check_avals("while", "the body operands", bc + carry, body_program.in_avals)
    pred = cond_program.out_avals
    if len(pred) != 1 or pred[0].shape != () or not dtypes.is_bool(pred[0].dtype):
        raise ProgramTypeError(f"while: the cond program must return one bool scalar, got "
                               f"{pred}")
    check_avals("while", "the carry outputs", body_program.out_avals, carry)
    return list(carry)


@while_p.def_vma
def _while_vma(*avals, cond_program, body_program, cond_nconsts, body_nconsts):
    """Carries vary where the body makes them, and along the axes the predicate
    varies along (devices may then run different numbers of iterations)."""
    cc, bc, init = split_groups([a.vma for a in avals], cond_nconsts, body_nconsts)

    def step(carry):
        pred = program_vma(cond_program, cc + carry)[0]
        return [m | pred for m in program_vma(body_program, bc + carry)]

    return carry_fixpoint(step, init)[0]


def _while_types(*avals, cond_program, body_program, cond_nconsts, body_nconsts):
    """Unreduced and reduced results: the carries keep their initial types (the loop's
    tracing made the body's agree)."""
    cc, bc, init = split_groups(list(avals), cond_nconsts, body_nconsts)
    outs = program_types(body_program, bc + init)
    for a, b in zip(init, outs):
        if (a.unreduced, a.reduced) != (b.unreduced, b.reduced - a.vma):
            raise ManualTypeError(f"while: a carry enters as {a} and leaves the body as {b}; "
                                  "a carry keeps its unreduced and reduced axes")
    return [(a.unreduced, a.reduced) for a in init]


while_p.rules.manual_types = _while_types


def _cond_with_extra(cond_program, n_extra_avals):
    """The cond program taking (and ignoring) extra trailing carries."""
    avals = list(cond_program.in_avals)
    n = len(avals)
    return trace_closed(lambda *a: eval_program(cond_program, *a[:n]),
                        avals + list(n_extra_avals))


def _while_jvp(primals, tangents, *, cond_program, body_program, cond_nconsts, body_nconsts):
    nz = [has_tangent(t) for t in tangents]
    _, bc_nz, init_nz = split_groups(nz, cond_nconsts, body_nconsts)
    ncar = len(init_nz)
    carry_nz = init_nz
    while True:
        body, out_nz = jvp_program(body_program, bc_nz + carry_nz, carry_nz)
        grown = or_each(carry_nz, out_nz)
        if grown == carry_nz:
            break
        carry_nz = grown
    body = permute(body, interleave_order([body_nconsts, ncar], [sum(bc_nz), sum(carry_nz)]),
                   list(range(ncar + sum(carry_nz))))
    cc, bc, init = split_groups(primals, cond_nconsts, body_nconsts)
    _, bc_t, init_t = split_groups(tangents, cond_nconsts, body_nconsts)
    carry_avals = [get_aval(x) for x in init]
    cond = _cond_with_extra(cond_program, [tangent_aval(a) for a, m in
                                           zip(carry_avals, carry_nz) if m])
    bct = [cast_to(instantiate(t), tangent_aval(get_aval(p)))
           for p, t, m in zip(bc, bc_t, bc_nz) if m]
    it0 = [cast_to(instantiate(t), tangent_aval(a)) for a, t, m in
           zip(carry_avals, init_t, carry_nz) if m]
    outs = while_bind(*cc, *bc, *bct, *init, *it0, cond_program=cond, body_program=body,
                      cond_nconsts=cond_nconsts, body_nconsts=body_nconsts + len(bct))
    it = iter(outs[ncar:])
    return outs[:ncar], [next(it) if m else zero_tangent(a)
                         for a, m in zip(carry_avals, carry_nz)]


while_p.def_jvp(_while_jvp)


def _while_batch(args, dims, *, cond_program, body_program, cond_nconsts, body_nconsts,
                 _axis_data):
    axis_name, size = _axis_data
    args = [batching.move_to_front(a, d) if d is not None else a for a, d in zip(args, dims)]
    batched = [d is not None for d in dims]
    cc_b, bc_b, init_b = split_groups(batched, cond_nconsts, body_nconsts)
    cc, bc, init = split_groups(args, cond_nconsts, body_nconsts)
    carry_b = list(init_b)
    while True:
        body, out_b = batch_program(body_program, bc_b + carry_b, size, axis_name, carry_b)
        grown = or_each(carry_b, out_b)
        if grown == carry_b:
            cond, pred_b = batch_program(cond_program, cc_b + carry_b, size, axis_name, [False])
            if not pred_b[0] or all(carry_b):
                break
            grown = [True] * len(carry_b)  # a batched predicate selects every carry
        carry_b = grown
    init = [batching.broadcast_batch(x, None, size) if b and not ib else x
            for x, b, ib in zip(init, carry_b, init_b)]
    if pred_b[0]:
        cond, body = _any_pred_programs(cond, body, len(cc), len(bc))
        bc = cc + bc
    outs = while_bind(*cc, *bc, *init, cond_program=cond, body_program=body,
                      cond_nconsts=len(cc), body_nconsts=len(bc))
    return outs, [0 if b else None for b in carry_b]


def _any_pred_programs(cond, body, n_cc, n_bc):
    """A batched predicate: loop while any element runs; finished elements keep
    their carries (each step selects between the old and the new carry)."""
    c_avals = cond.in_avals
    any_cond = trace_closed(lambda *a: [reduce.reduce_max(eval_program(cond, *a)[0], (0,))],
                            c_avals)
    carry_avals = body.in_avals[n_bc:]

    def step(*a):
        cc, bc, carry = split_groups(a, n_cc, n_bc)
        pred = eval_program(cond, *cc, *carry)[0]
        new = eval_program(body, *bc, *carry)
        return [elementwise.select_n(structural.broadcast_in_dim(pred, av.shape, (0,)), old, nw)
                for old, nw, av in zip(carry, new, carry_avals)]

    new_body = trace_closed(step, list(c_avals[:n_cc]) + list(body.in_avals))
    return any_cond, new_body


while_p.def_batch(_while_batch)
while_p.rules.batch_needs_axis = True


def _while_partial_eval(eqn, in_unknown):
    """Known carries run in a known while; the unknown while recomputes them (JAX's
    split: forward mode through ``linearize`` works, reverse mode does not)."""
    # (inner: the pass pipeline, and transforms.ad through it, load spmd.compiler.ops)
    from spmd.compiler.passes.pipeline import dce_program, inline_calls
    from spmd.compiler.transforms.ad import partial_eval

    p = eqn.params
    p = dict(p, cond_program=inline_calls(p["cond_program"]),
             body_program=inline_calls(p["body_program"]))
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cc_uk, bc_uk, init_uk = split_groups(list(in_unknown), nc, nb)
    everything = None, eqn, [True] * len(eqn.outputs)
    if any(cc_uk):
        return everything
    carry_uk = list(init_uk)
    while True:
        known_b, _, out_uk, _ = partial_eval(p["body_program"], bc_uk + carry_uk)
        grown = or_each(carry_uk, out_uk)
        if grown == carry_uk:
            break
        carry_uk = grown
    known_c, _, pred_uk, _ = partial_eval(p["cond_program"], cc_uk + carry_uk)
    if pred_uk[0] or all(carry_uk):
        return everything
    body_outs = [a for a, u in zip(p["body_program"].program.out_atoms, carry_uk) if not u]
    kb, _ = dce_program(Program(known_b.program.in_vars, known_b.program.eqns, body_outs))
    kc, _ = dce_program(Program(known_c.program.in_vars, known_c.program.eqns,
                                [p["cond_program"].program.out_atoms[0]]))
    cc, bc, init = split_groups(eqn.inputs, nc, nb)
    known_eqn = eqn.replace(
        inputs=cc + [a for a, u in zip(bc, bc_uk) if not u]
        + [a for a, u in zip(init, carry_uk) if not u],
        outputs=[o for o, u in zip(eqn.outputs, carry_uk) if not u],
        params=dict(p, cond_program=ClosedProgram(kc, known_c.consts),
                    body_program=ClosedProgram(kb, known_b.consts),
                    body_nconsts=sum(not u for u in bc_uk)))
    # The unknown while is the whole loop; its known results are discarded.
    unknown_eqn = eqn.replace(outputs=[o if u else Var(o.aval)
                                       for o, u in zip(eqn.outputs, carry_uk)])
    return known_eqn, unknown_eqn, carry_uk


while_p.rules.partial_eval = _while_partial_eval


@while_p.def_transpose
def _while_transpose(cts, *args, **params):
    raise ArgumentError(
        "Reverse-mode differentiation does not work for lax.while_loop or lax.fori_loop with "
        "dynamic (traced) start/stop values: the number of iterations is not known when the "
        "loop is traced, so the values of each iteration cannot be saved. Use lax.scan, or "
        "lax.fori_loop with static Python-int bounds (it lowers to scan); forward mode "
        "(spmd.jvp, jacfwd) works with while_loop")


def _while_dce(eqn, used_outputs):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    _, c_used = dce_closed(p["cond_program"], [True])
    live = or_each(list(used_outputs), c_used[nc:])
    while True:  # a carry is live when used, read by cond, or needed by a live carry
        body, b_used = dce_closed(p["body_program"], live)
        grown = or_each(live, b_used[nb:])
        if grown == live:
            break
        live = grown
    if all(live) and all(b_used[:nb]) and all(c_used[:nc]):
        return eqn
    cond = drop_inputs(dce_closed(p["cond_program"], [True])[0], c_used[:nc] + live)
    cc, bc, init = split_groups(eqn.inputs, nc, nb)
    return eqn.replace(
        inputs=([a for a, u in zip(cc, c_used[:nc]) if u] + [a for a, u in zip(bc, b_used[:nb])
                                                            if u]
                + [a for a, u in zip(init, live) if u]),
        outputs=[o for o, u in zip(eqn.outputs, live) if u],
        params=dict(p, cond_program=cond, body_program=drop_inputs(body, b_used[:nb] + live),
                    cond_nconsts=sum(c_used[:nc]), body_nconsts=sum(b_used[:nb])))


while_p.rules.dce = _while_dce
