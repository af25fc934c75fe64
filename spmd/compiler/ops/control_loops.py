"""Control flow, part 2: the ``scan`` and ``while`` primitives.

``scan`` operands are ``consts, init carries, xs`` (xs stacked along axis 0);
its body maps ``(consts, carry, x slices) -> (carry, y slices)`` and the
results are the final carries and the stacked ys.  ``while`` operands are
``cond consts, body consts, init carries``.

The implementations compile each body once (``executable_for``) and run it in
a Python loop over arrays (:mod:`spmd.compiler.ops.loop_runs`, which also decides
which carries get buffers of their own and which the code around the loop hands
over).  Rules that change which carries hold tangents (jvp),
a batch axis (vmap), unknown values (partial evaluation) or varying mesh axes
(the varying-axes rule) iterate to a fixed point, since a carry's output feeds
its next input.
"""

from __future__ import annotations

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import add_tangents, instantiate, is_undefined, is_zero
from spmd.compiler.core.avals import tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Program, Var
from spmd.compiler.ops.control_cond import (batch_program, cast_to, check_avals, dce_closed,
                                            drop_inputs, has_tangent, interleave_order,
                                            jvp_program, permute, trace_closed,
                                            zero_tangent)
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.manual_types import ManualTypeError, ct_aval
from spmd.compiler.ops import loop_runs
from spmd.compiler.core.program_vma import program_types, program_vma
from spmd.compiler.core.trace import eval_program, get_aval
from spmd.errors import ArgumentError, ProgramTypeError


def _split(xs, *sizes):
    out, i = [], 0
    for s in sizes:
        out.append(list(xs[i:i + s]))
        i += s
    out.append(list(xs[i:]))
    return out


def _or(a, b):
    return [x or y for x, y in zip(a, b)]


# ====================================================================== scan

scan_p = Primitive("scan", traits=(), multiple_results=True, higher_order=True)


def scan_bind(*args, program, num_consts, num_carry, length, reverse):
    return scan_p.bind(*args, program=program, num_consts=int(num_consts),
                       num_carry=int(num_carry), length=int(length), reverse=bool(reverse))


@scan_p.def_impl
def _scan_impl(xp, *args, program, num_consts, num_carry, length, reverse):
    run = loop_runs.scan_runner(xp, program, num_consts, num_carry, length, reverse)[0]
    return run(*args)


def _scan_donated(xp, donated, *, program, num_consts, num_carry, length, reverse):
    """The scan with the initial carries at ``donated`` (positions among its operands)
    handed over by the generated code around it (:mod:`spmd.compiler.ops.loop_runs`):
    ``(impl, consumed, exclusive)`` as ``codegen`` asks of a ``donated_impl``."""
    return loop_runs.scan_runner(xp, program, num_consts, num_carry, length, reverse,
                                 given=frozenset(donated))


scan_p.rules.donated_impl = _scan_donated


@scan_p.def_abstract_eval
def _scan_abstract_eval(*avals, program, num_consts, num_carry, length, reverse):
    consts, carry, xs = _split(avals, num_consts, num_carry)
    for x in xs:
        if x.ndim == 0 or x.shape[0] != length:
            raise ProgramTypeError(f"scan: an xs operand has type {x}, expected a leading axis "
                                   f"of length {length}")
    slices = [x.update(shape=x.shape[1:]) for x in xs]
    check_avals("scan", "the operands", consts + carry + slices, program.in_avals)
    carry_out = program.out_avals[:num_carry]
    check_avals("scan", "the carry outputs", carry_out, carry)
    ys = [a.update(shape=(length,) + a.shape) for a in program.out_avals[num_carry:]]
    return list(carry) + ys


def _carry_fixpoint(vmas_of, init_vmas):
    """The carries' varying axes: the least types that the loop keeps (a carry
    varies where its initial value does or where the body makes it vary)."""
    carry = [frozenset(m) for m in init_vmas]
    while True:  # grows monotonically over a finite set of axes
        outs = vmas_of(carry)
        grown = [c | o for c, o in zip(carry, outs)]
        if grown == carry:
            return carry, outs
        carry = grown


@scan_p.def_vma
def _scan_vma(*avals, program, num_consts, num_carry, length, reverse):
    consts, init, xs = _split([a.vma for a in avals], num_consts, num_carry)
    carry, outs = _carry_fixpoint(lambda c: program_vma(program, consts + c + xs), init)
    return carry + list(outs[num_carry:])


