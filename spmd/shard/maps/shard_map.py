"""``shard_map``: run a per-device program over a mesh (JEP 14273).

``shard_map(f, mesh=..., in_specs=..., out_specs=...)`` checks the arguments
against their specs and either runs ``f`` eagerly on every device's concrete
blocks (:mod:`spmd.shard.maps.on_blocks`) or traces it once on per-device block
types and binds the higher-order primitive ``shard_map``, whose rules are in
:mod:`spmd.shard.maps.shard_map_rules`.  How an eager one, or a program holding
one over processes, runs on placed values is the call path's (its execution
rules are in :mod:`spmd.shard.call.dispatch`).

>>> @functools.partial(shard_map, mesh=mesh, in_specs=(P("i"),), out_specs=P())
... def total(x_block):
...     return lax.psum(x_block.sum(), "i")
"""

from __future__ import annotations

import functools
import time
from typing import Callable

from spmd import tree_util
from spmd.collectives.primitives import CollectiveAxisError
from spmd.compiler.core.jit import flatten_outputs
from spmd.compiler.core.trace import axis_scope, get_aval
from spmd.compiler.transforms.batching import active_explicit_batch_axes
from spmd.errors import ConcretizationError
from spmd.launch.timeline import recorder as _timeline
from spmd.mesh import AbstractMesh, Mesh
from spmd.mesh.mesh import AxisType
from spmd.shard.arrays.spec import PartitionSpec, ShardingError, check_spec
from spmd.shard.call import recording as _recording
from spmd.shard.call import tracebacks
from spmd.shard.explicit.mesh_context import concrete_mesh, get_mesh, require_mesh
from spmd.shard.explicit.types import wrap
from spmd.shard.maps.args import (Infer, ShardMapError, _as_global, _check_out,
                                  _inferred_specs, _spec_leaves, arg_type_spec,
                                  check_marked_specs)
from spmd.shard.maps.manual_axes import (_automatic_axis_error, _check_manual_spec,
                                         _manual_axes, split_typed, typed_axes)
from spmd.shard.maps.on_blocks import can_run_eagerly, run_eagerly
from spmd.shard.maps.shard_map_rules import _bind_body, _block_aval, trace_body
from spmd.shard.partition.manual import partition_partial_manual
from spmd.shard.partition.placement import Placement

__all__ = ["shard_map", "ShardMapError"]

_REQUIRED = object()  # out_specs has no default (None is a spec: a body returning None)


def shard_map(f: Callable | None = None, mesh=None, in_specs=Infer, out_specs=_REQUIRED, *,
              check_vma: bool = True, check_rep: bool | None = None, axis_names=None):
    """Map a per-device function over ``mesh``: each device gets the blocks that
    ``in_specs`` assign it and returns blocks that ``out_specs`` assemble.

    ``mesh`` defaults to the mesh of ``spmd.sharding.use_mesh``/``set_mesh``; it may
    also be passed positionally, as the older JAX API did.  An ``in_specs`` entry
    ``None`` passes that argument to the body as it is (a static value, or an array
    every device sees whole); ``in_specs=None`` does so for all.  Without
    ``in_specs``, each argument's spec is that of its sharding (an Array placed on
    the mesh).  ``out_specs`` is required; ``None`` is the spec of a body that returns
    None.

    >>> @functools.partial(shard_map, mesh=mesh, in_specs=(P("i"),), out_specs=P())
    ... def total(x_block):
    ...     return lax.psum(x_block.sum(), "i")
    """
    if f is None:
        return functools.partial(shard_map, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=check_vma, check_rep=check_rep,
                                 axis_names=axis_names)
    if not callable(f):
        raise ShardMapError(f"shard_map: expected a function first, got {type(f).__name__}")
    if mesh is not None and not isinstance(mesh, (Mesh, AbstractMesh)):
        raise ShardMapError(f"shard_map: mesh must be a spmd.Mesh (or an AbstractMesh of a "
                            f"mesh in context), got {type(mesh).__name__}")
    if out_specs is _REQUIRED:
        raise ShardMapError("shard_map: out_specs is required (a PartitionSpec or a pytree "
                            "prefix of the outputs of them)")
    if check_rep is not None:  # JAX's older name
        check_vma = check_rep
    fname = f"shard_map({getattr(f, '__name__', 'f')})"

    @tracebacks.api_boundary
    @functools.wraps(f)
    def wrapped(*args):
        m = mesh if mesh is not None else require_mesh(fname)
        if isinstance(m, AbstractMesh):  # the devices of the mesh of its axes in context
            placed = [getattr(x, "_sharding", None) for x in tree_util.tree_leaves(args)]
            m = concrete_mesh(m, fname, [s.mesh for s in placed if isinstance(
                getattr(s, "mesh", None), Mesh)])
        elif mesh is not None:
            _check_context_mesh(mesh, fname)
        if not m.axis_names:
            raise ShardMapError(f"{fname}: shard_map requires a non-empty mesh, got {m!r}; "
                                "make one with axes (spmd.make_mesh((n,), ('i',)))")
        names = axis_names
        if names is not None:
            _check_not_vmapped(names, fname)
        if names is None:  # JAX's default: the axes not manual here already
            taken = {a for a in m.axis_names if getattr(axis_scope(a), "manual", False)}
            if taken and len(taken) < len(m.axis_names):
                if isinstance(mesh, Mesh):
                    _check_body_mesh(taken, m, fname)
                names = frozenset(a for a in m.axis_names if a not in taken)
        manual = _manual_axes(names, m, fname)
        return _call(f, m, in_specs, out_specs, check_vma, fname, args, manual)

    return wrapped


