"""Control flow: the ``scan`` primitive.

``scan`` operands are ``consts, init carries, xs`` (xs stacked along axis 0);
its body maps ``(consts, carry, x slices) -> (carry, y slices)`` and the
results are the final carries and the stacked ys.

The implementation compiles the body once (``executable_for``) and runs it in a
Python loop over arrays (:mod:`spmd.compiler.ops.loop_runs`, which also decides
which carries get buffers of their own and which the code around the loop hands
over).  Rules that change which carries hold tangents (jvp), a batch axis (vmap),
unknown values (partial evaluation) or varying mesh axes (the varying-axes rule)
iterate to a fixed point, since a carry's output feeds its next input.  The
program helpers they share with ``cond`` and ``while`` are in
:mod:`spmd.compiler.ops.control_programs`.
"""

from __future__ import annotations

from spmd.compiler.transforms.ad_util import add_tangents, instantiate, is_undefined, is_zero
from spmd.compiler.core.avals import tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Program, Var
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.manual_types import ManualTypeError, ct_aval
from spmd.compiler.core.program_vma import program_types, program_vma
from spmd.compiler.core.trace import get_aval
from spmd.compiler.ops import loop_runs
from spmd.compiler.ops.control_programs import (batch_program, carry_fixpoint, cast_to,
                                                check_avals, dce_closed, drop_inputs,
                                                has_tangent, interleave_order, jvp_program,
                                                or_each, permute, split_groups, trace_closed,
                                                zero_tangent)
from spmd.errors import ProgramTypeError
# A module, not names: batching imports spmd.compiler.ops, so importing it first loads
# this module while batching is half made.
from spmd.compiler.transforms import batching


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
    consts, carry, xs = split_groups(avals, num_consts, num_carry)
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



@scan_p.def_vma
def _scan_vma(*avals, program, num_consts, num_carry, length, reverse):
    consts, init, xs = split_groups([a.vma for a in avals], num_consts, num_carry)
    carry, outs = carry_fixpoint(lambda c: program_vma(program, consts + c + xs), init)
    return carry + list(outs[num_carry:])


def _scan_types(*avals, program, num_consts, num_carry, length, reverse):
    """Unreduced and reduced results: the carries keep their initial types (the loop's
    tracing made the body's agree), the ys take the body's."""
    consts, init, xs = split_groups(list(avals), num_consts, num_carry)
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
    const_nz, init_nz, xs_nz = split_groups(nz, num_consts, num_carry)
    n_ys = len(program.out_avals) - num_carry
    carry_nz = init_nz
    while True:  # grows monotonically, so at most num_carry + 1 rounds
        body, out_nz = jvp_program(program, const_nz + carry_nz + xs_nz,
                                   carry_nz + [False] * n_ys)
        grown = or_each(carry_nz, out_nz[:num_carry])
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
    consts, init, xs = split_groups(primals, num_consts, num_carry)
    c_t, i_t, x_t = split_groups(tangents, num_consts, num_carry)

    def tans(ps, ts, mask):
        return [cast_to(instantiate(t), tangent_aval(get_aval(p)))
                for p, t, m in zip(ps, ts, mask) if m]

    args = (consts + tans(consts, c_t, const_nz) + init + tans(init, i_t, carry_nz)
            + xs + tans(xs, x_t, xs_nz))
    outs = scan_bind(*args, program=body, num_consts=num_consts + sum(const_nz),
                     num_carry=num_carry + sum(carry_nz), length=length, reverse=reverse)
    carry_out, carry_t, ys, ys_t = split_groups(outs, num_carry, sum(carry_nz), n_ys)
    out_avals = [get_aval(o) for o in carry_out + ys]
    t_iter = iter(carry_t + ys_t)
    t_out = [next(t_iter) if m else zero_tangent(a)
             for a, m in zip(out_avals, carry_nz + ys_nz)]
    return carry_out + ys, t_out


scan_p.def_jvp(_scan_jvp)


# --------------------------------------------------------------- batching