def _scan_types(*avals, program, num_consts, num_carry, length, reverse):
    """Unreduced and reduced results: the carries keep their initial types (the loop's
    tracing made the body's agree), the ys take the body's."""
    consts, init, xs = _split(list(avals), num_consts, num_carry)
    per_step = [a.update(shape=a.shape[1:]) for a in xs]
    outs = program_types(program, consts + init + per_step)
    for a, b in zip(init, outs[:num_carry]):
        if (a.unreduced, a.reduced) != (b.unreduced, b.reduced - a.vma):
            raise ManualTypeError(f"scan: a carry enters as {a} and leaves the body as {b}; "
                                  "a carry keeps its unreduced and reduced axes")
    return [(a.unreduced, a.reduced) for a in init] + \
        [(b.unreduced, b.reduced) for b in outs[num_carry:]]


scan_p.rules.manual_types = _scan_types


# ------------------------------------------------------------------- jvp

def _scan_jvp(primals, tangents, *, program, num_consts, num_carry, length, reverse):
    nz = [has_tangent(t) for t in tangents]
    const_nz, init_nz, xs_nz = _split(nz, num_consts, num_carry)
    n_ys = len(program.out_avals) - num_carry
    carry_nz = init_nz
    while True:  # grows monotonically, so at most num_carry + 1 rounds
        body, out_nz = jvp_program(program, const_nz + carry_nz + xs_nz,
                                   carry_nz + [False] * n_ys)
        grown = _or(carry_nz, out_nz[:num_carry])
        if grown == carry_nz:
            break
        carry_nz = grown
    ys_nz = out_nz[num_carry:]
    n_x = len(xs_nz)
    # jvp_program orders (primals, tangents); scan wants consts/carry/xs groups each
    # followed by their tangents.
    in_order = interleave_order([num_consts, num_carry, n_x],
                                [sum(const_nz), sum(carry_nz), sum(xs_nz)])
    out_order = interleave_order([num_carry, n_ys], [sum(carry_nz), sum(ys_nz)])
    body = permute(body, in_order, out_order)
    consts, init, xs = _split(primals, num_consts, num_carry)
    c_t, i_t, x_t = _split(tangents, num_consts, num_carry)

    def tans(ps, ts, mask):
        return [cast_to(instantiate(t), tangent_aval(get_aval(p)))
                for p, t, m in zip(ps, ts, mask) if m]

    args = (consts + tans(consts, c_t, const_nz) + init + tans(init, i_t, carry_nz)
            + xs + tans(xs, x_t, xs_nz))
    outs = scan_bind(*args, program=body, num_consts=num_consts + sum(const_nz),
                     num_carry=num_carry + sum(carry_nz), length=length, reverse=reverse)
    carry_out, carry_t, ys, ys_t = _split(outs, num_carry, sum(carry_nz), n_ys)
    out_avals = [get_aval(o) for o in carry_out + ys]
    t_iter = iter(carry_t + ys_t)
    t_out = [next(t_iter) if m else zero_tangent(a)
             for a, m in zip(out_avals, carry_nz + ys_nz)]
    return carry_out + ys, t_out


scan_p.def_jvp(_scan_jvp)


# --------------------------------------------------------------- batching

def _scan_batch(args, dims, *, program, num_consts, num_carry, length, reverse, _axis_data):
    from spmd.compiler.transforms.batching import broadcast_batch, move_axis, move_to_front

    axis_name, size = _axis_data
    consts, init, xs = _split(args, num_consts, num_carry)
    c_d, i_d, x_d = _split(dims, num_consts, num_carry)
    consts = [move_to_front(c, d) if d is not None else c for c, d in zip(consts, c_d)]
    # xs keep the scan axis first; their batch axis goes to 1 (axis 0 of a slice).
    xs = [move_axis(x, d, 1) if d is not None else x for x, d in zip(xs, x_d)]
    const_b = [d is not None for d in c_d]
    xs_b = [d is not None for d in x_d]
    n_ys = len(program.out_avals) - num_carry
    carry_b = [d is not None for d in i_d]
    while True:
        body, out_b = batch_program(program, const_b + carry_b + xs_b, size, axis_name,
                                    carry_b + [False] * n_ys)
        grown = _or(carry_b, out_b[:num_carry])
        if grown == carry_b:
            break
        carry_b = grown
    init = [broadcast_batch(x, d, size) if b else x for x, d, b in zip(init, i_d, carry_b)]
    outs = scan_bind(*consts, *init, *xs, program=body, num_consts=num_consts,
                     num_carry=num_carry, length=length, reverse=reverse)
    out_dims = [0 if b else None for b in carry_b] + [1 if b else None
                                                     for b in out_b[num_carry:]]
    return outs, out_dims


