"""``jit`` with shardings: trace globally, partition, run as a ``shard_map``."""

from __future__ import annotations

import functools
from typing import Callable

from spmd import tree_util
from spmd.compiler.ir import ClosedProgram
from spmd.compiler.jit import executable_for, flatten_outputs
from spmd.compiler.trace import (Tracer, axis_env_key, get_aval, is_eager, to_array_value,
                                 trace_to_program, wrap_value)
from spmd.shard.partition.constraint import sharding_constraint_p
from spmd.shard.partition.partitioner import PartitionError, partition
from spmd.shard.sharded import ShardedArray, from_whole
from spmd.shard.spec import NamedSharding, PartitionSpec

# ------------------------------------------------------ with_sharding_constraint

def with_sharding_constraint(x, sharding):
    """Ask the partitioner to give ``x`` this sharding here (a pytree and a prefix of
    shardings); the identity elsewhere.

    >>> y = lax.with_sharding_constraint(y, NamedSharding(mesh, P("data", None)))
    """
    from spmd.shard.mesh_context import get_mesh, resolve_specs

    leaves, tree = tree_util.tree_flatten(x)
    if get_mesh() is not None:  # bare PartitionSpecs name axes of the context mesh
        sharding = resolve_specs(sharding, "with_sharding_constraint")
    shardings = _broadcast(sharding, x, "with_sharding_constraint")
    for s in shardings:
        if not isinstance(s, NamedSharding):
            raise PartitionError(f"with_sharding_constraint: expected NamedSharding(mesh, spec) "
                                 f"values, got {s!r}; a bare PartitionSpec has no mesh (give "
                                 "one with spmd.sharding.use_mesh(mesh))")
    outs = [sharding_constraint_p.bind(v, spec=s.spec, mesh=s.mesh)
            for v, s in zip(leaves, shardings)]
    return tree_util.tree_unflatten(tree, outs)


def _broadcast(shardings, tree, fname):
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


# ---------------------------------------------------------------- the jit

class _Entry:
    def __init__(self, partitioned, mesh, closed, out_tree, out_avals, out_specs):
        self.partitioned = partitioned
        self.mesh = mesh
        self.closed = closed  # the global-view program with one shard_map equation
        self.out_tree = out_tree
        self.out_avals = out_avals
        self.out_specs = out_specs
        self.executable = None  # compiled on the first eager call
        self.out_shardings = None


class PartitionedJit:
    """``jit(f, in_shardings=..., out_shardings=...)``."""

    def __init__(self, fun, in_shardings, out_shardings, forbid_gather_bytes=None,
                 static_argnums=None):
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._in = in_shardings
        self._out = out_shardings
        self._forbid = forbid_gather_bytes
        self._static = tuple(static_argnums or ()) if not isinstance(static_argnums, int) \
            else (static_argnums,)
        self._cache: dict = {}
        self._name = getattr(fun, "__name__", "fun")

    def _mesh_and_specs(self, args, leaves):
        fname = f"jit({self._name})"
        dyn = [a for i, a in enumerate(args) if i not in self._static]
        if self._in is not None:
            # A PartitionSpec is one sharding (for every argument), not a tuple of them.
            per_arg = isinstance(self._in, (tuple, list)) and \
                not isinstance(self._in, PartitionSpec)
            if per_arg and len(self._in) != len(dyn):
                raise PartitionError(f"{fname}: in_shardings has {len(self._in)} entries for "
                                     f"{len(dyn)} arguments; give one per argument (a pytree "
                                     "prefix), or None to decide")
            given = _broadcast(tuple(self._in) if isinstance(self._in, list) else self._in,
                               tuple(dyn) if per_arg else dyn[0]
                               if len(dyn) == 1 and not per_arg
                               else tuple(dyn), fname)
        else:
            given = [None] * len(leaves)
        meshes = set()
        specs = []
        for i, (leaf, s) in enumerate(zip(leaves, given)):
            if s is None and isinstance(leaf, ShardedArray) and isinstance(leaf.sharding,
                                                                           NamedSharding):
                s = leaf.sharding
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
            from spmd.shard.mesh_context import get_mesh

            if get_mesh() is not None:  # bare PartitionSpecs under use_mesh/set_mesh
                return get_mesh(), specs
            raise PartitionError(f"{fname}: shardings need a mesh: give NamedSharding(mesh, "
                                 "spec) values (a bare PartitionSpec has no mesh), or call "
                                 "it under spmd.sharding.use_mesh(mesh)")
        return next(iter(meshes)), specs

    def _entry(self, args):
        dyn = tuple(a for i, a in enumerate(args) if i not in self._static)
        static = tuple((i, args[i]) for i in self._static)
        leaves, in_tree = tree_util.tree_flatten(dyn)
        avals = tuple(get_aval(x) for x in leaves)
        shard_key = tuple(x.sharding if isinstance(x, ShardedArray) else None for x in leaves)
        from spmd.shard.mesh_context import get_mesh

        key = (in_tree, static, avals, shard_key, axis_env_key(), get_mesh())
        entry = self._cache.get(key)
        if entry is None:
            entry = self._build(args, leaves, in_tree, avals)
            # A trace that closed over an enclosing transformation's values (they
            # stay constants of the program, which runs under that transformation)
            # belongs to that call alone.
            if not any(isinstance(c, Tracer) for c in entry.closed.consts):
                self._cache[key] = entry
        return entry, leaves

    def _build(self, args, leaves, in_tree, avals):
        mesh, in_specs = self._mesh_and_specs(args, leaves)
        box: list = []

        def flat(*xs):
            d = iter(tree_util.tree_unflatten(in_tree, xs))
            full = [args[i] if i in self._static else next(d) for i in range(len(args))]
            res = self._fun(*full)
            outs, out_tree = flatten_outputs(res, f"jit({self._name})")
            box[:] = [out_tree, res]
            return outs

        closed = trace_to_program(flat, list(avals))
        out_tree, res = box
        out_given = _broadcast(self._out, res, f"jit({self._name}) out_shardings") \
            if self._out is not None else [None] * len(closed.out_avals)
        out_specs = [s.spec if isinstance(s, NamedSharding) else s for s in out_given]
        part = partition(closed, mesh, list(in_specs), out_specs, self._forbid)

        def run(*xs):
            from spmd.shard.shard_map import _bind_body

            return _bind_body(ClosedProgram(part.body.program, part.body.consts), xs, mesh,
                              part.in_specs, part.out_specs, False)

        final = trace_to_program(run, list(avals))
        return _Entry(part, mesh, final, out_tree, final.out_avals, part.out_specs)

    def __call__(self, *args):
        entry, leaves = self._entry(args)
        if not is_eager():
            from spmd.compiler.trace import eval_program
            outs = eval_program(entry.closed, *leaves)
            return tree_util.tree_unflatten(entry.out_tree, outs)
        if entry.mesh.is_multi_process:
            # Each process runs the per-device program on its own blocks.
            from spmd.shard.execute import call

            part = entry.partitioned
            arrays = call(part.body, entry.mesh, part.in_specs, part.out_specs, leaves)
            return tree_util.tree_unflatten(entry.out_tree, arrays)
        vals = [to_array_value(x, get_aval(x)) for x in leaves]
        if entry.executable is None:
            entry.executable = executable_for(entry.closed)
            entry.out_shardings = [NamedSharding(entry.mesh, s) for s in entry.out_specs]
        outs = entry.executable(*vals)
        arrays = [from_whole(wrap_value(o, a).value, a, s)
                  for o, a, s in zip(outs, entry.out_avals, entry.out_shardings)]
        return tree_util.tree_unflatten(entry.out_tree, arrays)

    def lower(self, *args) -> "PartitionedLowered":
        entry, _ = self._entry(args)
        return PartitionedLowered(entry)


