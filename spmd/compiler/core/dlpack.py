"""DLPack for the array module's buffers: exporting one, and taking a producer's.

The array API standard's protocol (``__dlpack__`` / ``__dlpack_device__`` on the
producer, ``from_dlpack`` on the consumer) moves arrays between libraries without a
copy.  spmd's buffers are numpy arrays (cupy on GPU devices), which speak it
already; what this module adds is spmd's side of the contract:

- :func:`export` is :meth:`spmd.Array.__dlpack__` once the Array has chosen its
  buffer: ``copy`` is decided here (so it means the same on every numpy version,
  1.26 has no ``copy=``), the other keywords go to the buffer;
- :func:`take` is the buffer :func:`spmd.numpy.from_dlpack` wraps: the producer's
  memory itself when it is C-contiguous, in spmd's (canonical) dtype and in this
  process's array module, else a copy in that form -- every buffer an Array holds
  has the layout spmd's own producers give it, so no later use copies again;
- :class:`DLPackError` (a ``BufferError``, the standard's type) names what made
  a copy necessary where ``copy=False`` forbids one;
- bfloat16, which numpy's DLPack lacks, crosses both ways as DLPack's own type
  (:mod:`spmd.compiler.core.dlpack_capsules` rewrites the capsules' type).

Sharing memory is safe because spmd never writes into a buffer it did not make:
``donate_argnums`` only marks the Array deleted, and compiled code updates in place
only buffers it allocated itself (loop carries are copied before the loop;
:mod:`spmd.compiler.ops.loop_runs`), and MPI's pooled receive buffers are reused
only once nothing refers to them (a consumer's capsule does).
``tests/shard/test_dlpack.py`` holds this.

>>> import numpy as np
>>> a = np.arange(4.0, dtype=np.float32)
>>> buf, copied = take(a, None, "from_dlpack")
>>> copied, np.shares_memory(buf, a)
(False, True)
"""

from __future__ import annotations

import numpy as np

from spmd.compiler.core import array_module, dtypes
from spmd.compiler.core import dlpack_capsules as capsules
from spmd.errors import SpmdError

# DLPack's device types (dlpack.h, DLDeviceType) that spmd's array modules use.
KDL_CPU = 1
KDL_CUDA = 2
# Host memory a GPU library may hand out (pinned): numpy reads it as CPU memory.
_HOST_KINDS = (KDL_CPU, 3)


class DLPackError(SpmdError, BufferError):
    """A DLPack export or import that cannot be done as asked: a copy would be
    needed where ``copy=False`` forbids one, or the producer is no DLPack producer."""


def device_of(buffer) -> tuple[int, int]:
    """``(device type, device id)`` of an array-module buffer: ``(1, 0)`` (CPU) for
    numpy, ``(2, gpu)`` for cupy.

    >>> device_of(np.zeros(2))
    (1, 0)
    """
    return tuple(_exportable(buffer).__dlpack_device__())


def _exportable(buffer):
    """``buffer`` as an array that exports: a numpy scalar (a 0-d value some paths
    may hold) has no ``__dlpack__`` of its own, its 0-d array has."""
    return np.asarray(buffer) if isinstance(buffer, np.generic) else buffer


def export(buffer, made: bool, what: str, *, stream=None, max_version=None,
           dl_device=None, copy=None):
    """The DLPack capsule of ``buffer`` (``made``: it was made for this export, a
    copy the caller owns alone), under the standard's keywords.

    ``copy=True`` exports a fresh copy (``buffer`` itself when ``made``); ``False``
    and ``None`` share ``buffer``.  ``dl_device``: the device the consumer wants;
    a GPU buffer asked for on the CPU is copied to the host (unless ``copy=False``).
    ``what`` names the array in errors.

    >>> type(export(np.arange(3), False, "x", copy=True)).__name__
    'PyCapsule'
    """
    buffer = _exportable(buffer)
    if dl_device is not None and tuple(dl_device) != device_of(buffer):
        if array_module.is_device_array(buffer) and tuple(dl_device)[0] == KDL_CPU:
            if copy is False:
                raise DLPackError(
                    f"{what}.__dlpack__(dl_device={tuple(dl_device)}, copy=False): the "
                    f"array is on the GPU {device_of(buffer)}; a CPU consumer needs a copy "
                    "to host memory: pass copy=None or copy=True")
            buffer, made, dl_device = array_module.to_host(buffer), True, None
    if copy is True and not made:
        buffer = buffer.copy()
    # Only the keywords given go on (numpy 1.26's __dlpack__ takes stream alone; a
    # consumer that passes max_version retries without it on a TypeError, as the
    # standard asks).
    given = {k: v for k, v in (("stream", stream), ("max_version", max_version),
                               ("dl_device", dl_device)) if v is not None}
    if buffer.dtype == dtypes.bfloat16 and not array_module.is_device_array(buffer):
        # numpy exports no bfloat16: its bits as uint16, retyped in the capsule.
        return capsules.retype(buffer.view(np.uint16).__dlpack__(**given),
                               capsules.UINT16, capsules.BFLOAT16)
    return buffer.__dlpack__(**given)


