"""Eager operations on sharded Arrays run through the partitioner.

``EvalTrace.process_primitive`` calls :func:`run_sharded` (through the compiler's
``SHARDED_EAGER`` extension point, filled by :mod:`spmd._install`) when an
argument is an Array that carries a sharding: where that is a NamedSharding over more than one
device, the primitive runs as a (cached) partitioned jit of ``bind(prim, ...)``
whose inputs keep their placements, and its results carry the shardings that
propagation decided.

>>> x = spmd.device_put(np.ones((8, 4)), NamedSharding(mesh, P("data")))
>>> (snp.tanh(x) + 1).sharding.spec
PartitionSpec('data',)
"""

from __future__ import annotations

from spmd.compiler.array import Array
from spmd.compiler.trace import bind
from spmd.shard.spec import NamedSharding

# One PartitionedJit per (primitive, params); it caches per avals and shardings.
_CACHE: dict = {}
_CACHE_LIMIT = 4096


def _mesh_of(args):
    """The one mesh of the sharded arguments (None: nothing to partition)."""
    mesh = None
    for a in args:
        s = a._sharding if type(a) is Array else None
        if isinstance(s, NamedSharding) and s.mesh.size > 1:
            if mesh is not None and s.mesh != mesh:
                return None  # several meshes: computed whole, as an unplaced value
            mesh = s.mesh
    return mesh


def run_sharded(prim, args, params):
    """The outputs of ``prim`` on sharded Arrays, or None where it does not apply."""
    if prim.higher_order or _mesh_of(args) is None:
        return None
    try:
        key = (prim, tuple(sorted(params.items())))
        hash(key)
    except TypeError:  # unhashable params: computed whole
        return None
    pj = _CACHE.get(key)
    if pj is None:
        from spmd.shard.partition.api import PartitionedJit

        def fn(*xs):
            out = bind(prim, *xs, **params)
            return list(out) if prim.multiple_results else [out]

        fn.__name__ = prim.name
        pj = PartitionedJit(fn, None, None)
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = pj
    return list(pj(*args))