def _check_not_vmapped(axis_names, fname):
    """``axis_names`` may not name an explicit mesh axis that an enclosing ``vmap``
    splits its batch over (the mapped inputs' types are split along it), as in JAX:
    vmap has taken that axis, and the body cannot be manual over it as well."""
    taken = sorted(set(axis_names) & active_explicit_batch_axes())
    if taken:
        raise ShardMapError(
            f"{fname}: axis_names={sorted(axis_names)} names {taken[0]!r}, an explicit mesh "
            "axis that an enclosing vmap maps over (its mapped arguments are split along "
            f"it); leave {taken[0]!r} out of axis_names (or leave axis_names out), or "
            "reshard the arguments whole along the mapped axis")


def _check_body_mesh(taken, mesh, fname):
    """Inside a shard_map's body, where axes ``taken`` are manual, a nested shard_map
    given the concrete ``mesh=`` without ``axis_names`` is an error, as in JAX: the
    context mesh there (``get_abstract_mesh()``, whose ``taken`` axes are manual) should
    match the mesh passed, so it is unclear which axes the nested one is manual over."""
    raise ShardMapError(
        f"{fname}: the context mesh inside the enclosing shard_map's body (mesh axes "
        f"{sorted(taken)} manual) should match the mesh passed to shard_map, {mesh}; pass "
        "mesh=spmd.sharding.get_abstract_mesh() (or leave mesh= out), or name the axes "
        "the nested shard_map is manual over with axis_names=")


def _check_not_rebound(bound, fname):
    """A shard_map inside another's body may not bind an axis that is already manual
    there (as in JAX): the inner would run a second copy of the axis, and a collective
    over it would not reach the enclosing body's devices."""
    again = sorted(a for a in bound if getattr(axis_scope(a), "manual", False))
    if again:
        raise ShardMapError(
            f"{fname}: mesh axes {again} are already manual in the enclosing shard_map's "
            "body; a nested shard_map must be manual over other axes: give the outer one "
            "axis_names= without them (or use smap over one axis at a time)")


def _check_context_mesh(mesh, fname):
    """A ``mesh=`` that differs in axis names or sizes from the mesh of the enclosing
    ``set_mesh``/``use_mesh`` is an error, as in JAX: the program would mix two meshes
    (the same shape over other devices is the same abstract mesh, and allowed)."""
    ctx = get_mesh()
    if ctx is None or ctx is mesh:
        return
    if (ctx.axis_names, ctx.axis_sizes) != (mesh.axis_names, mesh.axis_sizes):
        raise ShardMapError(
            f"{fname}: the context mesh {ctx} (of set_mesh/use_mesh) should match the mesh "
            f"passed to shard_map, {mesh}; leave mesh= out to use the context's, or call "
            "shard_map outside that block")