def _scan_batch(args, dims, *, program, num_consts, num_carry, length, reverse, _axis_data):
    axis_name, size = _axis_data
    consts, init, xs = split_groups(args, num_consts, num_carry)
    c_d, i_d, x_d = split_groups(dims, num_consts, num_carry)
    consts = [batching.move_to_front(c, d) if d is not None else c for c, d in zip(consts, c_d)]
    # xs keep the scan axis first; their batch axis goes to 1 (axis 0 of a slice).
    xs = [batching.move_axis(x, d, 1) if d is not None else x for x, d in zip(xs, x_d)]
    const_b = [d is not None for d in c_d]
    xs_b = [d is not None for d in x_d]
    n_ys = len(program.out_avals) - num_carry
    carry_b = [d is not None for d in i_d]
    while True:
        body, out_b = batch_program(program, const_b + carry_b + xs_b, size, axis_name,
                                    carry_b + [False] * n_ys)
        grown = or_each(carry_b, out_b[:num_carry])
        if grown == carry_b:
            break
        carry_b = grown
    init = [batching.broadcast_batch(x, d, size) if b else x
            for x, d, b in zip(init, i_d, carry_b)]
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
    # (inner: the pass pipeline, and transforms.ad through it, load spmd.compiler.ops)
    from spmd.compiler.passes.pipeline import dce_program, inline_calls
    from spmd.compiler.transforms.ad import partial_eval

    p = eqn.params
    nc, ncar = p["num_consts"], p["num_carry"]
    body = inline_calls(p["program"])  # as partial_eval does, so that atoms match
    const_uk, init_uk, xs_uk = split_groups(list(in_unknown), nc, ncar)
    carry_uk = list(init_uk)
    while True:
        known, unknown, out_uk, n_res = partial_eval(body, const_uk + carry_uk + xs_uk)
        grown = or_each(carry_uk, out_uk[:ncar])
        if grown == carry_uk:
            break
        carry_uk = grown
    ys_uk = out_uk[ncar:]
    unknowns = (const_uk, carry_uk, xs_uk, ys_uk)
    # The unknown body's outputs (known values among them arrive as residuals).
    uk_outs = [a for a, u in zip(unknown.out_atoms, carry_uk + ys_uk) if u]
    uk_prog, used = dce_program(Program(unknown.in_vars, unknown.eqns, uk_outs))
    residuals = _Residuals([v for v, u in zip(unknown.in_vars[:n_res], used[:n_res]) if u],
                           known, body, p)
    # The known body's outputs: known carries and ys, then the stacked residuals.
    k_outs = ([a for a, u in zip(body.program.out_atoms[:ncar], carry_uk) if not u]
              + [a for a, u in zip(body.program.out_atoms[ncar:], ys_uk) if not u]
              + residuals.stacked)
    k_prog, _ = dce_program(Program(known.program.in_vars, known.program.eqns, k_outs))
    known_eqn = _known_scan(eqn, ClosedProgram(k_prog, known.consts), residuals, unknowns)
    unknown_eqn = _unknown_scan(eqn, body, uk_prog, residuals, unknowns)
    return known_eqn, unknown_eqn, [True] * len(unknown_eqn.outputs)


class _Residuals:
    """The residuals the unknown body reads, by where their value comes from: the
    known body's constants (``body_consts``), the scan's constant operands
    (``outer_consts``) or its known ``xs`` (``outer_xs``), all passed to the unknown
    scan as they are; the others differ at each step (``stacked``: extra ``ys`` of
    the known scan, ``xs`` of the unknown one, as ``stacked_vars`` between them)."""

    def __init__(self, residuals, known, body, params):
        nc, ncar, length = params["num_consts"], params["num_carry"], params["length"]
        kp = known.program
        self.const_val = dict(zip(kp.in_vars[:len(known.consts)], known.consts))
        b_consts, _, b_xs = split_groups(body.program.in_vars[len(body.consts):], nc, ncar)
        self.const_pos = {v: i for i, v in enumerate(b_consts)}
        self.xs_pos = {v: i for i, v in enumerate(b_xs)}
        self.body_consts = [r for r in residuals if r in self.const_val]
        self.outer_consts = [r for r in residuals if r in self.const_pos]
        self.outer_xs = [r for r in residuals if r in self.xs_pos]
        self.stacked = [r for r in residuals if r not in self.const_val
                        and r not in self.const_pos and r not in self.xs_pos]
        # Stacked residuals keep their types (varying axes included: a shard_map that
        # splits the scan must know which residuals differ between devices).
        self.stacked_vars = [Var(r.aval.update(shape=(length,) + r.aval.shape))
                             for r in self.stacked]


