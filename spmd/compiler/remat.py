"""Rematerialisation: ``checkpoint`` (``remat``) with saving policies (JEP 11830).

``checkpoint(f)`` wraps ``f``'s program in a ``remat`` equation.  When reverse
mode splits it (its ``partial_eval`` rule), only the residuals that the policy
calls saveable are kept from the forward pass; the backward pass recomputes
the others from them and from the inputs.  The recomputation is itself a
``remat`` equation, so CSE cannot merge it back into the forward pass.
"""

from __future__ import annotations

import functools
from typing import Callable

from spmd import tree_util
from spmd.compiler.ad import backward_pass, jvp_flat, partial_eval
from spmd.compiler.ad_util import Zero, is_undefined
from spmd.compiler.avals import tangent_aval
from spmd.compiler.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.jit import call_vma, executable_for, flatten_outputs, jit_p
from spmd.compiler.primitives import Primitive
from spmd.compiler.trace import bind, eval_program, get_aval, trace_to_program


# ----------------------------------------------------------------- policies

class checkpoint_policies:
    """Which intermediate values reverse mode may save (the rest are recomputed)."""

    @staticmethod
    def everything_saveable(prim, *avals, **params) -> bool:
        return True

    @staticmethod
    def nothing_saveable(prim, *avals, **params) -> bool:
        return False

    @staticmethod
    def dots_saveable(prim, *avals, **params) -> bool:
        return prim.name == "dot_general"

    checkpoint_dots = dots_saveable

    @staticmethod
    def dots_with_no_batch_dims_saveable(prim, *avals, **params) -> bool:
        if prim.name != "dot_general":
            return False
        (_, _), (lb, rb) = params["dimension_numbers"]
        return not lb and not rb

    checkpoint_dots_with_no_batch_dims = dots_with_no_batch_dims_saveable


# ---------------------------------------------------------------- primitive

remat_p = Primitive("remat", multiple_results=True, higher_order=True)
remat_p.def_impl(lambda xp, *args, program, policy: executable_for(program, xp)(*args))
remat_p.def_abstract_eval(lambda *avals, program, policy: program.out_avals)


@remat_p.def_jvp
def _remat_jvp(primals, tangents, *, program, policy):
    nz = [not isinstance(t, Zero) for t in tangents]
    n = len(primals)
    out_nz: list = []

    def body(*args):
        ps, ts = list(args[:n]), iter(args[n:])
        tin = [next(ts) if z else Zero(tangent_aval(get_aval(p))) for p, z in zip(ps, nz)]
        out_p, out_t = jvp_flat(lambda *a: eval_program(program, *a), ps, tin)
        out_nz[:] = [not isinstance(t, Zero) for t in out_t]
        return out_p + [t for t in out_t if not isinstance(t, Zero)]

    in_avals = [get_aval(p) for p in primals] + [t.aval for t in tangents if not isinstance(t, Zero)]
    closed = trace_to_program(body, in_avals)
    # Constants become explicit inputs: both halves of a split may need them.
    outs = bind(remat_p, *closed.consts, *primals, *[t for t in tangents if not isinstance(t, Zero)],
                program=ClosedProgram(closed.program, []), policy=policy)
    n_out = len(program.out_avals)
    out_p, it = outs[:n_out], iter(outs[n_out:])
    out_t = [next(it) if z else Zero(tangent_aval(a)) for z, a in zip(out_nz, program.out_avals)]
    return out_p, out_t


@remat_p.def_batch
def _remat_batch(args, dims, *, program, policy, _axis_data):
    from spmd.compiler.batching import batch_flat, broadcast_batch

    # Re-batched under a level named like this one: collectives in the body keep
    # seeing the mesh or vmap axes (and run even when no argument is batched).
    level, size = _axis_data
    args = [broadcast_batch(a, d, size) for a, d in zip(args, dims)]
    n_out = len(program.out_avals)
    closed = trace_to_program(
        lambda *a: batch_flat(lambda *b: eval_program(program, *b), a, [0] * len(a), size,
                              level, [0] * n_out),
        [get_aval(a) for a in args])
    outs = bind(remat_p, *closed.consts, *args, program=ClosedProgram(closed.program, []),
                policy=policy)
    return outs, [0] * len(outs)