scan_p.def_batch(_scan_batch)
scan_p.rules.batch_needs_axis = True


# ---------------------------------------------------- partial evaluation

def _scan_partial_eval(eqn, in_unknown):
    """Split a scan into a known scan and an unknown one.

    The residuals the unknown body needs become extra stacked ``ys`` of the
    known scan and extra ``xs`` of the unknown one; residuals that are
    loop-invariant inputs (outer consts, body constants) or known ``xs`` are
    passed to the unknown scan as they are.
    """
    from spmd.compiler.transforms.ad import partial_eval
    from spmd.compiler.passes.pipeline import dce_program

    from spmd.compiler.passes.pipeline import inline_calls

    p = eqn.params
    nc, ncar, length = p["num_consts"], p["num_carry"], p["length"]
    body = inline_calls(p["program"])  # as partial_eval does, so that atoms match
    const_uk, init_uk, xs_uk = _split(list(in_unknown), nc, ncar)
    carry_uk = list(init_uk)
    while True:
        known, unknown, out_uk, n_res = partial_eval(body, const_uk + carry_uk + xs_uk)
        grown = _or(carry_uk, out_uk[:ncar])
        if grown == carry_uk:
            break
        carry_uk = grown
    ys_uk = out_uk[ncar:]
    sel_uk = carry_uk + ys_uk
    # The unknown body's outputs (known values among them arrive as residuals).
    uk_outs = [a for a, u in zip(unknown.out_atoms, sel_uk) if u]
    uk_prog, used = dce_program(Program(unknown.in_vars, unknown.eqns, uk_outs))
    residuals = [v for v, u in zip(unknown.in_vars[:n_res], used[:n_res]) if u]
    # Classify residuals by where their value comes from.
    kp = known.program
    body_const_vars = kp.in_vars[:len(known.consts)]
    const_val = dict(zip(body_const_vars, known.consts))
    args = body.program.in_vars[len(body.consts):]
    b_consts, b_carry, b_xs = _split(args, nc, ncar)
    outer_c, outer_init, outer_xs = _split(eqn.inputs, nc, ncar)
    const_pos = {v: i for i, v in enumerate(b_consts)}
    xs_pos = {v: i for i, v in enumerate(b_xs)}
    res_body_consts = [r for r in residuals if r in const_val]
    res_outer_consts = [r for r in residuals if r in const_pos]
    res_outer_xs = [r for r in residuals if r in xs_pos]
    stacked = [r for r in residuals if r not in const_val and r not in const_pos
               and r not in xs_pos]
    # Known scan: known consts/carries/xs -> known carries, known ys, stacked residuals.
    k_carry_outs = [a for a, u in zip(body.program.out_atoms[:ncar], carry_uk) if not u]
    k_ys_outs = [a for a, u in zip(body.program.out_atoms[ncar:], ys_uk) if not u]
    k_prog, _ = dce_program(Program(kp.in_vars, kp.eqns, k_carry_outs + k_ys_outs + stacked))
    # Stacked residuals keep their types (varying axes included: a shard_map that
    # splits the scan must know which residuals differ between devices).
    stacked_vars = [Var(r.aval.update(shape=(length,) + r.aval.shape)) for r in stacked]
    k_outputs = ([o for o, u in zip(eqn.outputs[:ncar], carry_uk) if not u]
                 + [o for o, u in zip(eqn.outputs[ncar:], ys_uk) if not u] + stacked_vars)
    known_eqn = None
    if k_outputs:
        known_eqn = eqn.replace(
            inputs=([a for a, u in zip(outer_c, const_uk) if not u]
                    + [a for a, u in zip(outer_init, carry_uk) if not u]
                    + [a for a, u in zip(outer_xs, xs_uk) if not u]),
            outputs=k_outputs,
            params=dict(p, program=ClosedProgram(k_prog, known.consts),
                        num_consts=sum(not u for u in const_uk),
                        num_carry=sum(not u for u in carry_uk)))
    # Unknown scan: [invariant residuals, unknown consts] [unknown carries]
    # [stacked residuals, known xs residuals, unknown xs].
    uk_c = [v for v, u in zip(b_consts, const_uk) if u]
    uk_carry = [v for v, u in zip(b_carry, carry_uk) if u]
    uk_x = [v for v, u in zip(b_xs, xs_uk) if u]
    in_vars = (res_body_consts + res_outer_consts + uk_c + uk_carry + stacked + res_outer_xs
               + uk_x)
    uk_body = ClosedProgram(Program(in_vars, uk_prog.eqns, uk_prog.out_atoms),
                            [const_val[r] for r in res_body_consts])
    uk_inputs = ([outer_c[const_pos[r]] for r in res_outer_consts]
                 + [a for a, u in zip(outer_c, const_uk) if u]
                 + [a for a, u in zip(outer_init, carry_uk) if u]
                 + stacked_vars + [outer_xs[xs_pos[r]] for r in res_outer_xs]
                 + [a for a, u in zip(outer_xs, xs_uk) if u])
    uk_outputs = [o for o, u in zip(eqn.outputs, sel_uk) if u]
    unknown_eqn = eqn.replace(
        inputs=uk_inputs, outputs=uk_outputs,
        params=dict(p, program=uk_body, num_consts=len(res_outer_consts) + len(uk_c),
                    num_carry=len(uk_carry)))
    return known_eqn, unknown_eqn, [True] * len(uk_outputs)


