"""The ``shard_map`` primitive and its transformation rules (JEP 14273).

``shard_map(f, ...)`` (:mod:`spmd.shard.maps.shard_map`) traces ``f`` once on
per-device block types and binds the higher-order primitive ``shard_map``,
whose parameter is that per-device program.  Its rules keep the per-device
structure under every transformation: the jvp, the two halves of partial
evaluation, the transpose and the batched form of a ``shard_map`` are
``shard_map``s again.  Executing it on local values runs the body stacked per
device (:mod:`spmd.shard.maps.stacked`); how an eager one, or a program holding
one over processes, runs on placed values is the call path's (its execution
rules are in :mod:`spmd.shard.call.dispatch`).

>>> shard_map_p.bind(x, program=body, mesh=mesh, in_specs=(P("i"),),
...                  out_specs=(P(),), check_vma=True)   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from spmd.collectives.api import psum
from spmd.collectives.primitives import as_summands, pvary_p
from spmd.compiler.core import dtypes
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.core.ir import ClosedProgram, Eqn, Program, Var
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import (bind, eval_program, extend_axis_env, get_aval,
                                      trace_to_program)
from spmd.compiler.ops.elementwise import div
from spmd.compiler.ops.structural import reshape_p
from spmd.compiler.passes.pipeline import dce_program
from spmd.compiler.transforms.ad import backward_pass, jvp_flat, partial_eval
from spmd.compiler.transforms.ad_util import Zero, instantiate, is_undefined
from spmd.compiler.transforms.batching import (active_spmd_axis_names, batch_flat,
                                               collective_axes, move_to_front)
from spmd.shard.arrays.sharded import placed
from spmd.shard.arrays.spec import (NamedSharding, PartitionSpec, block_shape, ct_spec,
                                     global_shape)
from spmd.shard.explicit.mesh_context import in_body
from spmd.shard.maps.args import ShardMapError
from spmd.shard.maps.stacked import executable, local_program

shard_map_p = Primitive("shard_map", traits=(), multiple_results=True, higher_order=True)


# ------------------------------------------------------------- tracing a body

def trace_body(fun: Callable, mesh, in_avals, check_vma: bool, axes=None) -> ClosedProgram:
    """Trace ``fun`` on per-device avals with the mesh axes (or just ``axes``, the
    manual ones of a partial-manual shard_map) in scope."""
    scope = dict(mesh.shape) if axes is None else {a: mesh.shape[a] for a in axes}
    with extend_axis_env(scope, track_vma=check_vma, manual=True), in_body(mesh, axes):
        return trace_to_program(fun, in_avals)


def _bind_body(closed: ClosedProgram, args, mesh, in_specs, out_specs, check_vma,
               manual=None):
    """Bind shard_map, passing the body's constants as replicated inputs.  ``manual``:
    the manual axes of a partial-manual body (whole along the other axes, which the
    partitioner splits: :mod:`spmd.shard.partition.manual`)."""
    n = len(closed.consts)
    program = ClosedProgram(closed.program, [])
    extra = {} if manual is None else {"manual": tuple(manual)}
    return bind(shard_map_p, *closed.consts, *args, program=program, mesh=mesh,
                in_specs=(PartitionSpec(),) * n + tuple(in_specs), out_specs=tuple(out_specs),
                check_vma=check_vma, **extra)


def reshape_eqn(src: Var, dst: Var) -> Eqn:
    return Eqn(reshape_p, [src], [dst], {"new_sizes": dst.aval.shape})


def _block_aval(aval: ShapedArray, spec, mesh, check_vma, bound=None) -> ShapedArray:
    """A device's block of ``aval``: varying along its spec's axes, and along the axes
    of an enclosing shard_map it already varies along that this one does not bind
    (``bound``: a partial-manual shard_map nested in another binds only its own manual
    axes, and the enclosing one's stay in scope: a ``psum`` over them in the inner body
    is a real one, not the axis size times an invariant value)."""
    vma = frozenset(spec.mesh_axes) if check_vma else frozenset()
    unreduced = spec.unreduced if check_vma else frozenset()
    reduced = spec.reduced if check_vma else frozenset()
    if bound is not None:
        vma |= aval.vma - bound
    return ShapedArray(block_shape(spec, mesh, aval.shape), aval.dtype, aval.weak_type,
                       vma | unreduced, unreduced, reduced)



# ------------------------------------------------------------------- rules

@shard_map_p.def_abstract_eval
def _shard_map_aval(*avals, program, mesh, in_specs, out_specs, check_vma, manual=None):
    return [ShapedArray(global_shape(s, mesh, a.shape), a.dtype, a.weak_type)
            for a, s in zip(program.out_avals, out_specs)]


@shard_map_p.def_impl
def _shard_map_impl(xp, *args, program, mesh, in_specs, out_specs, check_vma, manual=None):
    if manual is not None:  # partial-manual, not partitioned: split it here
        p = _split({"program": program, "mesh": mesh, "in_specs": in_specs,
                    "out_specs": out_specs, "check_vma": check_vma, "manual": manual}, args)
        program, in_specs, out_specs = p["program"], p["in_specs"], p["out_specs"]

    return executable(program, mesh, in_specs, out_specs, xp)(*args)


def _lower(eqn):
    p = _split(eqn.params)
    return local_program(p["program"], p["mesh"], p["in_specs"], p["out_specs"])


def _split(params, args=None):
    """Params of a shard_map equation with a partial-manual body split along the
    automatic axes (unchanged for a full-manual one)."""
    if params.get("manual") is None:
        return params
    from spmd.shard.partition.manual import split_params

    return split_params(params, args)


shard_map_p.rules.lower = _lower



@shard_map_p.def_jvp
def _shard_map_jvp(primals, tangents, *, program, mesh, in_specs, out_specs, check_vma,
                   manual=None):
    nz = [not isinstance(t, Zero) for t in tangents]
    n = len(primals)
    out_nz: list = []

    def body(*args):
        ps, ts = list(args[:n]), iter(args[n:])
        tin = [next(ts) if z else Zero(tangent_aval(a)) for a, z in zip(program.in_avals, nz)]
        out_p, out_t = jvp_flat(lambda *a: eval_program(program, *a), ps, tin)
        out_nz[:] = [not isinstance(t, Zero) for t in out_t]
        return out_p + [t for t in out_t if not isinstance(t, Zero)]

    in_avals = list(program.in_avals) + [tangent_aval(a) for a, z in zip(program.in_avals, nz)
                                         if z]
    closed = trace_body(body, mesh, in_avals, check_vma, manual)
    t_specs = [s for s, z in zip(in_specs, nz) if z]
    out_t_specs = [s for s, z in zip(out_specs, out_nz) if z]
    outs = _bind_body(closed, list(primals) + [t for t in tangents if not isinstance(t, Zero)],
                      mesh, list(in_specs) + t_specs, list(out_specs) + out_t_specs, check_vma,
                      manual)
    n_out = len(out_specs)
    it = iter(outs[n_out:])
    out_t = [next(it) if z else Zero(tangent_aval(get_aval(o)))
             for z, o in zip(out_nz, outs[:n_out])]
    return outs[:n_out], out_t


def _batched_spec(spec, batch_entry, spmd_name, where, fname):
    """``spec`` with the batch dimension in front, split over ``batch_entry``; a spec
    that names a mapped mesh axis already is an error, as in JAX (its blocks would be
    split over that axis twice)."""
    used = [a for a in spec.mesh_axes if a in (spmd_name or ())]
    if used:
        raise ShardMapError(f"{fname}: vmap spmd_axis_name {tuple(spmd_name)} cannot appear "
                            f"in the shard_map's {where} (axis {used[0]!r} is used in "
                            f"{spec}); map over another mesh axis")
    return PartitionSpec(batch_entry, *spec, unreduced=spec.unreduced, reduced=spec.reduced)


def _residual_spec(aval, mesh, check_vma, manual=None):
    """Residuals leave a body with one block per device that can differ: a new
    leading axis split over the mesh axes the value varies along (of a partial-manual
    body, the manual ones: it is whole along the others)."""
    if check_vma:
        names = mesh.axis_names if manual is None else tuple(manual)
        return tuple(a for a in names if a in aval.vma)
    # Untyped: every axis holding copies (the batch dimension an enclosing vmap adds
    # takes the axes it splits its batch over).
    return _untyped_copy_axes(mesh, manual)


def _untyped_copy_axes(mesh, manual=None) -> tuple:
    """The axes along which an untyped (check_vma=False) body's devices may hold copies
    of one value: the manual ones, but those an enclosing ``vmap(spmd_axis_name=...)``
    splits its batch over, whose devices hold different batch elements (as JAX, which
    leaves them out too)."""
    names = mesh.axis_names if manual is None else tuple(manual)
    spmd_names = active_spmd_axis_names()
    return tuple(a for a in names if a not in spmd_names)


def _shard_map_partial_eval(eqn, in_unknown):
    p = eqn.params
    program, mesh, check_vma = p["program"], p["mesh"], p["check_vma"]
    known, unknown, out_unknown, n_res = partial_eval(program, in_unknown)
    kp = known.program
    n_known_out = len(kp.out_atoms) - n_res
    lin_outs = [a for a, u in zip(unknown.out_atoms, out_unknown) if u]
    lin_prog, used = dce_program(Program(unknown.in_vars, unknown.eqns, lin_outs))
    residuals = [r for r, u in zip(unknown.in_vars[:n_res], used[:n_res]) if u]
    # A residual that is ``pvary(v)`` of a known v is saved as v (one copy where v is
    # invariant, not one per device) and marked varying again in the backward body.
    producers = {o: e for e in kp.eqns for o in e.outputs}
    revary = []
    saved = []
    for r in residuals:
        e = producers.get(r)
        if e is not None and e.primitive is pvary_p and isinstance(e.inputs[0], Var):
            revary.append(e)
            r = e.inputs[0]
        if r not in saved:
            saved.append(r)
    residuals = saved
    # Each residual leaves the known body with a leading axis of size 1 per device,
    # split over the axes it varies along (or as is, when it varies along none).
    res_axes = [_residual_spec(r.aval, mesh, check_vma, p.get("manual")) for r in residuals]
    k_out_eqns, k_out_vars, u_in_eqns, u_in_vars, res_specs = [], [], [], [], []
    in_specs, out_specs = p["in_specs"], p["out_specs"]
    known_outer = [a for a, u in zip(eqn.inputs, in_unknown) if not u]
    known_specs = [s for s, u in zip(in_specs, in_unknown) if not u]
    forwarded = {}  # residuals that are inputs of the body: pass the outer value on
    for r, axes in zip(residuals, res_axes):
        if r in kp.in_vars:
            i = kp.in_vars.index(r)
            forwarded[r] = (known_outer[i], known_specs[i])
            u_in_vars.append(r)
            continue
        if axes:
            expanded = Var(r.aval.update(shape=(1,) + r.aval.shape))
            k_out_eqns.append(reshape_eqn(r, expanded))
            k_out_vars.append(expanded)
            inp = Var(expanded.aval)
            u_in_eqns.append(reshape_eqn(inp, r))
            u_in_vars.append(inp)
            res_specs.append(PartitionSpec(axes))
        else:
            k_out_vars.append(r)
            u_in_vars.append(r)
            res_specs.append(PartitionSpec())
    known_body = ClosedProgram(Program(kp.in_vars, kp.eqns + k_out_eqns,
                                       kp.out_atoms[:n_known_out] + k_out_vars), known.consts)
    assert not known.consts
    unknown_body = ClosedProgram(Program(u_in_vars + unknown.in_vars[n_res:],
                                         u_in_eqns + revary + lin_prog.eqns,
                                         lin_prog.out_atoms), [])
    known_out_specs = tuple(s for s, u in zip(out_specs, out_unknown) if not u) + \
        tuple(res_specs)
    res_outer = [Var(ShapedArray(global_shape(s, mesh, v.aval.shape), v.aval.dtype))
                 for s, v in zip(res_specs, k_out_vars)]
    known_eqn = Eqn(shard_map_p, known_outer,
                    [o for o, u in zip(eqn.outputs, out_unknown) if not u] + res_outer,
                    {**p, "program": known_body, "in_specs": tuple(known_specs),
                     "out_specs": known_out_specs}, eqn.source_info)
    # The unknown body reads residuals in the order of u_in_vars.
    it_out, it_spec = iter(res_outer), iter(res_specs)
    res_args, res_in_specs = [], []
    for r in residuals:
        if r in forwarded:
            res_args.append(forwarded[r][0])
            res_in_specs.append(forwarded[r][1])
        else:
            res_args.append(next(it_out))
            res_in_specs.append(next(it_spec))
    unknown_eqn = Eqn(shard_map_p, res_args + [a for a, u in zip(eqn.inputs, in_unknown) if u],
                      [o for o, u in zip(eqn.outputs, out_unknown) if u],
                      {**p, "program": unknown_body,
                       "in_specs": tuple(res_in_specs) + tuple(
                           s for s, u in zip(in_specs, in_unknown) if u),
                       "out_specs": tuple(s for s, u in zip(out_specs, out_unknown) if u)},
                      eqn.source_info)
    return known_eqn, unknown_eqn, out_unknown


shard_map_p.rules.partial_eval = _shard_map_partial_eval


@shard_map_p.def_transpose
def _shard_map_transpose(cts, *args, program, mesh, in_specs, out_specs, check_vma,
                         manual=None):
    lin = [is_undefined(a) for a in args]
    res_vals = [a for a, l in zip(args, lin) if not l]
    nz = [not isinstance(c, Zero) for c in cts]
    body_prog = program.program
    in_vars = body_prog.in_vars
    res_vars = [v for v, l in zip(in_vars, lin) if not l]
    lin_vars = [v for v, l in zip(in_vars, lin) if l]
    reordered = Program(res_vars + lin_vars, body_prog.eqns, body_prog.out_atoms)
    lin_specs = [s for s, l in zip(in_specs, lin) if l]
    n_res = len(res_vars)
    # A partial-manual body is whole along its automatic axes: only the manual ones
    # hold copies whose cotangents are shared or summed.
    names = (mesh.axis_names if manual is None else tuple(manual)) if check_vma else \
        _untyped_copy_axes(mesh, manual)

    def body(*xs):
        res, it = list(xs[:n_res]), iter(xs[n_res:])
        cts_in = [_out_ct(next(it), a, spec, mesh, check_vma, names) if z
                  else Zero(tangent_aval(a))
                  for a, z, spec in zip(program.out_avals, nz, out_specs)]
        cts_out = backward_pass(reordered, res, [v.aval for v in lin_vars], cts_in)
        outs = []
        for ct, v, spec in zip(cts_out, lin_vars, lin_specs):
            ct = instantiate(ct) if isinstance(ct, Zero) else ct
            # A value the input was broadcast to must have its cotangent summed back;
            # a reduced input's cotangent leaves as the devices' summands (unreduced).
            # An unreduced input's summands each have the whole cotangent (not summed).
            extra = tuple(a for a in names if a not in spec.mesh_axes and a not in spec.reduced
                          and a not in spec.unreduced and (a in get_aval(ct).vma or not check_vma))
            ct = psum(ct, extra) if extra else ct
            kept = tuple(a for a in names if a in spec.reduced)
            outs.append(as_summands(ct, kept) if kept and check_vma else ct)
        return outs

    in_avals = [v.aval for v in res_vars] + [_ct_aval(a, s, check_vma) for a, z, s in
                                             zip(program.out_avals, nz, out_specs) if z]
    closed = trace_body(body, mesh, in_avals, check_vma, manual)
    res_specs = [s for s, l in zip(in_specs, lin) if not l]
    ct_specs = [ct_spec(s) for s, z in zip(out_specs, nz) if z]
    outs = _bind_body(closed, res_vals + [c for c in cts if not isinstance(c, Zero)], mesh,
                      res_specs + ct_specs, [ct_spec(s) for s in lin_specs], check_vma,
                      manual)
    it = iter(outs)
    return [next(it) if l else None for l in lin]


def _ct_aval(aval, spec, check_vma):
    """The type of an output's cotangent block: it varies along every axis its spec
    splits over, even where the output itself is invariant (and tiled); it is reduced
    where the output is unreduced, and unreduced where the output's spec is reduced."""
    ct = tangent_aval(aval)
    if not check_vma:
        return ct
    unred = frozenset(spec.reduced)
    vma = (ct.vma - spec.unreduced) | frozenset(spec.mesh_axes) | unred
    return ct.update(vma=vma, unreduced=unred, reduced=frozenset(spec.unreduced))