remat_p.def_vma(call_vma)
remat_p.rules["batch_needs_axis"] = True


def _saveable(policy, var, producers) -> bool:
    eqn = producers.get(var)
    if eqn is None:  # an input of the body: always available
        return True
    return bool(policy(eqn.primitive, *[a.aval for a in eqn.inputs], **eqn.params))


def _remat_partial_eval(eqn, in_unknown):
    """Split a remat equation; save only what the policy allows, recompute the rest."""
    from spmd.compiler.passes import dce_program

    closed, policy = eqn.params["program"], eqn.params["policy"]
    assert not closed.consts  # remat programs take their constants as inputs
    known, unknown, out_unknown, n_res = partial_eval(closed, in_unknown)
    kp = known.program
    n_known_out = len(kp.out_atoms) - n_res
    lin_outs = [a for a, u in zip(unknown.out_atoms, out_unknown) if u]
    lin_prog, used = dce_program(Program(unknown.in_vars, unknown.eqns, lin_outs))
    res_used = [r for r, u in zip(unknown.in_vars[:n_res], used[:n_res]) if u]
    producers = {o: e for e in kp.eqns for o in e.outputs}
    saved = [r for r in res_used if _saveable(policy, r, producers)]
    saved_set = set(saved)
    # The recomputation: the known equations the non-saved residuals depend on,
    # stopping at values the policy lets us save (inputs, and e.g. dot outputs).
    needed = {r for r in res_used if r not in saved_set}
    slice_eqns = []
    for e in reversed(kp.eqns):
        if any(o in needed for o in e.outputs):
            slice_eqns.append(e)
            for a in e.inputs:
                if not isinstance(a, Var) or a in saved_set:
                    continue
                if _saveable(policy, a, producers):
                    saved.append(a)
                    saved_set.add(a)
                else:
                    needed.add(a)
    slice_eqns.reverse()
    slice_inputs = [v for v in kp.in_vars if v in needed and v not in saved_set]
    outer_known = [a for a, u in zip(eqn.inputs, in_unknown) if not u]
    known_prog = ClosedProgram(Program(kp.in_vars, kp.eqns, kp.out_atoms[:n_known_out] + saved),
                               [])
    saved_outer = [Var(r.aval) for r in saved]
    known_outs = [o for o, u in zip(eqn.outputs, out_unknown) if not u]
    known_eqn = Eqn(jit_p, outer_known, known_outs + saved_outer,
                    {"program": known_prog, "name": "remat_fwd"}, eqn.source_info)
    lin = Program(saved + slice_inputs + unknown.in_vars[n_res:], slice_eqns + lin_prog.eqns,
                  lin_prog.out_atoms)
    slice_outer = [outer_known[kp.in_vars.index(v)] for v in slice_inputs]
    unknown_eqn = Eqn(remat_lin_p,
                      saved_outer + slice_outer + [a for a, u in zip(eqn.inputs, in_unknown) if u],
                      [o for o, u in zip(eqn.outputs, out_unknown) if u],
                      {"program": ClosedProgram(lin, []), "num_res": len(saved) + len(slice_inputs)},
                      eqn.source_info)
    return known_eqn, unknown_eqn, out_unknown


remat_p.rules["partial_eval"] = _remat_partial_eval

# The backward half of a split remat: residual inputs first, then linear inputs.
remat_lin_p = Primitive("remat_lin", multiple_results=True, higher_order=True, linear=True)
remat_lin_p.def_abstract_eval(lambda *avals, program, num_res: program.out_avals)
remat_lin_p.def_impl(lambda xp, *args, program, num_res: executable_for(program, xp)(*args))


