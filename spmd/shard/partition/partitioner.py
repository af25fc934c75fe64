"""The partitioner: a global program and the shardings of its inputs and outputs
become a per-device program, literally the body of a ``shard_map``.

Propagation runs forward through the program, one rule per primitive
(:mod:`spmd.shard.partition.rules`), honouring ``with_sharding_constraint``;
where placements meet, :func:`~spmd.shard.partition.reshard.reshard` inserts
the collective that converts them.  Unspecified input shardings are inferred
backward from the first constraint or output sharding the input reaches
unchanged; otherwise inputs are replicated.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from spmd.compiler.ir import ClosedProgram, Literal, Var
from spmd.compiler.passes import inline_calls
from spmd.compiler.trace import bind
from spmd.errors import SpmdError
from spmd.shard.partition import rules
from spmd.shard.partition.placement import Placement
from spmd.shard.partition.reshard import Context, reshard
from spmd.shard.spec import PartitionSpec, check_spec

rules.install()


class PartitionError(SpmdError, ValueError):
    """Shardings that cannot be honoured (wrong count, mesh, rank...)."""


class Partitioned(NamedTuple):
    body: ClosedProgram  # the per-device program
    in_specs: tuple
    out_specs: tuple
    notes: list  # reshard.Note, one per inserted collective


def _where(eqn) -> str:
    src = f" at {eqn.source_info}" if eqn.source_info else ""
    return f"{eqn.primitive.name}{src}"


def partition(closed: ClosedProgram, mesh, in_specs, out_specs, forbid_gather_bytes=None):
    """Partition ``closed`` (global) given one PartitionSpec (or None) per input and output."""
    from spmd.shard.shard_map import trace_body

    closed = inline_calls(closed)
    program = closed.program
    n_consts = len(closed.consts)
    args = program.in_vars[n_consts:]
    in_specs = list(in_specs)
    hints = _backward_hints(program, n_consts, out_specs)
    for i, (v, s) in enumerate(zip(args, in_specs)):
        if s is None:
            in_specs[i] = hints.get(v, PartitionSpec())
    in_pls = [Placement.from_spec(s, len(v.aval.shape)) for v, s in zip(args, in_specs)]
    for i, (v, s) in enumerate(zip(args, in_specs)):
        check_spec(s, mesh, v.aval.shape, f"in_shardings[{i}]")
    ctx = Context(mesh, forbid_gather_bytes)
    out_pls_box: list = []

    def body(*local_args):
        env: dict = {}
        for v, c in zip(program.in_vars[:n_consts], closed.consts):
            env[v] = (c, Placement.replicated(np.ndim(c)))
        for v, x, pl in zip(args, local_args, in_pls):
            env[v] = (x, pl)

        def read(a):
            if isinstance(a, Literal):
                return a.val, Placement.replicated(np.ndim(a.val))
            return env[a]

        for eqn in program.eqns:
            ins = [read(a) for a in eqn.inputs]
            vals = [x for x, _ in ins]
            pls = [p for _, p in ins]
            ctx.reason = _where(eqn)
            if eqn.primitive.name == "sharding_constraint":
                want = Placement.from_spec(eqn.params["spec"], len(eqn.outputs[0].aval.shape))
                env[eqn.outputs[0]] = (reshard(vals[0], pls[0], want, ctx, "a constrained value"),
                                       want)
                continue
            if eqn.primitive.name == "shard_map":
                outs = _nested_shard_map(eqn, vals, pls, mesh, ctx)
                env.update(zip(eqn.outputs, outs))
                continue
            wanted, out_pls, params = eqn.primitive.partition(
                pls, [a.aval for a in eqn.inputs], [o.aval for o in eqn.outputs], mesh,
                **eqn.params)
            vals = [reshard(x, p, w, ctx, f"an input of {eqn.primitive.name}")
                    for x, p, w in zip(vals, pls, wanted)]
            outs = bind(eqn.primitive, *vals, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outputs, zip(outs, out_pls)))
        results, final = [], []
        for i, (a, spec) in enumerate(zip(program.out_atoms, out_specs)):
            x, pl = read(a)
            ctx.reason = f"output {i}"
            want = Placement.from_spec(spec, len(a.aval.shape)) if spec is not None else \
                pl.without_partial()
            results.append(reshard(x, pl, want, ctx, f"output {i}"))
            final.append(want)
        out_pls_box[:] = final
        return results

    local_avals = [v.aval.update(shape=pl.local_shape(v.aval.shape, mesh))
                   for v, pl in zip(args, in_pls)]
    for i, (a, spec) in enumerate(zip(program.out_atoms, out_specs)):
        if spec is not None:
            if len(spec) > len(a.aval.shape):
                raise PartitionError(
                    f"out_shardings[{i}]: spec {spec} has {len(spec)} entries but output {i} "
                    f"has rank {len(a.aval.shape)} (shape {a.aval.shape}); it cannot be reached")
            check_spec(spec, mesh, a.aval.shape, f"out_shardings[{i}]")
    body_prog = trace_body(body, mesh, local_avals, check_vma=False)
    return Partitioned(body_prog, tuple(in_specs),
                       tuple(p.to_spec() for p in out_pls_box), ctx.notes)


def _nested_shard_map(eqn, vals, pls, mesh, ctx):
    """A shard_map inside a partitioned program: its specs are fixed points."""
    from spmd.compiler.trace import eval_program

    p = eqn.params
    if p["mesh"] != mesh:
        raise PartitionError(f"a shard_map over {p['mesh']} inside a program partitioned over "
                             f"{mesh}: use one mesh")
    vals = [reshard(x, pl, Placement.from_spec(s, len(a.aval.shape)), ctx,
                    "a shard_map input")
            for x, pl, s, a in zip(vals, pls, p["in_specs"], eqn.inputs)]
    outs = eval_program(p["program"], *vals)
    return [(o, Placement.from_spec(s, len(v.aval.shape)))
            for o, s, v in zip(outs, p["out_specs"], eqn.outputs)]


def _backward_hints(program, n_consts, out_specs) -> dict:
    """Specs for inputs that reach a constraint or an output through elementwise and
    shape-preserving equations only (a cheap backward propagation)."""
    hints: dict = {}
    want: dict = {}
    for a, s in zip(program.out_atoms, out_specs):
        if isinstance(a, Var) and s is not None:
            want.setdefault(a, s)
    for eqn in program.eqns:
        if eqn.primitive.name == "sharding_constraint":
            want.setdefault(eqn.inputs[0], eqn.params["spec"])
    for eqn in reversed(program.eqns):
        spec = next((want[o] for o in eqn.outputs if o in want), None)
        if spec is None or eqn.primitive.name not in rules.ELEMENTWISE:
            continue
        for a in eqn.inputs:
            if isinstance(a, Var) and a.aval.shape == eqn.outputs[0].aval.shape:
                want.setdefault(a, spec)
    for v in program.in_vars[n_consts:]:
        if v in want:
            hints[v] = want[v]
    return hints
