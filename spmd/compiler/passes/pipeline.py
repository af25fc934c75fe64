"""Program passes: inlining of nested jit, constant folding, CSE, scalar folding
(:mod:`spmd.compiler.passes.fold`) and DCE.

Each pass maps a :class:`ClosedProgram` to an equivalent one.  ``optimize``
runs them in the order that lets each help the next.
"""

from __future__ import annotations

import weakref

import numpy as np

# fold_reshapes and sum_batched_dots rewrite these primitives by their own semantics
# and params, so they compare the primitive objects (not names, not traits).
from spmd.compiler.ops.linalg import dot_general_p
from spmd.compiler.ops.reduce import reduce_sum_p
from spmd.compiler.ops.structural import reshape_p
from spmd.compiler.passes.fold import fold_scalar_chains, use_counts
from spmd.compiler.core.ir import ClosedProgram, Literal, Program, Var
from spmd.compiler.passes.pads import concat_zero_pads
from spmd.compiler.passes.combine import combine_collectives
from spmd.compiler.core import array_module as _am
from spmd.compiler.engine import fusion, rows, threads
from spmd.compiler.passes.overlap import overlap_collectives
from spmd.compiler.passes.recompute import recompute_elementwise
from spmd.compiler.engine.loops import numba_available as rows_available
from spmd.config import config

# Results larger than this many elements are not folded into constants: the
# saving is small and the program would keep a large buffer alive.
FOLD_LIMIT = 1 << 20


def optimize(closed: ClosedProgram) -> ClosedProgram:
    closed = inline_calls(closed)
    closed = fold_constants(closed)
    closed = cse(closed)
    closed = fold_scalar_chains(closed)
    closed = fold_reshapes(closed)
    closed = sum_batched_dots(closed)
    closed = concat_zero_pads(closed)
    return dce(closed)


def fold_reshapes(closed: ClosedProgram) -> ClosedProgram:
    """``reshape(reshape(x))`` is one reshape, and a reshape to the same shape is ``x``."""
    program = closed.program
    producer: dict = {}
    subst: dict = {}
    eqns = []
    changed = False
    for e in program.eqns:
        inputs = [subst.get(a, a) if isinstance(a, Var) else a for a in e.inputs]
        if e.primitive is reshape_p and isinstance(inputs[0], Var):
            src = inputs[0]
            inner = producer.get(src)
            if inner is not None:  # look through the reshape that made the input
                src = inner
            if tuple(src.aval.shape) == tuple(e.outputs[0].aval.shape):
                subst[e.outputs[0]] = src
                changed = True
                continue
            if src is not inputs[0]:
                changed = True
            producer[e.outputs[0]] = src
            eqns.append(e.replace(inputs=[src]))
            continue
        eqns.append(e.replace(inputs=inputs) if inputs != e.inputs else e)
    if not changed:
        return closed
    outs = [subst.get(a, a) if isinstance(a, Var) else a for a in program.out_atoms]
    return ClosedProgram(Program(program.in_vars, eqns, outs), closed.consts)


# ------------------------------------------------- sums of batched products