def take(x, copy, fname: str):
    """``(buffer, copied)``: the producer ``x`` as a buffer of this process's array
    module, C-contiguous and in spmd's canonical dtype -- ``x``'s memory itself
    where it already is all that (``copied`` False), else a copy (``copy=False``
    then raises :class:`DLPackError` naming the reason).  ``copy=True`` always copies.

    >>> take(np.arange(6.0, dtype=np.float32)[::2], None, "f")[1]   # strided: copied
    True
    """
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise DLPackError(
            f"{fname}: x is a {type(x).__name__}, not a DLPack producer (it has no "
            "__dlpack__ and __dlpack_device__ methods); pass a numpy array, a PyTorch "
            "tensor, a CuPy array or an spmd Array, or convert other values with "
            "spmd.numpy.asarray")
    kind, _ = device_of(x)
    buffer, moved = _in_module(x, kind, copy, fname)
    target = dtypes.canonicalize(buffer.dtype, fname)
    reasons = []
    if target != buffer.dtype:
        reasons.append(f"its dtype {buffer.dtype} is {target} in spmd"
                       + ("" if dtypes.x64_enabled() else " (64-bit types are narrowed "
                          "unless spmd.config.update('enable_x64', True))"))
    if not buffer.flags.c_contiguous:
        reasons.append(f"its layout is not C-contiguous (strides {buffer.strides})")
    if reasons and copy is False:
        raise DLPackError(
            f"{fname}(x, copy=False): x cannot be shared without a copy: "
            f"{'; '.join(reasons)}; pass copy=None to copy it where needed, or give a "
            "C-contiguous producer of that dtype (e.g. .contiguous() in PyTorch, "
            "np.ascontiguousarray in numpy)")
    if reasons or (copy is True and not moved):
        xp = array_module.module_of(buffer)
        return xp.array(buffer, dtype=target, order="C", copy=True), True
    return buffer, moved


def _in_module(x, kind: int, copy, fname: str):
    """``(buffer, copied)``: ``x``'s memory as an array of this process's array
    module (a copy only where it must move between host and GPU)."""
    xp = array_module.current()
    on_host = kind in _HOST_KINDS
    if xp is np and on_host:
        return _from_host(x, kind, copy), False
    if xp is not np and not on_host:  # GPU producer, GPU devices: cupy takes it
        shared = xp.from_dlpack(x)
        mine = array_module.to_device(shared)  # (a copy when on another GPU)
        return mine, mine is not shared
    if copy is False:
        where = "host" if on_host else f"device type {kind}"
        raise DLPackError(
            f"{fname}(x, copy=False): x is in {where} memory and spmd's arrays live in "
            f"{'GPU' if xp is not np else 'host'} memory; moving it is a copy: pass "
            "copy=None")
    if on_host:  # a host producer on GPU devices: copied up
        return array_module.to_device(_from_host(x, kind, None)), True
    # A GPU producer on the CPU path: ask it for a host copy (numpy >= 2.1).
    return np.from_dlpack(x, device="cpu", copy=True), True


def _from_host(x, kind: int, copy) -> np.ndarray:
    """numpy's view of a host producer's memory; a bfloat16 producer's too (numpy
    takes no bfloat16: its capsule is retyped uint16 and the view is bfloat16)."""
    capsule = capsules.capsule_of(x, copy)
    bf16 = dtypes.bfloat16 is not None and capsules.dtype_of(capsule) == capsules.BFLOAT16
    if bf16:
        capsules.retype(capsule, capsules.BFLOAT16, capsules.UINT16)
    out = np.from_dlpack(capsules.Held(capsule, (kind, 0)))
    return out.view(dtypes.bfloat16) if bf16 else out
