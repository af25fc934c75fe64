"""Values between the host and the devices, as JAX's top-level functions move them:
:func:`block_until_ready`, :func:`device_get` and
:func:`make_array_from_single_device_arrays`.

>>> y = spmd.block_until_ready(step(params, batch))
>>> host = spmd.device_get({"loss": loss, "acc": acc})   # numpy values
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import to_host
from spmd.compiler.core.tracer import Tracer
from spmd.errors import ArgumentError, NotFullyAddressableError, ShapeError
from spmd.shard.arrays.placing import make_array_from_callback
from spmd.shard.arrays.sharded import index_key, my_devices

__all__ = ["block_until_ready", "device_get", "make_array_from_single_device_arrays"]


def block_until_ready(x: Any) -> Any:
    """Wait until every Array of the pytree ``x`` is computed, and return ``x`` (other
    leaves pass through), as ``jax.block_until_ready``.

    >>> spmd.block_until_ready((loss, params))   # doctest: +SKIP
    """
    for leaf in tree_util.tree_leaves(x):
        if isinstance(leaf, Array):
            leaf.block_until_ready()
    return x


def device_get(x: Any) -> Any:
    """The pytree ``x`` with each Array replaced by its value as a numpy array (other
    leaves pass through), as ``jax.device_get``.  An Array spread over processes has
    no value here: gather it with ``multihost_utils.process_allgather``.

    >>> spmd.device_get({"w": snp.ones(2), "step": 3})
    {'step': 3, 'w': array([1., 1.], dtype=float32)}
    """
    def get(leaf):
        if isinstance(leaf, Tracer):
            raise ArgumentError("device_get: got a traced value; call it on concrete "
                                "arrays, outside jit and other transformations")
        if not isinstance(leaf, Array):
            return leaf
        if not leaf.is_fully_addressable:
            raise NotFullyAddressableError(
                f"device_get: an Array of shape {leaf.shape} spans devices of other "
                f"processes ({leaf.sharding!r}); fetch its whole value with "
                "spmd.experimental.multihost_utils.process_allgather(x) (every process "
                "must call it), or read this process's blocks with x.addressable_shards")
        return np.array(to_host(leaf), copy=True)

    return tree_util.tree_map(get, x)


def make_array_from_single_device_arrays(shape: Sequence[int], sharding, arrays: Sequence,
                                         *, dtype=None) -> Array:
    """An Array of global ``shape`` placed by ``sharding`` from ``arrays``: one block per
    device of this process in the sharding's order (``sharding.mesh.devices.flat``,
    this process's only), each of the sharding's block shape, as
    ``jax.make_array_from_single_device_arrays``.  On a mesh spread over processes each
    process passes the blocks of its own devices.  ``dtype``, when given, is checked
    against the blocks'.

    >>> s = NamedSharding(mesh, P("i"))                # 4 devices
    >>> x = spmd.make_array_from_single_device_arrays(
    ...     (8,), s, [np.full(2, k, np.float32) for k in range(4)])
    """
    fname = "make_array_from_single_device_arrays"
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ArgumentError(f"{fname}: shape must be a tuple of ints, got {shape!r}") from None
    arrays = list(arrays) if not isinstance(arrays, (np.ndarray, Array)) else None
    if arrays is None:
        raise ArgumentError(f"{fname}: arrays must be a list of per-device arrays, one per "
                            "device of this process, not one array")
    devices = my_devices(sharding)
    if len(arrays) != len(devices):
        raise ArgumentError(f"{fname}: got {len(arrays)} arrays for the {len(devices)} "
                            f"devices of this process in {sharding!r}; pass one per device, "
                            "in the order of sharding.mesh.devices.flat")
    want = sharding.shard_shape(shape)
    dtype_of_blocks = None
    for k, a in enumerate(arrays):
        if isinstance(a, Tracer):
            raise ArgumentError(f"{fname}: arrays[{k}] is a traced value; pass concrete "
                                "arrays, outside jit")
        a_shape, a_dtype = np.shape(a), getattr(a, "dtype", np.asarray(a).dtype)
        if tuple(a_shape) != tuple(want):
            raise ShapeError(f"{fname}: arrays[{k}] (device {devices[k]}) has shape "
                             f"{tuple(a_shape)}, but {sharding!r} gives each device a "
                             f"block of shape {tuple(want)} of the global shape {shape}")
        if dtype_of_blocks is not None and np.dtype(a_dtype) != dtype_of_blocks:
            raise ArgumentError(f"{fname}: arrays[{k}] has dtype {np.dtype(a_dtype)} but "
                                f"arrays[0] has {dtype_of_blocks}; give every block one dtype")
        dtype_of_blocks = np.dtype(a_dtype)
    if not arrays:
        raise ArgumentError(f"{fname}: this process holds no device of {sharding!r}; call it "
                            "on the processes of the sharding's mesh")
    if dtype is not None and np.dtype(dtype) != dtype_of_blocks:
        raise ArgumentError(f"{fname}: dtype={np.dtype(dtype)} but the arrays have dtype "
                            f"{dtype_of_blocks}; convert them, or leave dtype=None")
    imap = sharding.devices_indices_map(shape)
    by_block: dict = {}
    for d, a in zip(devices, arrays):  # replicas: the first device's block stands
        by_block.setdefault(index_key(imap[d], shape), a)
    return make_array_from_callback(
        shape, sharding, lambda index: to_host(by_block[index_key(index, shape)]))
