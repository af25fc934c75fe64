"""Eager primitives on sharded Arrays run through the partitioner.

:func:`spmd.shard.call.dispatch.eval_primitive` calls :func:`run_sharded` for a
primitive (other than ``jit`` and ``shard_map``) with an argument placed on a
mesh of several devices: the primitive runs as a (cached) partitioned jit of
``bind(prim, ...)`` whose inputs keep their placements, and its results carry
the shardings that propagation decided.  On a mesh spread over processes that is
the only way to compute on the arrays (each process holds only its blocks), so
every primitive, higher-order ones included, goes this way there.

>>> x = spmd.device_put(np.ones((8, 4)), NamedSharding(mesh, P("data")))
>>> (snp.tanh(x) + 1).sharding.spec
PartitionSpec('data',)
"""

from __future__ import annotations

from spmd.compiler.core.trace import bind
from spmd.shard.call.jit import Jit

# One jit per (primitive, params); its plans are keyed on avals and shardings.
_CACHE: dict = {}
_CACHE_LIMIT = 4096


def run_sharded(prim, args, params, mesh):
    """The outputs of ``prim`` on sharded Arrays, or None where it does not apply (a
    higher-order primitive, or unhashable parameters, in one process: computed on the
    whole values)."""
    multi = mesh.is_multi_process
    if prim.higher_order and not multi:
        return None
    try:
        key = (prim, tuple(sorted(params.items())))
        hash(key)
    except TypeError:  # unhashable params
        if not multi:
            return None
        key = None
    pj = _CACHE.get(key) if key is not None else None
    if pj is None:
        def fn(*xs):
            out = bind(prim, *xs, **params)
            return list(out) if prim.multiple_results else [out]

        fn.__name__ = prim.name
        pj = Jit(fn, user=False)
        if key is not None:
            if len(_CACHE) >= _CACHE_LIMIT:
                _CACHE.clear()
            _CACHE[key] = pj
    return list(pj(*args))
