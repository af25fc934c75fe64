"""``spmd.experimental.shard_map``: the older path of :func:`spmd.shard_map` and its
older signature, as ``jax.experimental.shard_map.shard_map`` took it: the mesh
positional, ``check_rep=`` for ``check_vma=`` and ``auto=`` (the axes left to the
partitioner) for ``axis_names=`` (the manual ones).

>>> from spmd.experimental.shard_map import shard_map
>>> f = shard_map(lambda b: lax.psum(b, "i"), mesh, in_specs=P("i"), out_specs=P())
"""

from __future__ import annotations

from typing import Callable

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.shard.maps.shard_map import ShardMapError, shard_map as _shard_map

__all__ = ["shard_map"]


def shard_map(f: Callable, mesh, in_specs, out_specs, check_rep: bool = True,
              auto: frozenset = frozenset()):
    """``jax.experimental.shard_map.shard_map(f, mesh, in_specs, out_specs,
    check_rep=True, auto=frozenset())``: :func:`spmd.shard_map` with
    ``check_vma=check_rep`` and, when ``auto`` names axes, ``axis_names=`` the mesh's
    other axes (the body is manual over those only).

    >>> g = shard_map(body, mesh, P("i", None), P("i", None), auto=frozenset({"j"}))
    ... # doctest: +SKIP
    """
    names = getattr(mesh, "axis_names", None)
    if names is None:
        raise ShardMapError(f"experimental.shard_map: mesh must be a spmd.Mesh, got "
                            f"{type(mesh).__name__}")
    try:
        auto = frozenset(auto)
    except TypeError:
        raise ShardMapError(f"experimental.shard_map: auto must be a set of mesh axis "
                            f"names, got {auto!r}") from None
    unknown = sorted(auto - set(names), key=str)
    if unknown:
        raise ShardMapError(f"experimental.shard_map: auto={sorted(auto, key=str)} names "
                            f"{unknown}, not axes of the mesh {tuple(names)}")
    if auto == set(names):
        raise ShardMapError(f"experimental.shard_map: auto={sorted(auto)} leaves no manual "
                            "axis; name at most all but one of the mesh's axes")
    axis_names = frozenset(names) - auto if auto else None
    return _shard_map(f, mesh, in_specs, out_specs, check_vma=check_rep,
                      axis_names=axis_names)