scan_p.rules.partial_eval = _scan_partial_eval


# ------------------------------------------------------------- transpose

def _scan_transpose(cts, *args, program, num_consts, num_carry, length, reverse):
    """A reversed scan of the transposed body.

    The body is linear in the undefined consts and xs and in every carry (the
    carries of a linear scan are tangents; a known initial carry is then a
    zero); the defined consts and xs are residuals.  The transposed scan
    carries the carry cotangents and accumulates the linear consts' cotangents.
    """
    from spmd.compiler.transforms.ad import backward_pass
    consts, init, xs = _split(args, num_consts, num_carry)
    c_lin = [is_undefined(c) for c in consts]
    x_lin = [is_undefined(x) for x in xs]
    if not any(c_lin) and not any(x_lin) and not any(is_undefined(c) for c in init):
        return [None] * len(args)
    ct_carry, ct_ys = cts[:num_carry], cts[num_carry:]
    b = program.program
    n_bc = len(program.consts)
    b_consts, b_carry, b_xs = _split(b.in_vars[n_bc:], num_consts, num_carry)
    res_vars = ([v for v, l in zip(b_consts, c_lin) if not l]
                + [v for v, l in zip(b_xs, x_lin) if not l])
    lin_c = [v for v, l in zip(b_consts, c_lin) if l]
    lin_x = [v for v, l in zip(b_xs, x_lin) if l]
    lin_vars = lin_c + b_carry + lin_x
    reordered = Program(b.in_vars[:n_bc] + res_vars + lin_vars, b.eqns, b.out_atoms)
    n_rc = sum(not l for l in c_lin)
    y_avals = program.out_avals[num_carry:]
    ys_nz = [not is_zero(c) for c in ct_ys]
    # (A reduced value's cotangent is unreduced: manual_types.ct_aval.)
    acc_avals = [ct_aval(v.aval) for v in lin_c]
    carry_t_avals = [ct_aval(v.aval) for v in b_carry]

    def body(*a):
        rc, acc, cc, rx, cy = _split(a, n_rc, len(acc_avals), num_carry,
                                     len(res_vars) - n_rc)
        it = iter(cy)
        cts_out = list(cc) + [next(it) if nz else zero_tangent(av)
                              for av, nz in zip(y_avals, ys_nz)]
        ct_in = backward_pass(reordered, list(program.consts) + rc + rx,
                              [v.aval for v in lin_vars], cts_out)
        ct_c, ct_carry_in, ct_x = _split(ct_in, len(lin_c), num_carry)
        new_acc = [cast_to(instantiate(add_tangents(s, c)), av)
                   for s, c, av in zip(acc, ct_c, acc_avals)]
        return (new_acc + [cast_to(instantiate(c), av) for c, av in zip(ct_carry_in, carry_t_avals)]
                + [cast_to(instantiate(c), ct_aval(v.aval)) for c, v in zip(ct_x, lin_x)])

    y_ct_avals = [ct_aval(a) for a, nz in zip(y_avals, ys_nz) if nz]
    res_avals = [v.aval for v in res_vars]
    # Scan order: consts (rc), carries (acc, ct_carry), xs (rx, ct_y).
    t_body = trace_closed(body, res_avals[:n_rc] + acc_avals + carry_t_avals + res_avals[n_rc:]
                          + y_ct_avals)
    res_c = [c for c, l in zip(consts, c_lin) if not l]
    res_x = [x for x, l in zip(xs, x_lin) if not l]
    acc0 = [cast_to(instantiate(zero_tangent(v.aval)), av) for v, av in zip(lin_c, acc_avals)]
    carry0 = [cast_to(instantiate(c), av) for c, av in zip(ct_carry, carry_t_avals)]
    ct_y_vals = [cast_to(c, ct_aval(a)) for c, a, nz in zip(ct_ys, y_avals, ys_nz) if nz]
    outs = scan_bind(*res_c, *acc0, *carry0, *res_x, *ct_y_vals, program=t_body,
                     num_consts=len(res_c), num_carry=len(acc0) + num_carry, length=length,
                     reverse=not reverse)
    ct_consts, ct_init, ct_xs = _split(outs, len(acc0), num_carry)
    it_c, it_x = iter(ct_consts), iter(ct_xs)
    return ([next(it_c) if l else None for l in c_lin]
            + [ct if is_undefined(a) else None for a, ct in zip(init, ct_init)]
            + [next(it_x) if l else None for l in x_lin])


