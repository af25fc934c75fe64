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
from spmd.compiler.transforms.ad import backward_pass, jvp_flat, partial_eval
from spmd.compiler.transforms.ad_util import Zero, is_undefined
from spmd.compiler.core.avals import tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.core.jit import executable_for, flatten_outputs, jit_p
from spmd.compiler.core.program_vma import call_types, call_vma
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, eval_program, get_aval, trace_to_program
from spmd.errors import ArgumentError
from spmd.compiler.core import dtypes
from spmd.compiler.transforms.batching import batch_flat, broadcast_batch
from spmd.compiler.passes.pipeline import dce_program


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
        return "dot" in prim.traits  # dot_general (spmd.compiler.core.primitives.TRAITS)

    checkpoint_dots = dots_saveable

    @staticmethod
    def dots_with_no_batch_dims_saveable(prim, *avals, **params) -> bool:
        if "dot" not in prim.traits:
            return False
        (_, _), (lb, rb) = params["dimension_numbers"]
        return not lb and not rb

    checkpoint_dots_with_no_batch_dims = dots_with_no_batch_dims_saveable

    # Policies on names given with ``checkpoint_name``.
    @staticmethod
    def save_only_these_names(*names: str) -> Callable:
        """Save the values named (``checkpoint_name``) in ``names``; recompute the rest."""
        wanted = frozenset(names)
        return lambda prim, *avals, **params: prim is name_p and params["name"] in wanted

    @staticmethod
    def save_any_names_but_these(*names: str) -> Callable:
        """Save every named value except those in ``names``; recompute unnamed ones."""
        unwanted = frozenset(names)
        return lambda prim, *avals, **params: prim is name_p and params["name"] not in unwanted

    @staticmethod
    def save_anything_except_these_names(*names: str) -> Callable:
        """Save every value except those named in ``names``."""
        unwanted = frozenset(names)
        return lambda prim, *avals, **params: not (prim is name_p and
                                                   params["name"] in unwanted)

    @staticmethod
    def save_and_offload_only_these_names(*, names_which_can_be_saved=(),
                                          names_which_can_be_offloaded=(),
                                          offload_src="device", offload_dst="pinned_host"):
        """Save the named values of both lists (there is no host offload: an offloaded
        value is kept like a saved one)."""
        return checkpoint_policies.save_only_these_names(*names_which_can_be_saved,
                                                         *names_which_can_be_offloaded)

    @staticmethod
    def save_from_both_policies(policy_1: Callable, policy_2: Callable) -> Callable:
        """Save what either policy saves."""
        return lambda prim, *avals, **params: bool(policy_1(prim, *avals, **params) or
                                                   policy_2(prim, *avals, **params))


# ------------------------------------------------------------ checkpoint_name

# The identity, tagging a value with a name that checkpoint policies can select.
name_p = Primitive("name", traits=())
name_p.unreduced = "keep"
name_p.def_impl(lambda xp, x, *, name: x)
name_p.def_abstract_eval(lambda x, *, name: x)
name_p.def_emit(lambda ins, name: ins[0])
# Only the primal carries the name (as in JAX): the tangent is the input's.
name_p.def_jvp(lambda primals, tangents, *, name: (name_p.bind(primals[0], name=name),
                                                   tangents[0]))
name_p.def_batch(lambda args, dims, *, name: (name_p.bind(args[0], name=name), dims[0]))
# Partitioned as the identity (spmd/shard/partition/rules.py): it keeps its placement.


def checkpoint_name(x, name: str):
    """``x``, tagged with ``name`` for ``checkpoint_policies.save_only_these_names``
    and friends (a pytree: every leaf gets the name).

    >>> h = checkpoint_name(snp.tanh(x @ w), "hidden")  # doctest: +SKIP
    """
    if not isinstance(name, str):
        raise ArgumentError(f"checkpoint_name: name must be a str, got {name!r}")
    # Not tree_map: its frame would become the equations' source location.
    leaves, tree = tree_util.tree_flatten(x)
    return tree_util.tree_unflatten(tree, [name_p.bind(v, name=name) for v in leaves])


# ---------------------------------------------------------------- primitive

remat_p = Primitive("remat", traits=(), multiple_results=True, higher_order=True)
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
remat_p.rules.manual_types = call_types
remat_p.rules.batch_needs_axis = True


def _saveable(policy, var, producers) -> bool:
    eqn = producers.get(var)
    if eqn is None:  # an input of the body: always available
        return True
    if eqn.primitive.rules.never_recompute:
        return True  # a read of state (rng_counter): recomputing it would read anew
    return bool(policy(eqn.primitive, *[a.aval for a in eqn.inputs], **eqn.params))


def _remat_partial_eval(eqn, in_unknown):
    """Split a remat equation; save only what the policy allows, recompute the rest."""
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


