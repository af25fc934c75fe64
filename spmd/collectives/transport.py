"""The rules shared by the execution primitives that move data between processes
(``mpi``, ``nccl``): their type, and the rules a program lowered for execution
never needs but the registry asks of every primitive."""

from __future__ import annotations

from spmd.collectives.backend import kind as _kind
from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.trace import bind


def define_rules(prim, backend: str) -> None:
    """Abstract eval, jvp and batch rules of a transport primitive with parameters
    ``kind, ranks, op, dst, src, what`` (the kinds and their shape rules:
    :data:`spmd.collectives.backend.KINDS`)."""

    @prim.def_abstract_eval
    def _aval(x, *, kind, ranks, op=None, dst=None, src=None, what=None):
        shape = _kind(kind, backend).shape(x.shape, len(ranks))
        return ShapedArray(tuple(shape), x.dtype, x.weak_type)

    @prim.def_jvp
    def _jvp(primals, tangents, **params):
        # Execution programs are never differentiated (AD happens before lowering);
        # the linear kinds still have the obvious rule.
        if _kind(params["kind"], backend).reduces and params.get("op") != "sum":
            raise NotImplementedError(f"{backend} {params['kind']}({params.get('op')}) is "
                                      "not differentiable")
        out = bind(prim, *primals, **params)
        (t,) = tangents
        return out, t if isinstance(t, Zero) else bind(prim, t, **params)

    # Collective combining (spmd.compiler.passes.combine): all-reduces over the same ranks
    # with the same operation are elementwise, so several can run as one over
    # their concatenation.
    def _combine_key(eqn):
        p = eqn.params
        return (p["ranks"], p.get("op")) if p["kind"] == "allreduce" else None

    def _combine_params(eqns, nbytes):
        names = sorted({e.params.get("what") or "allreduce" for e in eqns})
        return {**eqns[0].params,
                "what": f"{'/'.join(names)} x{len(eqns)} combined ({nbytes} bytes)"}

    prim.rules.combine_key = _combine_key
    prim.rules.combine_params = _combine_params

    @prim.def_batch
    def _batch(args, dims, **params):
        raise NotImplementedError(f"the {backend} execution primitive is not batched: vmap "
                                  "applies before a program is lowered for execution")