scan_p.def_transpose(_scan_transpose)


# ------------------------------------------------------------------- DCE

def _scan_dce(eqn, used_outputs):
    p = eqn.params
    body, nc, ncar = p["program"], p["num_consts"], p["num_carry"]
    used_carry = list(used_outputs[:ncar])
    used_ys = list(used_outputs[ncar:])
    while True:  # a carry is live when its output is used or the body needs its input
        pruned, used_in = dce_closed(body, used_carry + used_ys)
        grown = _or(used_carry, used_in[nc:nc + ncar])
        if grown == used_carry:
            break
        used_carry = grown
    keep = used_in[:nc] + used_carry + used_in[nc + ncar:]
    if all(keep) and all(used_outputs):
        return eqn
    return eqn.replace(
        inputs=[a for a, k in zip(eqn.inputs, keep) if k],
        outputs=[o for o, u in zip(eqn.outputs, used_carry + used_ys) if u],
        params=dict(p, program=drop_inputs(pruned, keep), num_consts=sum(used_in[:nc]),
                    num_carry=sum(used_carry)))


scan_p.rules.dce = _scan_dce


# ===================================================================== while

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
    :func:`_scan_donated`)."""
    return loop_runs.while_runner(xp, cond_program, body_program, cond_nconsts,
                                  body_nconsts, given=frozenset(donated))


while_p.rules.donated_impl = _while_donated


@while_p.def_abstract_eval
def _while_abstract_eval(*avals, cond_program, body_program, cond_nconsts, body_nconsts):
    cc, bc, carry = _split(avals, cond_nconsts, body_nconsts)
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
    cc, bc, init = _split([a.vma for a in avals], cond_nconsts, body_nconsts)

    def step(carry):
        pred = program_vma(cond_program, cc + carry)[0]
        return [m | pred for m in program_vma(body_program, bc + carry)]

    return _carry_fixpoint(step, init)[0]


def _while_types(*avals, cond_program, body_program, cond_nconsts, body_nconsts):
    """Unreduced and reduced results: the carries keep their initial types (the loop's
    tracing made the body's agree)."""
    cc, bc, init = _split(list(avals), cond_nconsts, body_nconsts)
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
    _, bc_nz, init_nz = _split(nz, cond_nconsts, body_nconsts)
    ncar = len(init_nz)
    carry_nz = init_nz
    while True:
        body, out_nz = jvp_program(body_program, bc_nz + carry_nz, carry_nz)
        grown = _or(carry_nz, out_nz)
        if grown == carry_nz:
            break
        carry_nz = grown
    body = permute(body, interleave_order([body_nconsts, ncar], [sum(bc_nz), sum(carry_nz)]),
                   list(range(ncar + sum(carry_nz))))
    cc, bc, init = _split(primals, cond_nconsts, body_nconsts)
    _, bc_t, init_t = _split(tangents, cond_nconsts, body_nconsts)
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
    from spmd.compiler.transforms.batching import broadcast_batch, move_to_front

    axis_name, size = _axis_data
    args = [move_to_front(a, d) if d is not None else a for a, d in zip(args, dims)]
    batched = [d is not None for d in dims]
    cc_b, bc_b, init_b = _split(batched, cond_nconsts, body_nconsts)
    cc, bc, init = _split(args, cond_nconsts, body_nconsts)
    carry_b = list(init_b)
    while True:
        body, out_b = batch_program(body_program, bc_b + carry_b, size, axis_name, carry_b)
        grown = _or(carry_b, out_b)
        if grown == carry_b:
            cond, pred_b = batch_program(cond_program, cc_b + carry_b, size, axis_name, [False])
            if not pred_b[0] or all(carry_b):
                break
            grown = [True] * len(carry_b)  # a batched predicate selects every carry
        carry_b = grown
    init = [broadcast_batch(x, None, size) if b and not ib else x
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
    from spmd.compiler import ops

    c_avals = cond.in_avals
    any_cond = trace_closed(lambda *a: [ops.reduce.reduce_max(eval_program(cond, *a)[0], (0,))],
                            c_avals)
    carry_avals = body.in_avals[n_bc:]

    def step(*a):
        cc, bc, carry = _split(a, n_cc, n_bc)
        pred = eval_program(cond, *cc, *carry)[0]
        new = eval_program(body, *bc, *carry)
        return [ops.elementwise.select_n(ops.structural.broadcast_in_dim(pred, av.shape, (0,)),
                                         old, nw)
                for old, nw, av in zip(carry, new, carry_avals)]

    new_body = trace_closed(step, list(c_avals[:n_cc]) + list(body.in_avals))
    return any_cond, new_body


while_p.def_batch(_while_batch)
while_p.rules.batch_needs_axis = True


def _while_partial_eval(eqn, in_unknown):
    """Known carries run in a known while; the unknown while recomputes them (JAX's
    split: forward mode through ``linearize`` works, reverse mode does not)."""
    from spmd.compiler.transforms.ad import partial_eval
    from spmd.compiler.passes.pipeline import dce_program

    from spmd.compiler.passes.pipeline import inline_calls

    p = eqn.params
    p = dict(p, cond_program=inline_calls(p["cond_program"]),
             body_program=inline_calls(p["body_program"]))
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cc_uk, bc_uk, init_uk = _split(list(in_unknown), nc, nb)
    everything = None, eqn, [True] * len(eqn.outputs)
    if any(cc_uk):
        return everything
    carry_uk = list(init_uk)
    while True:
        known_b, _, out_uk, _ = partial_eval(p["body_program"], bc_uk + carry_uk)
        grown = _or(carry_uk, out_uk)
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
    cc, bc, init = _split(eqn.inputs, nc, nb)
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
    live = _or(list(used_outputs), c_used[nc:])
    while True:  # a carry is live when used, read by cond, or needed by a live carry
        body, b_used = dce_closed(p["body_program"], live)
        grown = _or(live, b_used[nb:])
        if grown == live:
            break
        live = grown
    if all(live) and all(b_used[:nb]) and all(c_used[:nc]):
        return eqn
    cond = drop_inputs(dce_closed(p["cond_program"], [True])[0], c_used[:nc] + live)
    cc, bc, init = _split(eqn.inputs, nc, nb)
    return eqn.replace(
        inputs=([a for a, u in zip(cc, c_used[:nc]) if u] + [a for a, u in zip(bc, b_used[:nb])
                                                            if u]
                + [a for a, u in zip(init, live) if u]),
        outputs=[o for o, u in zip(eqn.outputs, live) if u],
        params=dict(p, cond_program=cond, body_program=drop_inputs(body, b_used[:nb] + live),
                    cond_nconsts=sum(c_used[:nc]), body_nconsts=sum(b_used[:nb])))


while_p.rules.dce = _while_dce
