"""Hypothesis strategies for sharded programs: meshes, partition specs that fit a shape
on a mesh, and arrays placed by them, so that "the same result on every mesh" is a
few lines::

    from hypothesis import given
    from spmd.testing import assert_sharded_allclose, strategies as sst

    @given(sst.sharded_arrays(max_rank=2))
    def test_double(x):
        assert_sharded_allclose(spmd.jit(lambda v: v * 2)(x), np.asarray(x) * 2)

Meshes are made of the process's devices (at most ``spmd.device_count()``; use the
``spmd_mesh`` fixture or :func:`spmd.testing.simulated_devices` for more).  Needs
``hypothesis`` (in spmd's ``test`` extra).
"""

from __future__ import annotations

import math

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as e:  # pragma: no cover - the test extra has it
    raise ImportError("spmd.testing.strategies needs hypothesis: pip install hypothesis "
                      "(or spmd[test])") from e

import spmd
from spmd.errors import ArgumentError
from spmd.shard.arrays.spec import NamedSharding, P

__all__ = ["meshes", "partition_specs", "shapes_and_specs", "sharded_arrays"]

_NAMES = ("i", "j", "k", "l")


def _divisors_of_two(n: int) -> list:
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= n and n % d == 0]


@st.composite
def meshes(draw, *, max_devices: int | None = None, max_axes: int = 3,
           names=_NAMES):
    """Meshes of ``spmd.make_mesh`` over 1 to ``max_axes`` axes named ``names``, of a
    power-of-two number of devices up to ``max_devices`` (default: the process's
    device count).

    >>> mesh = meshes(max_devices=8).example()   # doctest: +SKIP
    """
    have = spmd.device_count()
    cap = have if max_devices is None else int(max_devices)
    if cap < 1 or cap > have:
        raise ArgumentError(f"meshes: max_devices={max_devices!r} must be between 1 and this "
                            f"process's {have} devices (spmd.testing.simulated_devices gives "
                            "more)")
    if not 1 <= max_axes <= len(names):
        raise ArgumentError(f"meshes: max_axes={max_axes!r} must be between 1 and "
                            f"len(names)={len(names)}")
    n = draw(st.sampled_from([d for d in _divisors_of_two(cap) if d <= cap]))
    naxes = draw(st.integers(1, max_axes))
    sizes, left = [], n
    for _ in range(naxes - 1):
        s = draw(st.sampled_from(_divisors_of_two(left)))
        sizes.append(s)
        left //= s
    sizes.append(left)
    return spmd.make_mesh(tuple(sizes), tuple(names[:naxes]))


@st.composite
def partition_specs(draw, shape, mesh):
    """PartitionSpecs that fit ``shape`` on ``mesh``: each dimension split over unused
    mesh axes whose sizes multiply to a divisor of it (or not split).

    >>> spec = partition_specs((8, 6), mesh).example()   # doctest: +SKIP
    """
    shape = tuple(int(s) for s in shape)
    unused = list(draw(st.permutations(list(mesh.axis_names))))
    entries = []
    for n in shape:
        fits = [a for a in unused if n % mesh.axis_size(a) == 0]
        k = draw(st.integers(0, min(2, len(fits))))
        chosen = []
        for a in fits:
            if len(chosen) == k:
                break
            if n % (math.prod(mesh.axis_size(c) for c in chosen) * mesh.axis_size(a)) == 0:
                chosen.append(a)
        for a in chosen:
            unused.remove(a)
        if not chosen:
            entries.append(None)
        else:
            entries.append(chosen[0] if len(chosen) == 1 and draw(st.booleans())
                           else tuple(chosen))
    while entries and entries[-1] is None and draw(st.booleans()):
        entries.pop()  # a shorter spec means the same
    return P(*entries)


@st.composite
def shapes_and_specs(draw, mesh, *, max_rank: int = 3, max_blocks: int = 3):
    """``(shape, spec)``: a spec over ``mesh``'s axes and a shape it fits, each dimension
    0 to ``max_blocks`` blocks of its axes' size (so uneven data never needs padding).

    >>> shape, spec = shapes_and_specs(mesh).example()   # doctest: +SKIP
    """
    rank = draw(st.integers(0, max_rank))
    unused = list(draw(st.permutations(list(mesh.axis_names))))
    spec, shape = [], []
    for _ in range(rank):
        k = draw(st.integers(0, min(2, len(unused))))
        axes, unused = tuple(unused[:k]), unused[k:]
        spec.append(None if k == 0 else (axes[0] if k == 1 and draw(st.booleans()) else axes))
        shape.append(draw(st.integers(0, max_blocks)) * mesh.axis_size(axes))
    while spec and spec[-1] is None and draw(st.booleans()):
        spec.pop()
    return tuple(shape), P(*spec)


@st.composite
def sharded_arrays(draw, mesh=None, *, shape=None, spec=None, dtype=np.float32,
                   elements=None, max_rank: int = 3):
    """Arrays placed on ``mesh`` (drawn by :func:`meshes` when None) by ``spec`` (drawn
    to fit ``shape`` when None; both drawn by :func:`shapes_and_specs` when neither is
    given), with values of ``dtype`` (``elements``: a strategy for them; finite floats
    in [-100, 100] by default).

    >>> x = sharded_arrays(mesh, shape=(8, 4)).example()   # doctest: +SKIP
    """
    mesh = draw(meshes()) if mesh is None else mesh
    if shape is None and spec is None:
        shape, spec = draw(shapes_and_specs(mesh, max_rank=max_rank))
    elif spec is None:
        spec = draw(partition_specs(shape, mesh))
    elif shape is None:
        raise ArgumentError("sharded_arrays: a spec was given without a shape; give "
                            "shape= too (or neither)")
    dtype = np.dtype(dtype)
    if elements is None:
        elements = st.floats(-100, 100, width=8 * min(dtype.itemsize, 8)) \
            if dtype.kind == "f" else hnp.from_dtype(dtype)
    value = draw(hnp.arrays(dtype, tuple(shape), elements=elements))
    return spmd.device_put(value, NamedSharding(mesh, spec))
