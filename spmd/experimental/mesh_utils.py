"""``spmd.experimental.mesh_utils``: device arrays to build a :class:`spmd.Mesh` from,
as ``jax.experimental.mesh_utils`` gives them.

spmd's devices have no physical topology to follow (simulated devices, or one GPU
or CPU per rank), so :func:`create_device_mesh` lays them out in ``spmd.devices()``
order, process-major: the last axes of a mesh stay within a process, where the
collectives are cheapest.  :func:`create_hybrid_device_mesh` takes each process as
JAX's "granule" (JAX's ``process_is_granule=True``): ``mesh_shape`` is laid out
within each process and ``dcn_mesh_shape`` across processes.

>>> from spmd.experimental import mesh_utils
>>> devices = mesh_utils.create_device_mesh((4, 2))
>>> mesh = spmd.Mesh(devices, ("data", "model"))
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.errors import ArgumentError
from spmd.mesh import Device, devices as all_devices

__all__ = ["create_device_mesh", "create_hybrid_device_mesh"]


def _shape(shape, what: str, fname: str) -> tuple:
    try:
        out = tuple(int(s) for s in shape)
    except TypeError:
        raise ArgumentError(f"{fname}: {what} must be a sequence of ints, got {shape!r}") \
            from None
    if any(s < 1 for s in out):
        raise ArgumentError(f"{fname}: {what}={out} has a size below 1; every axis needs "
                            "at least one device")
    return out


def _device_list(devices, fname: str) -> list:
    devs = list(all_devices() if devices is None else np.asarray(devices, object).flat)
    bad = [d for d in devs if not isinstance(d, Device)]
    if bad:
        raise ArgumentError(f"{fname}: devices must be spmd Devices (from spmd.devices()), "
                            f"got {bad[0]!r}")
    return devs


def create_device_mesh(mesh_shape: Sequence[int], devices=None, *,
                       contiguous_submeshes: bool = False,
                       allow_split_physical_axes: bool = False) -> np.ndarray:
    """An array of shape ``mesh_shape`` holding ``devices`` (default: all of
    ``spmd.devices()``), in their order; pass it to ``spmd.Mesh``.  The two keyword
    options of JAX's signature are accepted: with no physical topology they change
    nothing.

    >>> create_device_mesh((2, 4)).shape
    (2, 4)
    """
    fname = "create_device_mesh"
    shape = _shape(mesh_shape, "mesh_shape", fname)
    devs = _device_list(devices, fname)
    if math.prod(shape) != len(devs):
        raise ArgumentError(f"{fname}: mesh_shape={shape} holds {math.prod(shape)} devices "
                            f"but {len(devs)} were given; pass a shape whose product is "
                            f"{len(devs)} (or devices= with {math.prod(shape)} devices)")
    out = np.empty(len(devs), dtype=object)
    out[:] = devs
    return out.reshape(shape)


def create_hybrid_device_mesh(mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int],
                              devices=None, *, process_is_granule: bool = True,
                              should_sort_granules_by_key: bool = True,
                              allow_split_physical_axes: bool = False) -> np.ndarray:
    """An array of shape ``mesh_shape * dcn_mesh_shape`` (elementwise): within each
    process its devices laid out as ``mesh_shape``, the processes laid out as
    ``dcn_mesh_shape``, each axis's process blocks outermost, as in JAX.  A process is
    the granule (spmd has no slices); ``process_is_granule=False`` is refused.

    >>> # 2 processes of 4 devices: data over processes, model within each
    >>> create_hybrid_device_mesh((1, 4), (2, 1)).shape   # doctest: +SKIP
    (2, 4)
    """
    fname = "create_hybrid_device_mesh"
    if not process_is_granule:
        raise ArgumentError(f"{fname}: process_is_granule=False asks for TPU slices as "
                            "granules, which spmd has not; its granule is a process "
                            "(leave process_is_granule=True)")
    inner = _shape(mesh_shape, "mesh_shape", fname)
    outer = _shape(dcn_mesh_shape, "dcn_mesh_shape", fname)
    if len(inner) != len(outer):
        raise ArgumentError(f"{fname}: mesh_shape={inner} and dcn_mesh_shape={outer} must "
                            "have the same number of axes")
    devs = _device_list(devices, fname)
    granules: dict = {}
    for d in devs:
        granules.setdefault(d.process_index, []).append(d)
    order = sorted(granules) if should_sort_granules_by_key else list(granules)
    if len(order) != math.prod(outer):
        raise ArgumentError(f"{fname}: dcn_mesh_shape={outer} lays out {math.prod(outer)} "
                            f"processes but the devices belong to {len(order)}; make its "
                            f"product {len(order)}")
    sizes = {p: len(granules[p]) for p in order}
    if any(n != math.prod(inner) for n in sizes.values()):
        raise ArgumentError(f"{fname}: mesh_shape={inner} lays out {math.prod(inner)} "
                            f"devices per process but the processes have {sizes}; make its "
                            "product each process's device count")
    # (outer..., inner...) -> interleave (o0, i0, o1, i1, ...) -> merge each pair.
    blocks = np.stack([create_device_mesh(inner, granules[p]) for p in order])
    blocks = blocks.reshape(outer + inner)
    n = len(inner)
    blocks = blocks.transpose([k for i in range(n) for k in (i, n + i)])
    return blocks.reshape(tuple(o * i for o, i in zip(outer, inner)))