def _known_scan(eqn, k_body, residuals, unknowns):
    """The known scan of the known body ``k_body``: known consts, carries and xs ->
    known carries, known ys and the stacked residuals (None when it has no results)."""
    const_uk, carry_uk, xs_uk, ys_uk = unknowns
    p = eqn.params
    nc, ncar = p["num_consts"], p["num_carry"]
    k_outputs = ([o for o, u in zip(eqn.outputs[:ncar], carry_uk) if not u]
                 + [o for o, u in zip(eqn.outputs[ncar:], ys_uk) if not u]
                 + residuals.stacked_vars)
    if not k_outputs:
        return None
    outer_c, outer_init, outer_xs = split_groups(eqn.inputs, nc, ncar)
    return eqn.replace(
        inputs=([a for a, u in zip(outer_c, const_uk) if not u]
                + [a for a, u in zip(outer_init, carry_uk) if not u]
                + [a for a, u in zip(outer_xs, xs_uk) if not u]),
        outputs=k_outputs,
        params=dict(p, program=k_body, num_consts=sum(not u for u in const_uk),
                    num_carry=sum(not u for u in carry_uk)))


def _unknown_scan(eqn, body, uk_prog, residuals, unknowns):
    """The unknown scan: [invariant residuals, unknown consts] [unknown carries]
    [stacked residuals, known xs residuals, unknown xs] -> the unknown results."""
    const_uk, carry_uk, xs_uk, ys_uk = unknowns
    p = eqn.params
    nc, ncar = p["num_consts"], p["num_carry"]
    r = residuals
    b_consts, b_carry, b_xs = split_groups(body.program.in_vars[len(body.consts):], nc, ncar)
    outer_c, outer_init, outer_xs = split_groups(eqn.inputs, nc, ncar)
    uk_c = [v for v, u in zip(b_consts, const_uk) if u]
    uk_carry = [v for v, u in zip(b_carry, carry_uk) if u]
    uk_x = [v for v, u in zip(b_xs, xs_uk) if u]
    in_vars = (r.body_consts + r.outer_consts + uk_c + uk_carry + r.stacked + r.outer_xs
               + uk_x)
    uk_body = ClosedProgram(Program(in_vars, uk_prog.eqns, uk_prog.out_atoms),
                            [r.const_val[v] for v in r.body_consts])
    uk_inputs = ([outer_c[r.const_pos[v]] for v in r.outer_consts]
                 + [a for a, u in zip(outer_c, const_uk) if u]
                 + [a for a, u in zip(outer_init, carry_uk) if u]
                 + r.stacked_vars + [outer_xs[r.xs_pos[v]] for v in r.outer_xs]
                 + [a for a, u in zip(outer_xs, xs_uk) if u])
    return eqn.replace(
        inputs=uk_inputs, outputs=[o for o, u in zip(eqn.outputs, carry_uk + ys_uk) if u],
        params=dict(p, program=uk_body, num_consts=len(r.outer_consts) + len(uk_c),
                    num_carry=len(uk_carry)))


scan_p.rules.partial_eval = _scan_partial_eval


# ------------------------------------------------------------- transpose

def _scan_transpose(cts, *args, program, num_consts, num_carry, length, reverse):
    """A reversed scan of the transposed body.

    The body is linear in the undefined consts and xs and in every carry (the
    carries of a linear scan are tangents; a known initial carry is then a
    zero); the defined consts and xs are residuals.  The transposed scan
    carries the carry cotangents and accumulates the linear consts' cotangents.
    """
    # (inner: transforms.ad imports the pass pipeline, which loads spmd.compiler.ops)
    from spmd.compiler.transforms.ad import backward_pass

    consts, init, xs = split_groups(args, num_consts, num_carry)
    c_lin = [is_undefined(c) for c in consts]
    x_lin = [is_undefined(x) for x in xs]
    if not any(c_lin) and not any(x_lin) and not any(is_undefined(c) for c in init):
        return [None] * len(args)
    ct_carry, ct_ys = cts[:num_carry], cts[num_carry:]
    b = program.program
    n_bc = len(program.consts)
    b_consts, b_carry, b_xs = split_groups(b.in_vars[n_bc:], num_consts, num_carry)
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
        rc, acc, cc, rx, cy = split_groups(a, n_rc, len(acc_avals), num_carry,
                                     len(res_vars) - n_rc)
        it = iter(cy)
        cts_out = list(cc) + [next(it) if nz else zero_tangent(av)
                              for av, nz in zip(y_avals, ys_nz)]
        ct_in = backward_pass(reordered, list(program.consts) + rc + rx,
                              [v.aval for v in lin_vars], cts_out)
        ct_c, ct_carry_in, ct_x = split_groups(ct_in, len(lin_c), num_carry)
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
    ct_consts, ct_init, ct_xs = split_groups(outs, len(acc0), num_carry)
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
        grown = or_each(used_carry, used_in[nc:nc + ncar])
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
