"""How a ``jit`` with shardings traces: the function globally, then partitioned over
the shardings' mesh into one ``shard_map`` (:func:`spmd.shard.partition.partitioner.partition`).

:class:`Partitioning` is the data a :class:`spmd.shard.call.jit.Jit` holds when it is
given ``in_shardings``/``out_shardings``/``forbid_gather_bytes``: the shardings, the
static arguments, and its cache of partitioned traces, keyed by the dynamic
arguments' structure, the statics, the avals, each leaf's sharding, the named axes
in scope and the context mesh.

>>> step = spmd.jit(f, in_shardings=NamedSharding(mesh, P("data")))  # doctest: +SKIP
>>> step._partitioning.entries                                        # doctest: +SKIP
{}
"""

from __future__ import annotations

import inspect

from spmd import tree_util
from spmd.compiler.core.avals import ShapeDtypeStruct, abstract_arg_aval
from spmd.compiler.core.ir import ClosedProgram
from spmd.compiler.core.jit import flatten_outputs
from spmd.compiler.core.signature import norm_argnums
from spmd.compiler.core.trace import (Tracer, axis_env_key, get_aval, hoist_traced_consts,
                                      trace_to_program)
from spmd.errors import StaticArgumentError
from spmd.shard.arrays.sharded import ShardedArray, SingleDeviceSharding
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec
from spmd.shard.explicit import types as explicit
from spmd.shard.explicit.mesh_context import context_key, get_mesh
from spmd.shard.maps.shard_map_rules import _bind_body
from spmd.shard.partition.partitioner import PartitionError, partition
from spmd.shard.partition.placement import Placement


def sharding_per_leaf(shardings, tree, fname):
    """One sharding (or None) per leaf of ``tree`` from a pytree prefix ``shardings``."""
    try:
        pairs = tree_util.broadcast_prefix(shardings, tree, lambda s: s is None or isinstance(
            s, (NamedSharding, PartitionSpec)))
    except tree_util.PrefixMismatch:
        n = len(tree_util.tree_leaves(shardings, is_leaf=lambda s: isinstance(
            s, (NamedSharding, PartitionSpec)) or s is None))
        what = "outputs" if "out_shardings" in fname else "arguments" if "jit" in fname else \
            "values"
        raise PartitionError(f"{fname}: the shardings are not a pytree prefix of the {what} "
                             f"({n} shardings for {len(tree_util.tree_leaves(tree))} "
                             f"arrays); give one sharding per {what[:-1]} (or a pytree prefix "
                             "of them)") from None
    return [s for s, _ in pairs]


class _Entry:
    def __init__(self, partitioned, mesh, closed, out_tree, out_avals, out_specs, traced,
                 hoisted=()):
        self.partitioned = partitioned
        self.mesh = mesh
        self.closed = closed  # the global-view program with one shard_map equation
        self.traced = traced  # the function's own global program (before partitioning)
        # Values the function closed over that are passed as leading arguments (see
        # hoist_traced_consts): tracers of an enclosing transformation, and Arrays
        # spread over processes, which keep their shardings.
        self.hoisted = tuple(hoisted)
        self.out_tree = out_tree
        self.out_avals = out_avals
        self.out_specs = out_specs


