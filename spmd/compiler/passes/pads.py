"""Zero pads added together are a concatenation.

The transpose of taking slices (``q, k, v = qkv[0], qkv[1], qkv[2]``) pads each slice's
cotangent with zeros to the whole operand's shape and adds them up: three arrays of
the whole size written, then read back and summed.  When the windows of the pads are
adjacent along one axis, the sum is the concatenation of the pieces: one write of the
whole size.  And when the only reader of a concatenation is a transposition (the
einsum ``"btd,dchk->cbhtk"`` reads its cotangent transposed back), the pieces are
transposed (views) and concatenated in the transposed layout, so that the reader gets
a contiguous array (the weight-gradient products then read it in place, with no copy).

Each rewrite compares the primitive objects it is about (``add``, ``pad``,
``concatenate``, ``transpose``), as :func:`spmd.compiler.passes.pipeline.fold_reshapes` does:
they rest on those primitives' own meaning and params.  The numbers are those of the
pads and adds (``x + 0`` is ``x``; only a negative zero in a piece becomes ``+0.0``
through the adds, and stays ``-0.0`` concatenated).
"""

from __future__ import annotations

from spmd.compiler.passes.fold import use_counts
from spmd.compiler.core.ir import ClosedProgram, Eqn, Literal, Program, Var
from spmd.compiler.ops.elementwise import add_p
from spmd.compiler.ops.slicing import concatenate_p, pad_p
from spmd.compiler.ops.structural import transpose_p


def _zero_pad_window(eqn, uses):
    """``(axis, lo, hi, operand)`` of a single-use zero pad of one axis (no interior
    padding, no cropping), else None."""
    if eqn is None or eqn.primitive is not pad_p or uses.get(eqn.outputs[0], 0) != 1:
        return None
    value = eqn.inputs[1]
    if not isinstance(value, Literal) or value.val != 0:
        return None
    padded = [(d, lo, hi) for d, (lo, hi, interior) in enumerate(eqn.params["padding_config"])
              if (lo, hi, interior) != (0, 0, 0)]
    if len(padded) != 1:
        return None
    d, lo, hi = padded[0]
    if lo < 0 or hi < 0 or eqn.params["padding_config"][d][2] != 0:
        return None
    return d, lo, hi, eqn.inputs[0]


def _add_leaves(eqn, producer, uses):
    """The operands of the tree of adds rooted at ``eqn`` (through single-use adds of
    the same shape), and those inner adds."""
    leaves, adds = [], []
    for a in eqn.inputs:
        inner = producer.get(a) if isinstance(a, Var) else None
        if inner is not None and inner.primitive is add_p and uses.get(a, 0) == 1 and \
                a.aval.shape == eqn.outputs[0].aval.shape:
            sub, more = _add_leaves(inner, producer, uses)
            leaves += sub
            adds += [inner] + more
        else:
            leaves.append(a)
    return leaves, adds


def _concat_var(pieces, axis, like: Var) -> Var:
    shape = list(pieces[0].aval.shape)
    shape[axis] = sum(p.aval.shape[axis] for p in pieces)
    return Var(like.aval.update(shape=tuple(shape)))


def _rewrite_once(eqns, out_atoms):
    """One rewrite (the new equation list), or None when there is none to make."""
    uses = use_counts(Program([], eqns, out_atoms))
    producer = {v: e for e in eqns for v in e.outputs}
    for i, e in enumerate(eqns):
        if e.primitive is add_p:
            leaves, adds = _add_leaves(e, producer, uses)
            wins = [_zero_pad_window(producer.get(a) if isinstance(a, Var) else None, uses)
                    for a in leaves]
            if len(leaves) < 2 or any(w is None for w in wins) or \
                    len({w[0] for w in wins}) != 1:
                continue
            axis, size = wins[0][0], e.outputs[0].aval.shape[wins[0][0]]
            wins.sort(key=lambda w: w[1])  # by where each window starts
            if any(size - a[2] != b[1] for a, b in zip(wins, wins[1:])):
                continue  # overlapping, or a gap of zeros between two windows
            lo, hi, pieces = wins[0][1], wins[-1][2], [w[3] for w in wins]
            out = e.outputs[0]
            dead = set(adds) | {producer[a] for a in leaves}  # read by this sum only
            if lo == hi == 0:
                return _replace(eqns, i, [Eqn(concatenate_p, pieces, [out],
                                              {"dimension": axis}, e.source_info)], dead)
            cat = _concat_var(pieces, axis, out)
            config = tuple((lo, hi, 0) if d == axis else (0, 0, 0)
                           for d in range(len(out.aval.shape)))
            zero = producer[leaves[0]].inputs[1]
            new = [Eqn(concatenate_p, pieces, [cat], {"dimension": axis}, e.source_info),
                   Eqn(pad_p, [cat, zero], [out], {"padding_config": config}, e.source_info)]
            return _replace(eqns, i, new, dead)
        if e.primitive is concatenate_p:  # a single-use concatenation inside: flatten
            axis = e.params["dimension"]
            for k, a in enumerate(e.inputs):
                inner = producer.get(a) if isinstance(a, Var) else None
                if inner is not None and inner.primitive is concatenate_p and \
                        inner.params["dimension"] == axis and uses.get(a, 0) == 1:
                    ins = list(e.inputs[:k]) + list(inner.inputs) + list(e.inputs[k + 1:])
                    return _replace(eqns, i, [e.replace(inputs=ins)], {inner})
        if e.primitive is transpose_p and isinstance(e.inputs[0], Var):
            cat = producer.get(e.inputs[0])
            if cat is None or cat.primitive is not concatenate_p or \
                    uses.get(e.inputs[0], 0) != 1:
                continue
            perm = e.params["permutation"]
            axis = perm.index(cat.params["dimension"])
            new, pieces = [], []
            for a in cat.inputs:
                shape = tuple(a.aval.shape[p] for p in perm)
                v = Var(a.aval.update(shape=shape))
                new.append(Eqn(transpose_p, [a], [v], {"permutation": perm}, e.source_info))
                pieces.append(v)
            new.append(Eqn(concatenate_p, pieces, list(e.outputs), {"dimension": axis},
                           e.source_info))
            return _replace(eqns, i, new, {cat})
    return None


def _replace(eqns, i, new, dead):
    """``eqns`` with equation ``i`` replaced by ``new`` and the equations ``dead`` (whose
    only reader it was) removed: use counts stay exact for the next rewrite."""
    return [x for x in eqns[:i] if x not in dead] + new + \
        [x for x in eqns[i + 1:] if x not in dead]


def concat_zero_pads(closed: ClosedProgram) -> ClosedProgram:
    """``closed`` with adds of adjacent zero pads made concatenations, nested
    single-use concatenations flattened, and a transposition that is a
    concatenation's only reader moved onto the pieces (see the module docstring).

    >>> concat_zero_pads(closed)  # doctest: +SKIP
    """
    program = closed.program
    if not any(e.primitive is pad_p or e.primitive is concatenate_p for e in program.eqns):
        return closed
    eqns = list(program.eqns)
    changed = False
    while True:
        new = _rewrite_once(eqns, program.out_atoms)
        if new is None:
            break
        eqns, changed = new, True
    if not changed:
        return closed
    return ClosedProgram(Program(program.in_vars, eqns, program.out_atoms), closed.consts)