def _out_ct(ct, aval, spec, mesh, check_vma, names):
    """The cotangent of a body output from the block of the global cotangent that
    ``spec`` gives each device.  Typed: an output invariant along an axis its spec
    splits over is tiled there, so its cotangent sums the tiles (psum).  Untyped
    (check_vma=False), as in JAX, devices holding copies of one block (the axes the spec
    leaves out) share its cotangent evenly."""
    if check_vma:
        # (An output whole where its spec says reduced: its cotangent's summands add up.)
        tiled = tuple(a for a in names if (a in spec.mesh_axes and a not in aval.vma)
                      or (a in spec.reduced and a not in aval.reduced))
        return psum(ct, tiled) if tiled else ct
    # Untyped: an unreduced output's devices each hold a summand, whose cotangent is
    # the whole one; a reduced one's cotangent arrives as summands already.
    marked = spec.unreduced | spec.reduced
    copies = int(np.prod([mesh.shape[a] for a in names if a not in spec.mesh_axes
                          and a not in marked], dtype=np.int64))
    if copies == 1 or not dtypes.is_inexact(get_aval(ct).dtype):  # (bfloat16 too)
        return ct
    return div(ct, np.array(copies, get_aval(ct).dtype)[()])


@shard_map_p.def_batch
def _shard_map_batch(args, dims, *, program, mesh, in_specs, out_specs, check_vma,
                     manual=None, _axis_data=(None, None)):
    args = [a if d is None else move_to_front(a, d) for a, d in zip(args, dims)]
    size = next(np.shape(a)[0] for a, d in zip(args, dims) if d is not None)
    axes = [None if d is None else 0 for d in dims]
    n_out = len(program.out_avals)
    # vmap(spmd_axis_name=...): the batch dimension is split over those mesh axes.
    spmd_name = getattr(_axis_data[0], "spmd_name", None)
    # A batch the inputs' explicit types split: where no collective in the body crosses
    # those axes (and the specs leave them), each device maps over its part, as with
    # spmd_axis_name (the devices along them held copies: the body is the same);
    # else the batch is whole in the body, and the results are split again after.
    explicit = getattr(_axis_data[0], "explicit_axes", None)
    if explicit is not None and spmd_name is None and manual is None and not (
            set(explicit) & (collective_axes({"program": program})
                             | {a for s in (*in_specs, *out_specs) for a in s.mesh_axes})):
        spmd_name, explicit = explicit, None
    size_in, batch_entry, vary = size, None, frozenset()
    if spmd_name is not None:
        size_in, batch_entry = _spmd_batch(spmd_name, mesh, in_specs, size, manual)
        vary = frozenset(spmd_name) if check_vma else frozenset()

    def body(*a):
        return batch_flat(lambda *b: eval_program(program, *b), list(a), axes, size_in, None,
                          [0] * n_out)
    in_avals = [a if d is None else a.update(shape=(size_in,) + a.shape, vma=a.vma | vary)
                for a, d in zip(program.in_avals, dims)]
    closed = trace_body(lambda *a: body(*a), mesh, in_avals, check_vma, manual)
    fname = "shard_map"
    b_in = [s if d is None else _batched_spec(s, batch_entry, spmd_name, "in_specs", fname)
            for s, d in zip(in_specs, dims)]
    b_out = [_batched_spec(s, batch_entry, spmd_name, "out_specs", fname) for s in out_specs]
    outs = _bind_body(closed, args, mesh, b_in, b_out, check_vma, manual)
    if explicit is not None:  # the batch split again as the inputs' types had it
        from spmd.shard.partition.constraint import sharding_constraint_p

        entry = explicit[0] if len(explicit) == 1 else tuple(explicit)
        outs = [bind(sharding_constraint_p, o, spec=PartitionSpec(entry, *s), mesh=mesh)
                if not set(explicit) & set(s.mesh_axes) else o
                for o, s in zip(outs, out_specs)]
    return outs, [0] * len(outs)