def argnums(fun, name, static_argnums, static_argnames, donate_argnums):
    """(static positions, static keyword names, donated positions), with
    ``static_argnames`` naming positional parameters turned into positions (as in JAX)."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = None
    n_pos = None
    if params is not None and not any(p.kind == p.VAR_POSITIONAL for p in params):
        n_pos = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    static = set(norm_argnums(static_argnums, n_pos, name, "static_argnums"))
    donate = norm_argnums(donate_argnums, n_pos, name, "donate_argnums")
    names = (static_argnames,) if isinstance(static_argnames, str) else \
        tuple(static_argnames or ())
    for nm in names:
        if not isinstance(nm, str):
            raise StaticArgumentError(f"jit({name}): static_argnames entries must be parameter "
                                      f"names (str), got {nm!r}")
        pos = [i for i, p in enumerate(params or []) if p.name == nm]
        if pos and n_pos is not None and pos[0] < n_pos:
            static.add(pos[0])
    both = sorted(static & set(donate))
    if both:
        raise StaticArgumentError(f"jit({name}): argument {both[0]} is both static and donated "
                                  "(static_argnums/static_argnames and donate_argnums); a static "
                                  "argument has no buffer to donate: drop it from one of them")
    return tuple(sorted(static)), names, donate


def _leaf_sharding(leaf, where: str):
    """The sharding an argument leaf brings (an Array's, or a ShapeDtypeStruct's)."""
    if isinstance(leaf, ShardedArray):
        return leaf.sharding if isinstance(leaf.sharding, NamedSharding) else None
    if type(leaf) is not ShapeDtypeStruct or leaf.sharding is None:
        return None
    s = leaf.sharding
    if isinstance(s, NamedSharding):
        return s
    if isinstance(s, PartitionSpec):
        if get_mesh() is not None:
            return NamedSharding(get_mesh(), s)
        raise PartitionError(f"{where}: ShapeDtypeStruct(sharding={s}) is a bare PartitionSpec, "
                             "which has no mesh; give NamedSharding(mesh, spec), or trace "
                             "under spmd.sharding.use_mesh(mesh)")
    if isinstance(s, SingleDeviceSharding):
        return None
    raise PartitionError(f"{where}: ShapeDtypeStruct(sharding={s!r}) is not a sharding; give "
                         "NamedSharding(mesh, spec) (or None)")


def _closed_over_spec(x, mesh, name: str):
    """The spec of a value the jitted function closed over: an Array spread over
    processes keeps its sharding (each process passes its blocks); None (decided by
    the partitioner) for a tracer of an enclosing transformation."""
    if not isinstance(x, ShardedArray):
        return None
    s = x.sharding
    if not isinstance(s, NamedSharding) or s.mesh != mesh:
        raise PartitionError(
            f"jit({name}) closes over an Array of shape {x.shape} spread over processes "
            f"({s!r}), but the jit is partitioned over {mesh!r}: its blocks are placed on "
            "another mesh. Pass it as an argument with an in_shardings entry on the jit's "
            "mesh, or spmd.device_put it onto that mesh first")
    return s.spec


def _leaf_aval(x):
    a = abstract_arg_aval(x)
    return get_aval(x) if a is None else a


class Partitioning:
    """A jit's shardings (``in_shardings`` covers the positional arguments; keyword
    arguments keep their Arrays' shardings, or are inferred, as in JAX), its static
    arguments, and its partitioned traces (``entries``)."""

    def __init__(self, name: str, in_shardings, out_shardings, forbid_gather_bytes,
                 static: tuple, static_names: tuple):
        self._name = name
        self._in = in_shardings
        self._out = out_shardings
        self._forbid = forbid_gather_bytes
        self._static, self._static_names = static, static_names
        self.entries: dict = {}  # (tree, statics, avals, shardings, axes, mesh) -> _Entry

    def _split(self, args, kwargs):
        """(dynamic positional args, dynamic keyword args, the static key)."""
        fname = f"jit({self._name})"
        for i in self._static:
            if i >= len(args):
                raise StaticArgumentError(f"{fname}: static_argnums names argument {i} but the "
                                          f"call passes {len(args)} positional arguments")
        static = tuple((i, args[i]) for i in self._static) + \
            tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_names))
        for where, v in static:
            try:
                hash(v)
            except TypeError:
                raise StaticArgumentError(
                    f"{fname}: static argument {where!r} is an unhashable {type(v).__name__} "
                    f"({v!r:.60}); static arguments are cache keys: pass a tuple instead of "
                    "a list, or make the argument non-static") from None
        dyn = tuple(a for i, a in enumerate(args) if i not in self._static)
        dkw = {k: kwargs[k] for k in sorted(kwargs) if k not in self._static_names}
        return dyn, dkw, static

    def _mesh_and_specs(self, dyn, leaves):
        fname = f"jit({self._name})"
        n_pos = len(tree_util.tree_leaves(dyn))
        if self._in is not None:
            # A PartitionSpec is one sharding (for every argument), not a tuple of them.
            per_arg = isinstance(self._in, (tuple, list)) and \
                not isinstance(self._in, PartitionSpec)
            if per_arg and len(self._in) != len(dyn):
                raise PartitionError(f"{fname}: in_shardings has {len(self._in)} entries for "
                                     f"{len(dyn)} arguments; give one per argument (a pytree "
                                     "prefix), or None to decide")
            given = sharding_per_leaf(tuple(self._in) if isinstance(self._in, list) else self._in,
                               tuple(dyn) if per_arg else dyn[0]
                               if len(dyn) == 1 and not per_arg
                               else tuple(dyn), fname)
        else:
            given = [None] * n_pos
        given = list(given) + [None] * (len(leaves) - n_pos)  # keyword arguments
        meshes = set()
        specs = []
        for i, (leaf, s) in enumerate(zip(leaves, given)):
            if s is None:
                s = _leaf_sharding(leaf, f"{fname}: argument leaf {i}")
            if isinstance(s, NamedSharding):
                meshes.add(s.mesh)
                specs.append(s.spec)
            else:
                specs.append(s)
        out_given = self._out
        for s in tree_util.tree_leaves(out_given, is_leaf=lambda s: isinstance(
                s, (NamedSharding, PartitionSpec))):
            if isinstance(s, NamedSharding):
                meshes.add(s.mesh)
        if len(meshes) > 1:
            raise PartitionError(f"{fname}: the shardings name {len(meshes)} different meshes "
                                 f"({', '.join(map(repr, meshes))}); all inputs and outputs "
                                 "of one jit must share a mesh")
        if not meshes:
            if get_mesh() is not None:  # bare PartitionSpecs under use_mesh/set_mesh
                return get_mesh(), specs
            raise PartitionError(f"{fname}: shardings need a mesh: give NamedSharding(mesh, "
                                 "spec) values (a bare PartitionSpec has no mesh), or call "
                                 "it under spmd.sharding.use_mesh(mesh)")
        return next(iter(meshes)), specs

    def entry(self, fun, args, kwargs):
        """The partitioned trace for these arguments (made on a miss), their leaves and
        avals."""
        dyn, dkw, static = self._split(args, kwargs)
        leaves, in_tree = tree_util.tree_flatten((dyn, dkw))
        avals = tuple(_leaf_aval(x) for x in leaves)
        shard_key = tuple(x.sharding if isinstance(x, ShardedArray) or
                          type(x) is ShapeDtypeStruct else None for x in leaves)
        # (context_key: the mesh, and whether a trace is on: a trace's programs are
        # other programs, spmd.collectives.local.)
        key = (in_tree, static, avals, shard_key, axis_env_key(), context_key())
        entry = self.entries.get(key)
        if entry is None:
            entry = self._build(fun, args, kwargs, dyn, leaves, in_tree, avals)
            # A trace that closed over an enclosing transformation's values (passed
            # to the program, which runs under that transformation) belongs to that
            # call alone.
            if not any(isinstance(c, Tracer) for c in entry.hoisted):
                self.entries[key] = entry
        return entry, leaves, avals

    def _build(self, user_fun, args, kwargs, dyn, leaves, in_tree, avals):
        mesh, in_specs = self._mesh_and_specs(dyn, leaves)
        box: list = []

        def flat(*xs):
            d, kw = tree_util.tree_unflatten(in_tree, xs)
            d = iter(d)
            full = [args[i] if i in self._static else next(d) for i in range(len(args))]
            kw = {**kw, **{k: v for k, v in kwargs.items() if k in self._static_names}}
            res = user_fun(*full, **kw)
            outs, out_tree = flatten_outputs(res, f"jit({self._name})")
            box[:] = [out_tree, res]
            return outs

        fun = flat
        if explicit.is_explicit(mesh):
            # Explicit axes: traced with the types the shardings give the arguments.
            fun = explicit.wrap(flat, mesh, tuple(
                explicit.explicit_only(Placement.from_spec(s, len(a.shape)), mesh)
                if s is not None
                else (explicit.type_of(x) or (None, Placement.replicated(len(a.shape))))[1]
                for s, a, x in zip(in_specs, avals, leaves)))
        closed, hoisted = hoist_traced_consts(trace_to_program(fun, list(avals)))
        out_tree, res = box
        out_given = sharding_per_leaf(self._out, res, f"jit({self._name}) out_shardings") \
            if self._out is not None else [None] * len(closed.out_avals)
        out_specs = [s.spec if isinstance(s, NamedSharding) else s for s in out_given]
        hoisted_specs = [_closed_over_spec(h, mesh, self._name) for h in hoisted]
        avals = tuple(get_aval(h) for h in hoisted) + tuple(avals)
        part = partition(closed, mesh, hoisted_specs + list(in_specs), out_specs, self._forbid)

        def run(*xs):
            return _bind_body(ClosedProgram(part.body.program, part.body.consts), xs, mesh,
                              part.in_specs, part.out_specs, False)

        final = trace_to_program(run, list(avals))
        return _Entry(part, mesh, final, out_tree, final.out_avals, part.out_specs, closed,
                      hoisted)