remat_p.rules.partial_eval = _remat_partial_eval

# The backward half of a split remat: residual inputs first, then linear inputs.
remat_lin_p = Primitive("remat_lin", traits=(), multiple_results=True, higher_order=True,
                        linear=True)
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
    level, size = _axis_data
    outs = batch_flat(lambda *a: eval_program(program, *a), args, dims, size, level,
                      [0] * len(program.out_avals))
    return outs, [0] * len(outs)


remat_lin_p.def_vma(call_vma)
remat_lin_p.rules.manual_types = call_types
remat_lin_p.rules.batch_needs_axis = True


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


def saved_residuals(fun: Callable, *args, **kwargs) -> list[tuple]:
    """The values reverse mode saves for ``fun`` at ``args``: ``[(aval, source), ...]``,
    ``source`` as in JAX: ``"from the argument x"``, ``"named 'h' from file:line"``,
    or ``"output of sin from file:line"``.
    """
    import inspect

    leaves, tree = tree_util.tree_flatten(tuple(args))
    try:
        params = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        params = []
    # The name of each leaf: the parameter's, then its path in a pytree argument.
    owner = [(params[i] if i < len(params) else f"#{i}") + tree_util.keystr(path)
             for i, a in enumerate(args) for path, _ in tree_util.tree_leaves_with_path(a)]

    def flat(*xs):
        return flatten_outputs(fun(*tree_util.tree_unflatten(tree, xs), **kwargs),
                               "saved_residuals")[0]

    avals = [get_aval(x) for x in leaves]
    diff = [dtypes.is_inexact(a.dtype) for a in avals]
    diff_avals = [tangent_aval(a) for a, d in zip(avals, diff) if d]

    n_out: list = []

    def jvp_fun(*xs):
        ps, ts = list(xs[:len(avals)]), iter(xs[len(avals):])
        tin = [next(ts) if d else Zero(tangent_aval(a)) for a, d in zip(avals, diff)]
        out_p, out_t = jvp_flat(flat, ps, tin)
        n_out[:] = [len(out_p)]
        return out_p + [t for t in out_t if not isinstance(t, Zero)]

    closed = trace_to_program(jvp_fun, avals + diff_avals)
    known, unknown, _, n_res = partial_eval(closed, [False] * len(avals) + [True] *
                                            len(diff_avals))
    # Only the tangent outputs need residuals (the primal outputs are known).
    _, used = dce_program(Program(unknown.in_vars, unknown.eqns, unknown.out_atoms[n_out[0]:]))
    kp = known.program
    res_atoms = kp.out_atoms[len(kp.out_atoms) - n_res:]
    n_consts = len(known.consts)
    out = []
    for atom, u in zip(res_atoms, used[:n_res]):
        if not u or not isinstance(atom, Var):
            continue
        src = _describe_residual(atom, kp, n_consts, owner)
        out.append((atom.aval.update(vma=frozenset(), reduced=frozenset()), src))
    return out


def _describe_residual(var, program, n_consts, owner) -> str:
    """Where a residual comes from, looking into nested programs (jit, remat halves)."""
    while True:
        if var in program.in_vars:
            k = program.in_vars.index(var) - n_consts
            if k < 0:
                return "from a constant"
            return f"from the argument {owner[k] if k < len(owner) else f'#{k}'}"
        eqn = next((e for e in program.eqns if var in e.outputs), None)
        if eqn is None:
            return "from a constant"
        inner = eqn.params.get("program")
        if isinstance(inner, ClosedProgram):
            atom = inner.program.out_atoms[eqn.outputs.index(var)]
            if isinstance(atom, Var) and atom in inner.program.in_vars:
                # passed through: continue outside with the matching operand
                j = inner.program.in_vars.index(atom) - len(inner.consts)
                outer = eqn.inputs[j] if 0 <= j < len(eqn.inputs) else None
                if isinstance(outer, Var):
                    var = outer
                    continue
                return "from a constant"
            if not isinstance(atom, Var):
                return "from a constant"
            var, program, n_consts = atom, inner.program, len(inner.consts)
            continue
        where = f" from {eqn.source_info}" if eqn.source_info is not None else ""
        if eqn.primitive is name_p:
            return f"named {eqn.params['name']!r}{where}"
        return f"output of {eqn.primitive.name}{where}"


def print_saved_residuals(fun: Callable, *args, **kwargs) -> None:
    """Print what reverse mode saves for ``fun`` at ``args``, one value per line.

    >>> print_saved_residuals(lambda x: snp.sin(snp.sin(x)).sum(), np.ones(3))  # doctest: +SKIP
    f32[3] from the argument x
    f32[3] output of cos from example.py:1 (<lambda>)
    """
    for aval, src in saved_residuals(fun, *args, **kwargs):
        print(f"{aval.str_short()} {src}")
