"""The ``sharding_constraint`` primitive behind ``lax.with_sharding_constraint``: the
identity everywhere except in the partitioner, which reshards its operand to the
constrained placement there (:meth:`Evaluator.constraint`) and lets the spec flow back
to unspecified inputs."""

from __future__ import annotations

from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.primitives import Primitive
from spmd.shard.arrays.spec import NamedSharding, PartitionSpec, ShardingError
from spmd.compiler.transforms.batching import move_to_front
from spmd.shard.arrays.sharded import placed

sharding_constraint_p = Primitive("sharding_constraint", traits=())
# ``free``: mesh axes the constraint leaves to the partitioner (the automatic axes of a
# mesh that mixes them with explicit ones: a type names only the explicit axes).  The
# parameter is present only when not empty, so other constraints keep their params.
sharding_constraint_p.def_impl(lambda xp, x, *, spec, mesh, free=frozenset(): x)
sharding_constraint_p.def_emit(lambda ins, spec, mesh, free=frozenset(): ins[0])
sharding_constraint_p.def_abstract_eval(lambda x, *, spec, mesh, free=frozenset(): x)
sharding_constraint_p.linear = True
sharding_constraint_p.unreduced = "keep"  # (a constraint in a body: the data as it is)


def _constraint_output(eqn, i):
    """A constrained value that a jitted function returns keeps that placement."""
    s = NamedSharding(eqn.params["mesh"], eqn.params["spec"])
    return lambda a: placed(a, s)


sharding_constraint_p.rules.output_array = _constraint_output


@sharding_constraint_p.def_jvp
def _constraint_jvp(primals, tangents, **params):
    out = sharding_constraint_p.bind(primals[0], **params)
    t = tangents[0]
    return out, t if isinstance(t, Zero) else sharding_constraint_p.bind(t, **params)


@sharding_constraint_p.def_transpose
def _constraint_transpose(ct, x, **params):
    # The cotangent is asked for the same placement (as in JAX).
    return [ct if isinstance(ct, Zero) else sharding_constraint_p.bind(ct, **params)]


@sharding_constraint_p.def_batch
def _constraint_batch(args, dims, *, spec, mesh, _axis_data=(None, None), **free):
    x = move_to_front(args[0], dims[0])
    # vmap(spmd_axis_name=...) asks for the batch dimension split over those axes; a
    # batch its inputs' explicit types split keeps that split (as in JAX).
    name = getattr(_axis_data[0], "spmd_name", None)
    if name is None:
        name = getattr(_axis_data[0], "explicit_axes", None)
        if name is not None and set(name) & set(spec.mesh_axes):
            raise ShardingError(
                f"with_sharding_constraint under vmap: {spec} names mesh axes "
                f"{sorted(set(name) & set(spec.mesh_axes))} that the mapped axis is split "
                "over (the mapped arguments' types say so); they cannot split another "
                "dimension: leave them out of the spec")
    entry = None if name is None else name[0] if len(name) == 1 else tuple(name)
    return sharding_constraint_p.bind(x, spec=PartitionSpec(entry, *spec, unreduced=getattr(
        spec, "unreduced", frozenset())), mesh=mesh, **free), 0


sharding_constraint_p.rules.batch_reads_level = True
