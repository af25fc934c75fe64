"""The arguments of a ``shard_map`` call: specs per leaf (a pytree prefix, ``None``
for an argument passed as it is, or inferred from the arguments' shardings), the
arguments as array values, and the checks of out_specs against the body's results.

>>> _spec_leaves((P("i"), None), (x, 3), "in_specs", "shard_map(f)")  # doctest: +SKIP
[(PartitionSpec('i',), '[0]'), (None, '[1]')]
"""

from __future__ import annotations

import numpy as np

from spmd import tree_util
from spmd.compiler.core.array import Array
from spmd.compiler.core.tracer import get_aval, is_array_like, Tracer
from spmd.errors import DTypeError, SpmdError
from spmd.mesh.mesh import AxisType
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec, ShardingError, check_spec
from spmd.compiler.core.array_module import is_device_array, to_device


class ShardMapError(SpmdError, ValueError):
    """A bad shard_map call: specs that do not match the arguments or results."""


def _spec_leaves(specs, tree, what: str, fname: str) -> list:
    """One PartitionSpec per leaf of ``tree`` from a pytree prefix ``specs``; in
    ``in_specs`` a ``None`` covers arguments passed to the body as they are."""
    is_in = what == "in_specs"
    if specs is None and not tree_util.tree_leaves(tree):
        return []  # nothing to place (a body that returns None, as in JAX)
    try:
        return tree_util.broadcast_prefix(
            specs, tree, lambda s: isinstance(s, PartitionSpec) or (is_in and s is None))
    except tree_util.PrefixMismatch as e:
        if e.prefix_node is None:
            raise ShardMapError(f"{fname}: {what}{e.path} is None; use P() for a replicated "
                                "value") from None
        raise ShardMapError(f"{fname}: {what} is not a pytree prefix of the "
                            f"{'arguments' if is_in else 'outputs'}: at "
                            f"{what}{e.path} the spec is {tree_util.describe(e.prefix_node)} "
                            f"but the value is {tree_util.describe(e.tree_node)}") from None


def _as_global(x, where: str = "argument"):
    """The argument as an array value (numpy arrays and scalars are global values)."""
    if isinstance(x, (Tracer, Array)):
        return x
    if not is_array_like(x):
        raise DTypeError(f"shard_map: {where} of type {type(x).__name__} is not an array; "
                         "give it the in_specs entry None to pass it to the body as it is")
    aval = get_aval(x)  # numpy values are canonicalised; Python scalars stay weak
    if is_device_array(x):  # a cupy array: it stays on (this process's) GPU
        return Array(to_device(x, aval.dtype), aval)
    return Array(np.asarray(x, dtype=aval.dtype), aval)


class _InferSpecs:
    """The default ``in_specs``: each argument's spec is that of its sharding."""

    def __repr__(self):
        return "Infer"


Infer = _InferSpecs()


def arg_type_spec(x, mesh):
    """The spec of ``x``'s type on ``mesh`` (an Array's sharding there, a traced value's
    explicit type), or None when it has none there."""
    s = getattr(x, "_sharding", None) if isinstance(x, Array) else None
    if isinstance(s, NamedSharding) and s.mesh == mesh:
        return s.spec
    # A value traced with its type (spmd.shard.explicit.types's ExplicitTracer, read by its
    # attribute: that module is above this one).
    typed = getattr(x, "typed_on", None)
    t = typed() if typed is not None else None
    if t is not None and t[0] == mesh and t[1] is not None:
        return t[1].to_spec()
    return None


def _inferred_specs(leaves, paths, mesh, fname):
    """Each argument's spec: its Array's sharding's, or on explicit axes its type's (a
    value without one, a numpy array, is replicated there, as its type says)."""
    explicit = AxisType.Explicit in getattr(mesh, "axis_types", ())
    out = []
    for x, path in zip(leaves, paths):
        spec = arg_type_spec(x, mesh)
        if spec is not None and (explicit or isinstance(x, Array)):
            out.append((spec, path))
            continue
        placed = isinstance(getattr(x, "_sharding", None), NamedSharding)
        if explicit and getattr(x, "typed_on", None) is None and not placed:
            out.append((PartitionSpec(), path))  # unplaced: replicated, by its type
            continue
        raise ShardMapError(
            f"{fname}: in_specs was not given, and argument{path} is not an Array placed "
            "on the mesh (device_put(x, P(...)) under the mesh, or NamedSharding(mesh, "
            "...)) to infer its spec from; pass in_specs=")
    return out