def _call(f, mesh, in_specs, out_specs, check_vma, fname, args, manual=None):
    leaves, in_tree = tree_util.tree_flatten(args)
    dyn, vals, flat_specs, body_types = _inputs(in_specs, args, leaves, mesh, manual, fname)
    out_leaves = [] if callable(out_specs) else tree_util.tree_leaves(
        out_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    # Unreduced and reduced values are typed as the traced body types them (an eager
    # body's values carry their varying axes only).
    marked = check_marked_specs(list(flat_specs) + [s for s in out_leaves
                                                    if isinstance(s, PartitionSpec)],
                                mesh, manual, fname)
    eager = can_run_eagerly(vals)  # concrete blocks
    run = functools.partial(run_eagerly, f, mesh, vals, flat_specs, dyn, leaves, in_tree,
                            out_specs, check_vma, manual, fname)
    if manual is None and not marked and eager:
        if _timeline.ACTIVE is not None:  # (its span on the trace: spmd.profiler)
            t0 = time.monotonic()
            out = run()
            _recording.eager_called(fname, mesh, t0, time.monotonic())
            return out
        return run()
    bound = frozenset(mesh.axis_names if manual is None else manual)
    _check_not_rebound(bound, fname)
    traced = _trace(f, mesh, vals, flat_specs, dyn, leaves, in_tree, body_types, check_vma,
                    manual, bound, fname, eager)
    if traced is None:  # a partial-manual body that branches in Python: eagerly
        return run()
    closed, out_tree, outs_struct = traced
    out_flat_specs = _out_specs(closed, out_specs, outs_struct, mesh, check_vma, manual, bound,
                                fname)
    if manual is not None and not eager:
        # Traced (under jit or a transformation): the body stays whole along the
        # automatic axes, and is split where the equation is partitioned, by the
        # placements propagated to its operands through the whole program (or where
        # it runs unpartitioned: by its arguments' shardings, shard_map_rules._split).
        return tree_util.tree_unflatten(out_tree, _bind_body(
            closed, vals, mesh, flat_specs, out_flat_specs, check_vma, manual))
    if manual is not None:  # eager: split along the automatic axes by the args' shardings
        closed, flat_specs, out_flat_specs = partition_partial_manual(
            closed, mesh, manual, vals, flat_specs, out_flat_specs)
        check_vma = False  # the partitioned body is untyped (as jit's partitioned bodies)
    outs = _bind_body(closed, vals, mesh, flat_specs, out_flat_specs, check_vma)
    return tree_util.tree_unflatten(out_tree, outs)


def _inputs(in_specs, args, leaves, mesh, manual, fname):
    """``(dyn, vals, specs, body_types)``: the positions of the leaves the body gets as
    blocks (a leaf whose spec is None reaches it as it is, closed over), their global
    values and specs, and on a partial-manual body over explicit axes their types
    inside (the block's type, as in JAX), else None."""
    specs = in_specs
    if isinstance(specs, PartitionSpec) and len(args) == 1:
        specs = (specs,)
    if specs is Infer:
        paths = [tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(args)[0]]
        spec_paths = _inferred_specs(leaves, paths, mesh, fname)
    else:
        spec_paths = _spec_leaves(tuple(specs) if isinstance(specs, list) else specs,
                                  args, "in_specs", fname)
    if len(spec_paths) != len(leaves):
        raise ShardMapError(f"{fname}: in_specs is not a pytree prefix of the arguments "
                            f"({len(spec_paths)} specs for {len(leaves)} array leaves)")
    dyn = [i for i, (s, _) in enumerate(spec_paths) if s is not None]
    # A partial-manual body over explicit axes: its specs may name them, and its values
    # are typed along them.
    typed = typed_axes(mesh, manual)
    body_types = [] if typed else None
    vals, flat_specs = [], []
    for i in dyn:
        spec, path = spec_paths[i]
        if typed:
            spec, inside = split_typed(spec, typed)
            if not inside.mesh_axes:  # not named in the spec: the argument's own type
                _, inside = split_typed(arg_type_spec(leaves[i], mesh) or PartitionSpec(),
                                        typed)
            body_types.append(Placement.from_spec(inside, len(get_aval(leaves[i]).shape)))
        v = _as_global(leaves[i], f"argument{path}")
        if manual is not None:
            _check_manual_spec(spec, manual, f"in_specs{path}", fname)
        try:
            check_spec(spec, mesh, get_aval(v).shape, f"{fname}: in_specs{path}")
        except ShardingError as e:
            raise ShardMapError(str(e)) from None
        vals.append(v)
        flat_specs.append(spec)
    return dyn, vals, flat_specs, body_types


def _trace(f, mesh, vals, specs, dyn, leaves, in_tree, body_types, check_vma, manual, bound,
           fname, eager):
    """``(closed body, output tree, outputs)`` of ``f`` traced on the blocks' types, or
    None where a partial-manual body branches in Python on a value and can run eagerly
    instead."""
    block_avals = [_block_aval(get_aval(v), s, mesh, check_vma, bound)
                   for v, s in zip(vals, specs)]
    out_box: list = []

    def flat_body(*blocks):
        full = list(leaves)
        for i, b in zip(dyn, blocks):
            full[i] = b
        outs = f(*tree_util.tree_unflatten(in_tree, full))
        leaves_out, out_tree = flatten_outputs(outs, fname)
        out_box[:] = [out_tree, outs]
        return leaves_out

    body = flat_body
    if body_types is not None:
        view = AbstractMesh(mesh.axis_sizes, mesh.axis_names, tuple(
            AxisType.Manual if a in manual else t for a, t in zip(mesh.axis_names,
                                                                 mesh.axis_types)))
        body = wrap(flat_body, mesh, body_types, view=view)
    try:
        closed = trace_body(body, mesh, block_avals, check_vma, manual)
    except CollectiveAxisError as e:
        raise _automatic_axis_error(e, mesh, manual, fname) from None
    except ConcretizationError:
        # A partial-manual body (traced, so the partitioner can split it along the
        # automatic axes) that branches in Python on a value: eagerly, it runs on
        # concrete blocks instead (replicated along the automatic axes).
        if manual is None or not eager:
            raise
        return None
    out_tree, outs_struct = out_box
    return closed, out_tree, outs_struct


def _out_specs(closed, out_specs, outs_struct, mesh, check_vma, manual, bound, fname):
    """The flat out specs of the traced body, checked against its outputs' types."""
    if callable(out_specs):  # a thunk, called once the outputs are known (as in JAX)
        out_specs = out_specs()
    out_spec_paths = _spec_leaves(out_specs, outs_struct, "out_specs", fname)
    for a, (spec, path) in zip(closed.out_avals, out_spec_paths):
        if manual is not None:
            _check_manual_spec(spec, manual, f"out_specs{path}", fname)
        _check_out(a, spec, path, mesh, check_vma, fname, bound)
    return [s for s, _ in out_spec_paths]