class PartitionedLowered:
    """The per-device program of a partitioned jit, with why each collective is there."""

    def __init__(self, entry: _Entry):
        self._entry = entry
        self.in_specs = entry.partitioned.in_specs
        self.out_specs = entry.partitioned.out_specs

    @property
    def program(self) -> ClosedProgram:
        from spmd.compiler.passes import cse, dce, inline_calls

        # No constant folding: collectives (axis_index of an inserted slice) only run
        # inside the shard_map this program is the body of.
        return dce(cse(inline_calls(self._entry.partitioned.body)))

    @property
    def bytes_sent(self) -> int:
        """Bytes each device sends per call (from the inserted collectives)."""
        return sum(n.bytes_sent for n in self._entry.partitioned.notes)

    def collectives(self) -> list:
        return [(n.collective, n.reason, n.bytes_sent) for n in self._entry.partitioned.notes]

    def as_text(self) -> str:
        notes = self._entry.partitioned.notes
        head = [f"# per-device program on {self._entry.mesh}",
                f"# in_specs:  {list(self.in_specs)}", f"# out_specs: {list(self.out_specs)}",
                f"# bytes sent per device per call: {self.bytes_sent}"]
        for n in notes:
            head.append(f"# {n.collective}: needed by {n.reason} ({n.bytes_sent} bytes)")
        return "\n".join(head) + "\n" + str(self.program)

    def __str__(self):
        return self.as_text()


def jit(fun: Callable | None = None, *, in_shardings=None, out_shardings=None,
        forbid_gather_bytes: int | None = None, static_argnums=None, static_argnames=None,
        donate_argnums=None):
    """``spmd.jit``: compile ``fun``; with shardings, partition it over their mesh.

    >>> step = jit(f, in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))))
    """
    from spmd.compiler.jit import jit as plain_jit

    if fun is None:
        return functools.partial(jit, in_shardings=in_shardings, out_shardings=out_shardings,
                                 forbid_gather_bytes=forbid_gather_bytes,
                                 static_argnums=static_argnums, static_argnames=static_argnames,
                                 donate_argnums=donate_argnums)
    if in_shardings is None and out_shardings is None and forbid_gather_bytes is None:
        return plain_jit(fun, static_argnums=static_argnums, static_argnames=static_argnames,
                         donate_argnums=donate_argnums)
    if static_argnames or donate_argnums:
        raise PartitionError("jit with shardings supports static_argnums, not static_argnames "
                             "or donate_argnums yet")
    return PartitionedJit(fun, in_shardings, out_shardings, forbid_gather_bytes, static_argnums)