def _check_out(aval, spec, path, mesh, check_vma, fname, bound=None):
    """``spec`` fits the output and, typed, names every axis it varies along among those
    this shard_map binds (``bound``, default all: varying along an enclosing shard_map's
    axes is what the enclosing body's values do)."""
    # Checked against the global shape the blocks assemble into (always divisible).
    shape = tuple(n * mesh.axis_size([a for a in spec.axes_of(d) if a in mesh.shape])
                  for d, n in enumerate(aval.shape))
    try:
        check_spec(spec, mesh, shape, f"{fname}: out_specs{path}")
    except ShardingError as e:
        raise ShardMapError(str(e)) from None
    if check_vma:
        _check_marks(aval, spec, path, mesh, fname, bound)
        missing = [a for a in mesh.axis_names if a in aval.vma and a not in spec.mesh_axes
                   and a not in spec.unreduced and (bound is None or a in bound)]
        if missing:
            a = missing[0]
            raise ShardMapError(
                f"{fname}: output{path} varies along mesh axis {a!r} but out_specs{path}={spec} "
                f"does not mention {a!r}, so its blocks would disagree. Reduce it first (e.g. "
                f"lax.psum(x, {a!r}) or lax.all_gather_invariant(x, {a!r})), put {a!r} in the "
                "spec, or pass check_vma=False")


def _check_marks(aval, spec, path, mesh, fname, bound):
    """A typed output's unreduced axes are exactly its spec's, and its reduced axes are
    among its spec's (a spec's reduced axis also takes an invariant value)."""
    def mine(axes):
        return [a for a in mesh.axis_names if a in axes and (bound is None or a in bound)]

    for a in mine(spec.unreduced):
        if a not in aval.unreduced:
            raise ShardMapError(
                f"{fname}: out_specs{path}={spec} says the output is unreduced along {a!r}, "
                f"but it is not ({aval}); make its summands with lax.pcast(x, {a!r}, "
                "to='unreduced'), or leave unreduced= out of out_specs passed to shard_map")
    for a in mine(aval.unreduced - spec.unreduced):
        raise ShardMapError(
            f"{fname}: output{path} is unreduced along {a!r} ({aval}) but out_specs{path}="
            f"{spec} does not say unreduced={{{a!r}}}; sum it first (lax.psum), or put it in "
            "the out_specs passed to shard_map")
    for a in mine(aval.reduced - spec.reduced):
        raise ShardMapError(
            f"{fname}: output{path} is reduced along {a!r} ({aval}) but out_specs{path}="
            f"{spec} does not say reduced={{{a!r}}}; put it in the out_specs passed to "
            f"shard_map, or lax.pcast(x, {a!r}, to='varying') and split it")


def check_marked_specs(specs, mesh, manual, fname) -> bool:
    """Whether any spec has unreduced or reduced axes; those need a mesh whose axes are
    all explicit and a shard_map manual over all of them (as in JAX)."""
    marked = [s for s in specs if s is not None and (s.unreduced or s.reduced)]
    if not marked:
        return False
    if manual is not None:
        raise UnreducedSpecError(
            f"{fname}: {marked[0]}: unreduced or reduced axes can only be passed to in_specs "
            "when shard_map is in full manual mode (leave axis_names= out)")
    if any(t != AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
        raise ShardMapError(
            f"{fname}: {marked[0]} has unreduced or reduced axes, which can only be used when "
            "the mesh passed to shard_map contains axis names all of type `Explicit` "
            "(make_mesh(..., axis_types=(AxisType.Explicit, ...)))")
    return True


class UnreducedSpecError(ShardMapError, NotImplementedError):
    """Unreduced or reduced specs in a partial-manual shard_map (not supported, as in
    JAX)."""
