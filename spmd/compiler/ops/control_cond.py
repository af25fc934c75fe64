"""Control flow: the ``cond`` primitive.

``cond`` applies one of several branch programs, chosen by an int32 index
(operand 0), to the remaining operands.  Its rules transform the branches as
whole programs (:mod:`spmd.compiler.ops.control_programs`): the jvp of a cond is a
cond of the branches' jvps, and so on.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import is_undefined, is_zero
from spmd.compiler.core.avals import tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Program, Var
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.manual_types import ManualTypeError, ct_aval
from spmd.compiler.core.program_vma import program_types, program_vma
from spmd.compiler.core.trace import get_aval
from spmd.compiler.ops import elementwise, structural
from spmd.compiler.ops.control_programs import (batch_eval, batch_program, cast_to,
                                                check_avals, dce_closed, drop_inputs,
                                                has_tangent, jvp_program, same_type,
                                                transpose_program, zero_tangent, zeros_eqn)
from spmd.errors import DTypeError, ProgramTypeError
# A module, not names: batching imports spmd.compiler.ops, so importing it first loads
# this module while batching is half made.
from spmd.compiler.transforms import batching


cond_p = Primitive("cond", traits=(), multiple_results=True, higher_order=True)


def cond_bind(index, *operands, branches):
    """Bind ``cond`` (``index`` is an int32 scalar in ``[0, len(branches))``)."""
    return cond_p.bind(index, *operands, branches=tuple(branches))


@cond_p.def_impl
def _cond_impl(xp, index, *operands, branches):
    return _executable(branches[branch_index(index, len(branches))], xp)(*operands)


def _executable(branch, xp, donated=()):
    """A branch's compiled code (the jit layer's cache)."""
    # (inner: core.jit imports the pass pipeline, which loads spmd.compiler.ops)
    from spmd.compiler.core.jit import executable_for

    return executable_for(branch, xp, donated=donated)


def _executables(branches, xp, donated):
    """Every branch's compiled code with the equation's inputs at ``donated`` (the
    index first) handed over."""
    return [_executable(b, xp, tuple(k - 1 for k in donated)) for b in branches]


def branch_index(index, n: int) -> int:
    """The branch an index picks: clamped into ``[0, n)`` (as XLA's conditional)."""
    return min(max(int(index), 0), n - 1)


def _cond_donated(xp, donated, *, branches):
    """``cond`` whose operands at ``donated`` (positions among the equation's inputs,
    the index first) the generated code hands over (``codegen``: buffers it owns
    alone and never reads again): the branches are compiled with them donated, so a
    branch may update them in place (a gradient accumulated into a loop's carry).
    Returns ``(impl, consumed positions, exclusive results)``: a result is exclusive
    when it is in every branch."""
    exes = _executables(branches, xp, donated)
    consumed = frozenset(k + 1 for e in exes for k in e.consumed)
    exclusive = tuple(all(e.exclusive[k] for e in exes)
                      for k in range(len(branches[0].out_avals)))
    fns = [e.fn for e in exes]

    def impl(index, *operands):
        return fns[branch_index(index, len(fns))](*operands)

    return impl, consumed, exclusive


cond_p.rules.donated_impl = _cond_donated


def _cond_aliased(xp, donated, *, branches):
    """Per result, the positions among the equation's inputs (the index first) whose
    buffers it may share: an operand some branch returns there, or a view of it (the
    branches as the impl runs them, compiled with the operands at ``donated`` handed
    over)."""
    exes = _executables(branches, xp, donated)
    return [frozenset(k + 1 for e in exes for k in e.aliases[j])
            for j in range(len(branches[0].out_avals))]


cond_p.rules.aliased_operands = _cond_aliased


@cond_p.def_abstract_eval
def _cond_abstract_eval(index, *operands, branches):
    if index.shape != () or not dtypes.is_int(index.dtype):
        raise DTypeError(f"cond: the branch index must be an integer scalar, got {index}")
    for i, br in enumerate(branches):
        check_avals("cond", f"the operands of branch {i}", operands, br.in_avals)
        if not all(same_type(a, b) for a, b in zip(br.out_avals, branches[0].out_avals)) \
                or len(br.out_avals) != len(branches[0].out_avals):
            raise ProgramTypeError(f"cond: branch {i} returns {br.out_avals} but branch 0 "
                                   f"returns {branches[0].out_avals}")
    return list(branches[0].out_avals)


@cond_p.def_vma
def _cond_vma(index, *operands, branches):
    """Each output varies where some branch's output does, and along the axes the
    index varies along (devices may take different branches)."""
    in_vmas = [a.vma for a in operands]
    outs = [program_vma(br, in_vmas) for br in branches]
    return [index.vma.union(*ms) for ms in zip(*outs)]


def _cond_types(index, *operands, branches):
    """Unreduced and reduced results: the branches' (their tracing made them agree)."""
    outs = [program_types(br, operands) for br in branches]
    for k, br in enumerate(outs[1:], 1):
        for a, b in zip(outs[0], br):
            if (a.unreduced, a.reduced) != (b.unreduced, b.reduced):
                raise ManualTypeError(f"cond: branch 0 returns {a} and branch {k} returns {b}; "
                                      "the branches' results must agree in their unreduced "
                                      "and reduced axes")
    return [(a.unreduced, a.reduced) for a in outs[0]]


cond_p.rules.manual_types = _cond_types


# ------------------------------------------------------------------- jvp

def _cond_jvp(primals, tangents, *, branches):
    index, ops = primals[0], primals[1:]
    ts = tangents[1:]
    nz = [has_tangent(t) for t in ts]
    out_avals = branches[0].out_avals
    first = [jvp_program(br, nz, [False] * len(out_avals)) for br in branches]
    out_nz = [any(f[1][k] for f in first) for k in range(len(out_avals))]
    new = tuple(p if onz == out_nz else jvp_program(br, nz, out_nz)[0]
                for (p, onz), br in zip(first, branches))
    t_ops = [cast_to(t, tangent_aval(get_aval(p))) for p, t, z in zip(ops, ts, nz) if z]
    outs = cond_bind(index, *ops, *t_ops, branches=new)
    n = len(out_avals)
    it = iter(outs[n:])
    return outs[:n], [next(it) if z else zero_tangent(a) for a, z in zip(out_avals, out_nz)]


cond_p.def_jvp(_cond_jvp)


# --------------------------------------------------------------- batching

def _cond_batch(args, dims, *, branches, _axis_data):
    axis_name, size = _axis_data
    index, ops = args[0], args[1:]
    batched = [d is not None for d in dims[1:]]
    ops = [batching.move_to_front(o, d) if d is not None else o for o, d in zip(ops, dims[1:])]
    n_out = len(branches[0].out_avals)
    if dims[0] is not None and size == 1 and not batching.communicates({"branches": branches}):
        # One element (a process's one device of a mesh): its index is the cond's, and
        # only the branch it takes runs, as unbatched (a pipeline's idle stage idles).
        # Not with communicating collectives in the branches: processes whose indices
        # differ would take different branches and wait for each other's collectives;
        # every branch runs there, as for a larger batch.
        index = structural.reshape(batching.move_to_front(index, dims[0]), ())
        new = tuple(batch_program(br, batched, size, axis_name, [True] * n_out)[0]
                    for br in branches)
        return cond_bind(index, *ops, branches=new), [0] * n_out
    if dims[0] is not None:
        index = batching.move_to_front(index, dims[0])
        return _cond_batch_select(index, ops, batched, branches, size, axis_name), [0] * n_out
    first = [batch_program(br, batched, size, axis_name, [False] * n_out) for br in branches]
    out_b = [any(f[1][k] for f in first) for k in range(n_out)]
    new = tuple(p if ob == out_b else batch_program(br, batched, size, axis_name, out_b)[0]
                for (p, ob), br in zip(first, branches))
    outs = cond_bind(index, *ops, branches=new)
    return outs, [0 if b else None for b in out_b]


def _cond_batch_select(index, operands, batched, branches, size, axis_name):
    """A batched index: run every branch on the whole batch and select per element."""
    n_out = len(branches[0].out_avals)
    results = [batch_eval(br, operands, batched, size, axis_name, [True] * n_out)[0]
               for br in branches]
    dt = get_aval(index).dtype
    ew = elementwise
    index = ew.min(ew.max(index, np.zeros((), dt)), np.full((), len(branches) - 1, dt))
    outs = []
    for k in range(n_out):
        cases = [r[k] for r in results]
        shape = get_aval(cases[0]).shape
        pred = structural.broadcast_in_dim(index, shape, (0,))
        outs.append(elementwise.select_n(pred, *cases) if len(cases) > 1 else cases[0])
    return outs


cond_p.def_batch(_cond_batch)
cond_p.rules.batch_needs_axis = True


# ---------------------------------------------------- partial evaluation

def _cond_partial_eval(eqn, in_unknown):
    """Split a cond into a known cond (known outputs + residuals) and an unknown one.

    Each branch is split with :func:`spmd.compiler.transforms.ad.partial_eval`; all
    branches of the known cond return every branch's residuals, zeros in the
    slots of the other branches.
    """
    # (inner: the pass pipeline, and transforms.ad through it, load spmd.compiler.ops)
    from spmd.compiler.passes.pipeline import dce_program
    from spmd.compiler.transforms.ad import partial_eval

    branches = eqn.params["branches"]
    n_out = len(eqn.outputs)
    if in_unknown[0]:
        return None, eqn, [True] * n_out
    ops_uk = list(in_unknown[1:])
    splits = [partial_eval(br, ops_uk) for br in branches]
    out_uk = [any(s[2][k] for s in splits) for k in range(n_out)]
    # The unknown side of each branch: its residuals + unknown operands -> unknown outputs.
    uk_progs, res_per_branch = [], []
    for known, unknown, _, n_res in splits:
        outs = [a for a, u in zip(unknown.out_atoms, out_uk) if u]
        prog, used = dce_program(Program(unknown.in_vars, unknown.eqns, outs))
        res = [v for v, u in zip(unknown.in_vars[:n_res], used[:n_res]) if u]
        uk_progs.append((prog, unknown.in_vars[n_res:]))
        res_per_branch.append(res)
    slots = [v.aval for res in res_per_branch for v in res]
    # Known branches: known outputs, then every residual slot (zeros for other branches').
    known_branches = []
    offset = 0
    for (known, _, br_uk, n_res), res in zip(splits, res_per_branch):
        kp = known.program
        by_out = iter(kp.out_atoms[:len(kp.out_atoms) - n_res])
        known_outs = [next(by_out) if not u else None for u in br_uk]
        outs = [a for a, u in zip(known_outs, out_uk) if not u]
        eqns = list(kp.eqns)
        for j, aval in enumerate(slots):
            if offset <= j < offset + len(res):
                outs.append(res[j - offset])
            else:
                atom, zeqns = zeros_eqn(aval)
                outs.append(atom)
                eqns += zeqns
        offset += len(res)
        prog, _ = dce_program(Program(kp.in_vars, eqns, outs))
        known_branches.append(ClosedProgram(prog, known.consts))
    res_vars = [Var(a) for a in slots]
    known_ops = [a for a, u in zip(eqn.inputs[1:], ops_uk) if not u]
    known_outs = [o for o, u in zip(eqn.outputs, out_uk) if not u]
    known_eqn = None
    if known_outs or res_vars:
        known_eqn = eqn.replace(inputs=[eqn.inputs[0]] + known_ops,
                                outputs=known_outs + res_vars,
                                params=dict(branches=tuple(known_branches)))
    # Unknown branches: all residual slots (only their own are read) + unknown operands.
    uk_branches = []
    offset = 0
    for (prog, uk_in), res in zip(uk_progs, res_per_branch):
        slot_vars = [Var(a) for a in slots]
        slot_vars[offset:offset + len(res)] = res
        offset += len(res)
        uk_branches.append(ClosedProgram(Program(slot_vars + list(uk_in), prog.eqns,
                                                 prog.out_atoms)))
    uk_ops = [a for a, u in zip(eqn.inputs[1:], ops_uk) if u]
    uk_outs = [o for o, u in zip(eqn.outputs, out_uk) if u]
    unknown_eqn = eqn.replace(inputs=[eqn.inputs[0]] + res_vars + uk_ops, outputs=uk_outs,
                              params=dict(branches=tuple(uk_branches)))
    return known_eqn, unknown_eqn, [True] * len(uk_outs)


cond_p.rules.partial_eval = _cond_partial_eval


# ------------------------------------------------------------- transpose

def _cond_transpose(cts, index, *ops, branches):
    """Transpose each branch w.r.t. the undefined (linear) operands."""
    assert not is_undefined(index)
    linear = [is_undefined(o) for o in ops]
    if not any(linear):
        return [None] * (1 + len(ops))
    ct_nz = [not is_zero(c) for c in cts]
    out_avals = branches[0].out_avals
    new = tuple(transpose_program(br, linear, ct_nz) for br in branches)
    res = [o for o, l in zip(ops, linear) if not l]
    ct_vals = [cast_to(c, ct_aval(a)) for c, a, nz in zip(cts, out_avals, ct_nz) if nz]
    outs = iter(cond_bind(index, *res, *ct_vals, branches=new))
    return [None] + [next(outs) if l else None for l in linear]


cond_p.def_transpose(_cond_transpose)


# ------------------------------------------------------------------- DCE

def _cond_dce(eqn, used_outputs):
    branches = eqn.params["branches"]
    n_ops = len(eqn.inputs) - 1
    pruned = [dce_closed(br, used_outputs) for br in branches]
    used_in = [any(p[1][i] for p in pruned) for i in range(n_ops)]
    if all(used_outputs) and all(used_in):
        return eqn
    new = tuple(drop_inputs(p[0], used_in) for p in pruned)
    return eqn.replace(inputs=[eqn.inputs[0]] + [a for a, u in zip(eqn.inputs[1:], used_in) if u],
                       outputs=[o for o, u in zip(eqn.outputs, used_outputs) if u],
                       params=dict(branches=new))


cond_p.rules.dce = _cond_dce