shard_map_p.rules.batch_reads_level = True


def _spmd_batch(spmd_name, mesh, in_specs, size, manual=None):
    """(per-device batch size, batch spec entry) for vmap(spmd_axis_name=...)."""
    bad = [a for a in spmd_name if a not in (mesh.shape if manual is None else manual)]
    if bad:
        where = "an axis of the shard_map's mesh" if manual is None else \
            f"a manual axis of this partial-manual shard_map (axis_names={list(manual)})"
        raise ShardMapError(f"vmap: spmd_axis_name {spmd_name} names {bad[0]!r}, which is not "
                            f"{where} (mesh axes {mesh.axis_names})")
    used = [a for s in in_specs for a in s.mesh_axes if a in spmd_name]
    if used:
        raise ShardMapError(f"vmap: spmd_axis_name {spmd_name} cannot appear in the "
                            f"shard_map's in_specs (axis {used[0]!r} is used there); map "
                            "over another mesh axis")
    n = mesh.axis_size(spmd_name)
    if size % n:
        raise ShardMapError(f"vmap: the mapped axis has size {size}, which is not divisible "
                            f"by {n}, the size of spmd_axis_name {spmd_name}")
    return size // n, spmd_name[0] if len(spmd_name) == 1 else tuple(spmd_name)


def _shard_map_dce(eqn, used_outputs):
    if all(used_outputs):
        return eqn
    p = eqn.params
    prog, _ = dce_program(p["program"].program, used_outputs)
    outs = [o for o, u in zip(eqn.outputs, used_outputs) if u]
    specs = tuple(s for s, u in zip(p["out_specs"], used_outputs) if u)
    return eqn.replace(outputs=outs, params={**p, "program": ClosedProgram(prog, []),
                                             "out_specs": specs})


shard_map_p.rules.dce = _shard_map_dce


def _output_array(eqn, i):
    """A jitted shard_map returns Arrays placed by its out_specs, as the eager one does
    (and as in JAX)."""
    s = NamedSharding(eqn.params["mesh"], eqn.params["out_specs"][i])
    return lambda a: placed(a, s)


# A jitted shard_map's results keep their out_specs placement (spmd.shard.call.spread).
shard_map_p.rules.output_array = _output_array