def sum_batched_dots(closed: ClosedProgram) -> ClosedProgram:
    """``reduce_sum`` over batch dimensions of a ``dot_general`` becomes contraction.

    ``sum_b (A_b @ B_b)`` is one product contracting over ``b`` too: one large
    matrix product instead of many small ones and a sum.  This is how the
    per-device weight gradients of data parallelism (a batched product over the
    stacked devices, then the psum's sum over them) become one product.
    """
    program = closed.program
    uses = use_counts(program)
    producer = {o: e for e in program.eqns for o in e.outputs}
    new_dot: dict = {}  # dot equation -> its rewritten form (kept at its position)
    new_sum: dict = {}  # reduce_sum equation -> its rewritten form, or None when absorbed
    for e in program.eqns:
        x = e.inputs[0] if e.primitive is reduce_sum_p else None
        dot = producer.get(x)
        if dot is None or dot.primitive is not dot_general_p or uses.get(x) != 1:
            continue
        (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
        moved = [k for k in e.params["axes"] if k < len(lb)]
        if not moved:
            continue
        dn = ((tuple(lc) + tuple(lb[k] for k in moved), tuple(rc) + tuple(rb[k] for k in moved)),
              (tuple(b for k, b in enumerate(lb) if k not in moved),
               tuple(b for k, b in enumerate(rb) if k not in moved)))
        rest = tuple(a - sum(m < a for m in moved) for a in e.params["axes"] if a not in moved)
        shape = tuple(s for i, s in enumerate(x.aval.shape) if i not in moved)
        out = Var(x.aval.update(shape=shape)) if rest else e.outputs[0]
        new_dot[dot] = dot.replace(outputs=[out], params={**dot.params, "dimension_numbers": dn})
        new_sum[e] = e.replace(inputs=[out], params={**e.params, "axes": rest}) if rest else None
    if not new_dot:
        return closed
    final = []
    for e in program.eqns:
        if e in new_dot:
            final.append(new_dot[e])
        elif e in new_sum:
            if new_sum[e] is not None:
                final.append(new_sum[e])
        else:
            final.append(e)
    return ClosedProgram(Program(program.in_vars, final, program.out_atoms), closed.consts)


# ------------------------------------------------------------------ inlining

def lower_for_execution(closed: ClosedProgram) -> ClosedProgram:
    """Inline equations whose primitive has a ``lower`` rule (e.g. ``shard_map`` on the
    local backend becomes array code over all simulated devices), re-optimise, then
    start combinable collectives early in buckets and wait where their results are
    needed (:mod:`spmd.compiler.passes.overlap`; ``spmd.config.overlap_bucket_bytes``, 0 turns
    it off), and combine the remaining independent collectives
    (:mod:`spmd.compiler.passes.combine`; the bucket size is
    ``spmd.config.combine_collectives_bytes``, 0 disables both), then fuse chains of
    elementwise equations into kernels (:mod:`spmd.compiler.engine.fusion`;
    ``spmd.config.fuse_elementwise``).

    The printed program keeps those equations; only the executed code is lowered
    (``Lowered.as_text(executed=True)`` prints it).
    """
    if any(e.primitive.rules.lower for e in closed.program.eqns):
        closed = optimize(inline_calls(closed, "lower"))
    if config.combine_collectives_bytes:
        # Overlapped buckets are combined too: never larger than combining allows.
        closed = overlap_collectives(closed, min(config.overlap_bucket_bytes,
                                                 config.combine_collectives_bytes))
    closed = combine_collectives(closed, config.combine_collectives_bytes)
    loops = config.fuse_elementwise and config.compile_kernels and \
        _am.current() is np and rows_available()
    if config.recompute_elementwise:
        closed = dce(recompute_elementwise(closed, views=loops))
    if loops:
        # (The reshapes and broadcasts whose operands the loops now read directly
        # are left without readers.)
        closed = dce(rows.fuse_rows(closed))
    if config.fuse_elementwise:
        if _am.current() is not np:  # a GPU: every group of two or more is one launch
            closed = fusion.fuse_elementwise(closed, min_kernel_ns=0)
        elif threads.threads_help() or loops:
            # Blocked kernels only where threads help; compiled loops wherever numba is.
            closed = fusion.fuse_elementwise(closed, blocked=threads.threads_help(),
                                             loops=loops)
    return closed


def inline_calls(closed: ClosedProgram, rule: str = "inline") -> ClosedProgram:
    """Replace nested ``jit`` equations (or those with the given rule) by their bodies."""
    if not any(getattr(e.primitive.rules, rule) for e in closed.program.eqns):
        return closed
    program = closed.program
    consts = list(closed.consts)
    const_vars = list(program.in_vars[:len(consts)])
    subst: dict = {}

    def read(a):
        return subst.get(a, a) if isinstance(a, Var) else a

    eqns = []
    for eqn in program.eqns:
        inline = getattr(eqn.primitive.rules, rule)
        if inline is None:
            eqns.append(eqn.replace(inputs=[read(a) for a in eqn.inputs]))
            continue
        inner = inline_calls(inline(eqn), rule)
        ip = inner.program
        ren: dict = {}
        for v, val in zip(ip.in_vars[:len(inner.consts)], inner.consts):
            nv = Var(v.aval)
            const_vars.append(nv)
            consts.append(val)
            ren[v] = nv
        for v, a in zip(ip.in_vars[len(inner.consts):], eqn.inputs):
            ren[v] = read(a)

        def rd(a, ren=ren):
            return ren.get(a, a) if isinstance(a, Var) else a

        for e in ip.eqns:
            outs = [Var(v.aval) for v in e.outputs]
            ren.update(zip(e.outputs, outs))
            eqns.append(e.replace(inputs=[rd(a) for a in e.inputs], outputs=outs))
        for v, a in zip(eqn.outputs, ip.out_atoms):
            subst[v] = rd(a)
    n = len(closed.consts)
    new = Program(const_vars + program.in_vars[n:], eqns, [read(a) for a in program.out_atoms])
    return ClosedProgram(new, consts)


# ---------------------------------------------------------- constant folding

def fold_constants(closed: ClosedProgram) -> ClosedProgram:
    """Evaluate equations whose inputs are all known at compile time."""
    program = closed.program
    n = len(closed.consts)
    known: dict = dict(zip(program.in_vars[:n], closed.consts))
    subst: dict = {}
    eqns = []
    new_consts: dict = {}

    def value(a):
        return a.val if isinstance(a, Literal) else known[a]

    for eqn in program.eqns:
        inputs = [subst.get(a, a) if isinstance(a, Var) else a for a in eqn.inputs]
        prim = eqn.primitive
        # Collectives depend on the device they run on: never folded.
        foldable = (not prim.effectful and not prim.higher_order and prim.impl is not None
                    and not prim.rules.batch_needs_axis
                    and all(isinstance(a, Literal) or a in known for a in inputs)
                    and all(o.aval.size <= FOLD_LIMIT for o in eqn.outputs))
        if not foldable:
            eqns.append(eqn.replace(inputs=inputs) if inputs != eqn.inputs else eqn)
            continue
        outs = prim.impl(np, *map(value, inputs), **eqn.params)
        if not prim.multiple_results:
            outs = [outs]
        for v, val in zip(eqn.outputs, outs):
            val = np.asarray(val, dtype=v.aval.dtype)
            if val.ndim == 0:
                subst[v] = Literal(val[()], v.aval)
            else:
                known[v] = val
                new_consts[v] = val
    if not new_consts and not subst:
        return closed
    outs = [subst.get(a, a) if isinstance(a, Var) else a for a in program.out_atoms]
    # Constants no longer used by any equation are dropped by DCE below.
    const_vars = program.in_vars[:n] + list(new_consts)
    consts = list(closed.consts) + list(new_consts.values())
    return ClosedProgram(Program(const_vars + program.in_vars[n:], eqns, outs), consts)


# ----------------------------------------------------------------------- CSE

def _atom_key(a):
    if isinstance(a, Literal):
        return ("lit", a.aval.dtype, a.aval.weak_type, np.asarray(a.val).item())
    return a


def cse(closed: ClosedProgram) -> ClosedProgram:
    """Merge equations that apply the same primitive to the same inputs."""
    program = closed.program
    subst: dict = {}
    seen: dict = {}
    eqns = []
    for eqn in program.eqns:
        inputs = [subst.get(a, a) if isinstance(a, Var) else a for a in eqn.inputs]
        if has_effects(eqn):
            eqns.append(eqn.replace(inputs=inputs))
            continue
        try:
            key = (eqn.primitive, tuple(map(_atom_key, inputs)),
                   tuple(sorted(eqn.params.items(), key=lambda kv: kv[0])))
            hash(key)
        except TypeError:
            key = None
        prev = seen.get(key) if key is not None else None
        if prev is not None:
            subst.update(zip(eqn.outputs, prev.outputs))
            continue
        new = eqn.replace(inputs=inputs)
        if key is not None:
            seen[key] = new
        eqns.append(new)
    if not subst:
        return closed
    outs = [subst.get(a, a) if isinstance(a, Var) else a for a in program.out_atoms]
    return ClosedProgram(Program(program.in_vars, eqns, outs), closed.consts)


# ----------------------------------------------------------------------- DCE

_effects_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def has_effects(eqn) -> bool:
    """Whether ``eqn`` is effectful or holds a sub-program that is (a print inside a
    jit, shard_map or loop body must not be dropped or merged with another)."""
    if eqn.primitive.effectful:
        return True
    if not eqn.primitive.higher_order:
        return False
    return any(_value_effects(v) for v in eqn.params.values())


def _value_effects(v) -> bool:
    if isinstance(v, ClosedProgram):
        hit = _effects_cache.get(v)
        if hit is None:
            hit = _effects_cache[v] = any(has_effects(e) for e in v.program.eqns)
        return hit
    if isinstance(v, Program):
        return any(has_effects(e) for e in v.eqns)
    if isinstance(v, (tuple, list)):
        return any(_value_effects(x) for x in v)
    return False


def dce_program(program: Program, used_outputs=None) -> tuple[Program, list[bool]]:
    """Remove equations whose results are unused; return (program, used inputs)."""
    outs = program.out_atoms if used_outputs is None else \
        [a for a, u in zip(program.out_atoms, used_outputs) if u]
    live = {a for a in outs if isinstance(a, Var)}
    kept = []
    for eqn in reversed(program.eqns):
        dce_rule = eqn.primitive.rules.dce
        if has_effects(eqn) or any(o in live for o in eqn.outputs):
            if dce_rule is not None:
                eqn = dce_rule(eqn, [o in live for o in eqn.outputs])
            kept.append(eqn)
            live.update(a for a in eqn.inputs if isinstance(a, Var))
    kept.reverse()
    used = [v in live for v in program.in_vars]
    return Program(program.in_vars, kept, outs), used


def dce(closed: ClosedProgram) -> ClosedProgram:
    """DCE that also drops unused constants (never arguments)."""
    program, used = dce_program(closed.program)
    n = len(closed.consts)
    keep = [i for i in range(n) if used[i]]
    if len(keep) == n:
        return ClosedProgram(program, closed.consts)
    in_vars = [program.in_vars[i] for i in keep] + program.in_vars[n:]
    return ClosedProgram(Program(in_vars, program.eqns, program.out_atoms),
                         [closed.consts[i] for i in keep])
