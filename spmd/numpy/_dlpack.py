"""``spmd.numpy.from_dlpack``: an Array on a producer's memory (numpy, PyTorch, CuPy).

The producer side (``x.__dlpack__``) and what may be shared are in
:mod:`spmd.compiler.core.dlpack`; this module wraps the shared buffer as an Array
and places it where ``device=`` says.
"""

from __future__ import annotations

from spmd.compiler.core.array import Array
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.dlpack import DLPackError, take
from spmd.shard.arrays.placing import _as_sharding, device_put
from spmd.shard.arrays.sharded import holds_full_value

__all__ = ["from_dlpack"]


def from_dlpack(x, /, *, device=None, copy=None):
    """An Array of the DLPack producer ``x`` (a numpy array, a PyTorch tensor, a CuPy
    array on GPU devices, an spmd Array), as ``jax.numpy.from_dlpack``.

    The Array shares ``x``'s memory when it is C-contiguous host memory (device
    memory on GPU devices) in spmd's dtype: writes through ``x`` show in it.
    Otherwise it holds a copy -- a strided view, or a 64-bit dtype narrowed to 32
    bits without ``enable_x64`` -- and ``copy=False`` raises ``DLPackError`` (a
    ``BufferError``) naming why; ``copy=True`` always copies.  ``device``: a Device
    or a sharding to place the result with (``spmd.device_put``): the buffer is kept
    whole where this process's devices hold every block, and where they hold only
    some (a mesh spread over processes) their blocks are copies.

    >>> t = torch.arange(4.0)                       # doctest: +SKIP
    >>> x = snp.from_dlpack(t); t[0] = 7.0; x[0]    # doctest: +SKIP
    Array(7., dtype=float32)
    """
    fname = "spmd.numpy.from_dlpack"
    buffer, _ = take(x, copy, fname)
    out = Array(buffer, ShapedArray(tuple(buffer.shape), buffer.dtype, False))
    if device is None:
        return out
    sharding = _as_sharding(device, f"{fname}: device")
    if copy is False and not holds_full_value(sharding):
        raise DLPackError(
            f"{fname}(x, device={device!r}, copy=False): under that sharding this process "
            "holds only some of its blocks, one per device of this process, which are "
            "copies of x's memory: pass copy=None, or a sharding over this process's "
            "devices (or a Device) to share it")
    return device_put(out, sharding)
