"""The partitioner: a global program and the shardings of its inputs and outputs
become a per-device program, literally the body of a ``shard_map``.

Propagation runs forward through the program, one rule per primitive
(:mod:`spmd.shard.partition.rules`), honouring ``with_sharding_constraint``;
where placements meet, :func:`~spmd.shard.partition.reshard.reshard` inserts
the collective that converts them.  Unspecified input shardings are inferred
backward from the first constraint or output sharding the input reaches
unchanged; otherwise inputs are replicated.  Calls (``jit``, ``remat``,
``custom_jvp``/``custom_vjp`` functions) are partitioned through their bodies;
control flow (:mod:`spmd.shard.partition.control`) through its bodies with loop
carries at a fixed point; a nested ``shard_map`` is a fixed point of its specs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmd.compiler.transforms.custom import custom_jvp_call_p, custom_vjp_call_p
from spmd.compiler.core.ir import ClosedProgram, Literal, Var
from spmd.compiler.core.jit import jit_p
from spmd.compiler.ops.structural import broadcast_in_dim_p, iota_p
from spmd.compiler.passes.pipeline import inline_calls
from spmd.compiler.transforms.remat import remat_lin_p, remat_p
from spmd.compiler.core.trace import bind, eval_program
from spmd.shard.partition import registry, rules
from spmd.shard.partition.constraint import sharding_constraint_p
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.registry import (DECISIONS, MissingPartitionRuleError,
                                           PartitionError, Propagate, Replicate,
                                           Structural, Unreachable)
from spmd.shard.partition.reshard import Context, plan, reshard
from spmd.shard.maps.shard_map_rules import shard_map_p, trace_body
from spmd.shard.arrays.spec import PartitionSpec, check_spec
from spmd.collectives.api import axis_index
from spmd.compiler.ops.elementwise import add, convert, mul


class Partitioned(NamedTuple):
    body: ClosedProgram  # the per-device program
    in_specs: tuple
    out_specs: tuple
    notes: list  # reshard.Note, one per inserted collective


def _where(eqn) -> str:
    src = f" at {eqn.source_info}" if eqn.source_info else ""
    return f"{eqn.primitive.name}{src}"


def _valid(pl: Placement, shape, mesh) -> bool:
    if len(pl.dims) != len(shape) or (pl.partial & set(pl.axes)):
        return False
    if len(set(pl.axes)) != len(pl.axes):
        return False
    return all(not a or s % mesh.axis_size(a) == 0 for s, a in zip(shape, pl.dims))


def _with_free_axes(want: Placement, current: Placement, free, shape, mesh) -> Placement:
    """``want`` (a constraint's placement over its explicit axes) with the value's
    current use of the ``free`` (automatic) axes kept where the mesh can hold it: each
    dimension split over its explicit axes, then over the free axes it already had."""
    taken = set(want.axes) | set(want.partial)
    dims = []
    for size, wanted, now in zip(shape, want.dims, current.dims):
        keep = tuple(a for a in now if a in free and a not in taken)
        both = tuple(wanted) + keep
        ok = size % mesh.axis_size(both) == 0 if both else True
        dims.append(both if ok else tuple(wanted))
        if ok:
            taken |= set(keep)
    partial = want.partial | frozenset(a for a in current.partial if a in free and a not in taken)
    return Placement(tuple(dims), partial)


class Evaluator:
    """Evaluates a global program on per-device values, each with its placement,
    under the current trace (the body of the shard_map being traced)."""

    def __init__(self, mesh, ctx: Context, wants: dict | None = None,
                 manual: frozenset = frozenset()):
        self.mesh = mesh
        self.ctx = ctx
        # The manual axes of a partial-manual shard_map body (partition.manual): its
        # collectives run over them; placements use only the other axes.
        self.manual = frozenset(manual)
        # Where values are wanted (backward hints): source primitives such as
        # random_bits compute only their block there (rules_random).
        self.wants = wants or {}
        # (value, placement) of a global variable already resharded: reused, so that
        # a value two equations need alike is communicated once.
        self._resharded: dict = {}

    # ------------------------------------------------------------ one program
    def run(self, closed: ClosedProgram, ins: list) -> list:
        """``ins``: (local value, placement) per non-constant input; returns the same
        per output."""
        program = closed.program
        n = len(closed.consts)
        env: dict = {}
        producers: dict = {}
        for v, c in zip(program.in_vars[:n], closed.consts):
            env[v] = (c, Placement.replicated(np.ndim(c)))
        for v, xp in zip(program.in_vars[n:], ins):
            env[v] = xp

        def read(a):
            if isinstance(a, Literal):
                return a.val, Placement.replicated(np.ndim(a.val))
            return env[a]

        for eqn in program.eqns:
            self.ctx.reason = _where(eqn)
            outs = self.eqn(eqn, [read(a) for a in eqn.inputs], producers, env)
            env.update(zip(eqn.outputs, outs))
            if eqn.primitive is broadcast_in_dim_p or eqn.primitive is iota_p:
                producers[eqn.outputs[0]] = eqn
        return [read(a) for a in program.out_atoms]

    def eqn(self, eqn, ins, producers, env) -> list:
        """One equation, as its primitive's registered decision says."""
        d = _decision(eqn)
        vals = [x for x, _ in ins]
        pls = [p for _, p in ins]
        if type(d) is Structural:
            return d.fn(self, eqn, vals, pls)
        if type(d) is Propagate and d.source is not None:
            res = d.source(self, eqn, vals, pls, self.wants.get(eqn.outputs[0]))
            if res is not None:
                return res
        return self.apply(eqn, vals, pls, producers, env)

    def constraint(self, eqn, vals, pls) -> list:
        """``with_sharding_constraint``: reshard to the constrained placement."""
        if eqn.params["mesh"] != self.mesh:
            raise PartitionError(
                f"with_sharding_constraint at {eqn.source_info}: its sharding is over "
                f"{eqn.params['mesh']} but the program is partitioned over {self.mesh}; "
                "use the mesh of the jit's shardings")
        spec = eqn.params["spec"]
        bad = [a for a in spec.mesh_axes if a in self.manual]
        if bad:
            raise PartitionError(
                f"with_sharding_constraint at {eqn.source_info}: spec {spec} names mesh axis "
                f"{bad[0]!r}, which is manual in this partial-manual shard_map (manual axes "
                f"{sorted(self.manual)}); inside the body a constraint places the block along "
                "the automatic axes only: leave the manual axes out of its spec")
        check_spec(spec, self.mesh, eqn.outputs[0].aval.shape,
                   f"with_sharding_constraint at {eqn.source_info}")
        want = Placement.from_spec(eqn.params["spec"], len(eqn.outputs[0].aval.shape))
        free = eqn.params.get("free", frozenset())
        if free:
            want = _with_free_axes(want, pls[0], free, eqn.outputs[0].aval.shape, self.mesh)
        return [(reshard(vals[0], pls[0], want, self.ctx,
                         _describe(eqn.inputs[0], "a constrained value")), want)]

    def call(self, eqn, vals, pls) -> list:
        """A call (jit, remat, custom_jvp/vjp function): its body, partitioned in place
        (derivative rules were applied before a partitioned program is traced)."""
        return self.run(eqn.params["program"], list(zip(vals, pls)))

    def apply(self, eqn, vals, pls, producers=None, env=None, rule=None) -> list:
        """One first-order equation: its rule (the registered one unless given), the
        reshards it asks for, the local bind."""
        prim = eqn.primitive
        if rule is None:
            d = _decision(eqn)
            rule = d.rule if type(d) is Propagate else rules.replicate_rule
        avals_in = [a.aval for a in eqn.inputs]
        avals_out = [o.aval for o in eqn.outputs]
        res = rule(pls, avals_in, avals_out, self.mesh, **eqn.params)
        wanted, out_pls, params = res[:3]
        post = res[3] if len(res) > 3 else None
        if not all(_valid(p, a.shape, self.mesh) for p, a in zip(wanted, avals_in)) or \
                not all(_valid(p, a.shape, self.mesh) for p, a in zip(out_pls, avals_out)):
            # A placement the mesh cannot hold (a dimension not divisible by its axes'
            # size): the rule's split is impossible here, the whole value is not.
            wanted, out_pls, params = rules.replicate_rule(pls, avals_in, avals_out,
                                                           self.mesh, **eqn.params)
            post = None
        new_vals = []
        for k, (x, p, w, a) in enumerate(zip(vals, pls, wanted, eqn.inputs)):
            new_vals.append(self._input(x, p, w, a, k, eqn, producers, env))
        outs = bind(prim, *new_vals, **params)
        outs = list(outs) if prim.multiple_results else [outs]
        if post is not None:
            outs = post(outs, self.ctx)
        for o, pl, a in zip(outs, out_pls, avals_out):
            expect = pl.local_shape(a.shape, self.mesh)
            if tuple(np.shape(o)) != tuple(expect):
                raise PartitionError(
                    f"internal: the partition rule of {prim.name} produced a block of shape "
                    f"{tuple(np.shape(o))} where placement {pl} of {a} needs {expect}")
        return list(zip(outs, out_pls))

    def _input(self, x, src, dst, atom, k, eqn, producers, env):
        """Input ``k`` of ``eqn`` resharded; a replicated broadcast or iota that only
        needs slicing is recomputed at the local shape instead (no global buffer)."""
        if src == dst:
            return x
        if producers is not None and isinstance(atom, Var) and atom in producers and \
                not src.axes and not src.partial:
            # Zeros are also a pending sum of zeros: no mask needed.
            zeros = _is_zeros(producers[atom])
            steps = plan(src, dst, np.shape(x), 1, self.mesh)
            if steps and all(s.kind == "slice" or (s.kind == "mask" and zeros) for s in steps):
                y = self._recompute(producers[atom], dst, env)
                if y is not None:
                    return y
        key = (atom, dst) if isinstance(atom, Var) else None
        if key in self._resharded:
            return self._resharded[key]
        y = reshard(x, src, dst, self.ctx, _describe(atom, f"input {k} of "
                                                           f"{eqn.primitive.name}"))
        if key is not None:
            self._resharded[key] = y
        return y

    def _recompute(self, eqn, dst: Placement, env):
        shape = dst.local_shape(eqn.outputs[0].aval.shape, self.mesh)
        if eqn.primitive is broadcast_in_dim_p:
            x, pl = env[eqn.inputs[0]] if isinstance(eqn.inputs[0], Var) else \
                (eqn.inputs[0].val, Placement(()))
            bd = eqn.params["broadcast_dimensions"]
            in_shape = eqn.inputs[0].aval.shape
            out_shape = eqn.outputs[0].aval.shape
            want = Placement(tuple(dst.dims[d] if in_shape[i] == out_shape[d] else ()
                                   for i, d in enumerate(bd)))
            if any(dst.dims[d] for i, d in enumerate(bd) if in_shape[i] != out_shape[d]):
                return None
            steps = plan(pl, want, np.shape(x), 1, self.mesh)
            if not all(s.kind == "slice" for s in steps):
                return None  # the operand would need communication
            x = reshard(x, pl, want, self.ctx)
            return bind(eqn.primitive, x, shape=shape, broadcast_dimensions=bd)
        p = eqn.params  # iota: the local iota plus the block's offset
        d = p["dimension"]
        y = bind(eqn.primitive, dtype=p["dtype"], shape=shape, dimension=d)
        if not dst.dims[d]:
            return y
        start = mul(axis_index(dst.dims[d]), np.int32(shape[d]))
        return add(y, convert(start, p["dtype"]))

    # ------------------------------------------------------------ shard_map
    def nested_shard_map(self, eqn, vals, pls):
        """A shard_map inside a partitioned program: its specs are fixed points."""
        p = eqn.params
        if p["mesh"] != self.mesh:
            raise PartitionError(f"a shard_map over {p['mesh']} inside a program partitioned "
                                 f"over {self.mesh}: use one mesh")
        if p.get("manual") is not None:  # partial-manual: split along the other axes
            from spmd.shard.partition.manual import partition_in_program

            return partition_in_program(self, eqn, vals, pls)
        vals = [reshard(x, pl, Placement.from_spec(s, len(a.aval.shape)), self.ctx,
                        _describe(a, "a shard_map input"))
                for x, pl, s, a in zip(vals, pls, p["in_specs"], eqn.inputs)]
        outs = eval_program(p["program"], *vals)
        return [(o, Placement.from_spec(s, len(v.aval.shape)))
                for o, s, v in zip(outs, p["out_specs"], eqn.outputs)]


def _decision(eqn):
    """The registered decision for ``eqn``'s primitive; a missing or unreachable one
    is an error naming the equation (never a silent replication)."""
    d = DECISIONS.get(eqn.primitive)
    if d is None:
        try:
            registry.decision(eqn.primitive)
        except MissingPartitionRuleError as e:
            raise MissingPartitionRuleError(f"{e} (at {_where(eqn)})") from None
    if type(d) is Unreachable:
        raise PartitionError(f"internal: {_where(eqn)} reached the partitioner, where it "
                             f"cannot occur: {d.reason}")
    return d


def _is_zeros(eqn) -> bool:
    a = eqn.inputs[0] if eqn.inputs else None
    return eqn.primitive is broadcast_in_dim_p and isinstance(a, Literal) and \
        not np.any(a.val)


def _describe(atom, role: str) -> str:
    if isinstance(atom, Var):
        return f"{role} (global {atom.aval})"
    return role


def partition(closed: ClosedProgram, mesh, in_specs, out_specs, forbid_gather_bytes=None,
              manual=()):
    """Partition ``closed`` (global) given one PartitionSpec (or None) per input and output.

    ``manual``: the manual axes when ``closed`` is the body of a partial-manual
    shard_map (its values are already blocks along them; only the other axes split)."""
    closed = inline_calls(closed)
    program = closed.program
    n_consts = len(closed.consts)
    args = program.in_vars[n_consts:]
    in_specs = list(in_specs)
    wants = _backward_wants(program, out_specs)
    hints = {v: wants[v] for v in args if v in wants}
    for i, (v, s) in enumerate(zip(args, in_specs)):
        if s is None:
            in_specs[i] = hints.get(v, PartitionSpec())
    for i, (v, s) in enumerate(zip(args, in_specs)):
        check_spec(s, mesh, v.aval.shape, f"in_shardings[{i}] (argument leaf {i}, "
                   f"{v.aval})")
    for i, (a, spec) in enumerate(zip(program.out_atoms, out_specs)):
        if spec is not None:
            if len(spec) > len(a.aval.shape):
                raise PartitionError(
                    f"out_shardings[{i}]: spec {spec} has {len(spec)} entries but output {i} "
                    f"has rank {len(a.aval.shape)} (shape {a.aval.shape}); it cannot be "
                    f"reached: give a spec of at most {len(a.aval.shape)} entries")
            check_spec(spec, mesh, a.aval.shape, f"out_shardings[{i}] (output leaf {i}, "
                       f"{a.aval})")
    in_pls = [Placement.from_spec(s, len(v.aval.shape)) for v, s in zip(args, in_specs)]
    ctx = Context(mesh, forbid_gather_bytes)
    out_pls_box: list = []
    # Results whose explicit type is unreduced (a constraint pins them so) leave as
    # such: their Arrays say so (and hold the sum); any other pending sum is reduced.
    typed_unreduced = {e.outputs[0] for e in program.eqns
                       if e.primitive is sharding_constraint_p and e.params["spec"].unreduced}

    def body(*local_args):
        ev = Evaluator(mesh, ctx, wants, frozenset(manual))
        outs = ev.run(closed, list(zip(local_args, in_pls)))
        results, final = [], []
        for i, ((x, pl), a, spec) in enumerate(zip(outs, program.out_atoms, out_specs)):
            ctx.reason = f"output {i}"
            want = Placement.from_spec(spec, len(a.aval.shape)) if spec is not None else \
                pl if a in typed_unreduced else Placement(pl.dims, reduced=pl.reduced)
            results.append(reshard(x, pl, want, ctx, _describe(a, f"output {i}")))
            final.append(want)
        out_pls_box[:] = final
        return results

    # Untyped: a partial-manual body's types (varying along manual axes) are dropped.
    local_avals = [v.aval.update(shape=pl.local_shape(v.aval.shape, mesh), vma=frozenset(),
                                 reduced=frozenset())
                   for v, pl in zip(args, in_pls)]
    body_prog = trace_body(body, mesh, local_avals, check_vma=False)
    return Partitioned(body_prog, tuple(in_specs),
                       tuple(p.to_spec() for p in out_pls_box), ctx.notes)


def _backward_wants(program, out_specs) -> dict:
    """Specs for values that reach a constraint, a nested shard_map or an output
    through elementwise and shape-preserving equations only (a cheap backward
    propagation)."""
    want: dict = {}
    for a, s in zip(program.out_atoms, out_specs):
        if isinstance(a, Var) and s is not None:
            want.setdefault(a, s)
    for eqn in program.eqns:
        if eqn.primitive is sharding_constraint_p:
            # (A hint, so without unreduced axes: an argument holds a value, not summands.)
            want.setdefault(eqn.inputs[0], PartitionSpec(*eqn.params["spec"]))
        elif eqn.primitive is shard_map_p:
            # A nested shard_map wants its inputs as its in_specs place them: an input
            # given so is sliced once, not resharded inside the body.
            for a, spec in zip(eqn.inputs, eqn.params["in_specs"]):
                if isinstance(a, Var):
                    want.setdefault(a, spec)
    for eqn in reversed(program.eqns):
        spec = next((want[o] for o in eqn.outputs if o in want), None)
        if spec is None or not _specs_flow_back(eqn.primitive):
            continue
        for a in eqn.inputs:
            if isinstance(a, Var) and a.aval.shape == eqn.outputs[0].aval.shape:
                want.setdefault(a, spec)
    return want


def _specs_flow_back(prim) -> bool:
    d = DECISIONS.get(prim)
    return prim is sharding_constraint_p or (type(d) is Propagate and d.specs_flow_back)


TABLE = {
    jit_p: Structural(Evaluator.call),
    remat_p: Structural(Evaluator.call),
    custom_jvp_call_p: Structural(Evaluator.call),
    custom_vjp_call_p: Structural(Evaluator.call),
    shard_map_p: Structural(Evaluator.nested_shard_map),
    sharding_constraint_p: Structural(Evaluator.constraint),
    remat_lin_p: Replicate(
        "the linear part of a linearized remat: produced and consumed by reverse mode, "
        "which has run before a partitioned program is traced; computed whole if met"),
}


__all__ = ["PartitionError", "Partitioned", "partition", "Evaluator"]