@remat_lin_p.def_transpose
def _remat_lin_transpose(cts, *args, program, num_res):
    res = list(args[:num_res])
    lin_avals = [a.aval for a in args[num_res:]]
    prog = program.program
    # Recompute the non-linear part inside its own remat so CSE keeps it apart.
    lin_in = set(prog.in_vars[num_res:])
    linear = set(lin_in)
    nonlin, lin = [], []
    for e in prog.eqns:
        if any(isinstance(a, Var) and a in linear for a in e.inputs):
            linear.update(e.outputs)
            lin.append(e)
        else:
            nonlin.append(e)
    if nonlin:
        produced = [o for e in nonlin for o in e.outputs]
        used = {a for e in lin for a in e.inputs} | set(prog.out_atoms)
        carried = [v for v in produced if v in used]
        rec = ClosedProgram(Program(prog.in_vars[:num_res], nonlin, carried), [])
        vals = bind(remat_p, *res, program=rec, policy=checkpoint_policies.everything_saveable)
        prog = Program(prog.in_vars[:num_res] + carried + prog.in_vars[num_res:], lin,
                       prog.out_atoms)
        res = res + list(vals)
    cts_in = backward_pass(prog, res, lin_avals, cts)
    return [None] * num_res + cts_in


@remat_lin_p.def_jvp
def _remat_lin_jvp(primals, tangents, *, program, num_res):
    return jvp_flat(lambda *a: eval_program(program, *a), primals, tangents)


@remat_lin_p.def_batch
def _remat_lin_batch(args, dims, *, program, num_res, _axis_data):
    from spmd.compiler.batching import batch_flat

    level, size = _axis_data
    outs = batch_flat(lambda *a: eval_program(program, *a), args, dims, size, level,
                      [0] * len(program.out_avals))
    return outs, [0] * len(outs)


remat_lin_p.def_vma(call_vma)
remat_lin_p.rules["batch_needs_axis"] = True


def checkpoint(fun: Callable, *, policy: Callable | None = None, prevent_cse: bool = True,
               static_argnums: tuple = ()) -> Callable:
    """Recompute ``fun``'s intermediates in the backward pass instead of saving them.

    ``policy(prim, *avals, **params) -> bool`` says which intermediates may be
    saved (see :class:`checkpoint_policies`); the default saves none.

    >>> layer = checkpoint(lambda w, x: snp.tanh(x @ w), policy=checkpoint_policies.dots_saveable)
    """
    policy = policy or checkpoint_policies.nothing_saveable
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)

    @functools.wraps(fun)
    def wrapped(*args):
        static = {i: args[i] for i in static_argnums}
        dyn = [a for i, a in enumerate(args) if i not in static]
        leaves, in_tree = tree_util.tree_flatten(tuple(dyn))
        box: list = []

        def flat(*xs):
            d = iter(tree_util.tree_unflatten(in_tree, xs))
            full = [static[i] if i in static else next(d) for i in range(len(args))]
            outs, out_tree = flatten_outputs(fun(*full), f"checkpoint({fun.__name__})")
            box.append(out_tree)
            return outs

        closed = trace_to_program(flat, [get_aval(x) for x in leaves])
        # Constants the body closed over become explicit inputs, so that the
        # split halves can both read them.
        prog = ClosedProgram(closed.program, [])
        outs = bind(remat_p, *closed.consts, *leaves, program=prog, policy=policy)
        return tree_util.tree_unflatten(box[0], outs)

    return wrapped


remat = checkpoint


def saved_residuals(fun: Callable, *args) -> list[tuple]:
    """The values reverse mode saves for ``fun`` at ``args``: ``[(aval, source), ...]``.

    ``source`` names the primitive that produced the value, or says it is an argument.
    """
    from spmd.compiler.ad import linearize_flat
    from spmd.compiler import dtypes

    leaves, tree = tree_util.tree_flatten(tuple(args))

    def flat(*xs):
        return flatten_outputs(fun(*tree_util.tree_unflatten(tree, xs)), "saved_residuals")[0]

    diff = [dtypes.is_float(get_aval(x).dtype) for x in leaves]
    _, lin = linearize_flat(flat, leaves, diff)
    prog = lin.program
    n_res = len(lin.residuals)
    out = []
    for v, r in zip(prog.in_vars[:n_res], lin.residuals):
        uses = [e.primitive.name for e in prog.eqns if v in e.inputs]
        if not uses:
            continue
        is_arg = any(r is x for x in leaves)
        out.append((get_aval(r), "argument" if is_arg else f"used by {', '.join(sorted(set(uses)))}"))
    return out
