"""The array module that concrete values live in: numpy, or cupy on GPU devices.

The compiler only knows "an array module ``xp``" (primitive impls and the
generated code use ``xp.`` functions).  Which one runs eager operations and
jitted programs is a property of the devices, decided by the runtime layer
(:mod:`spmd.launch.platform`), which fills the ``ARRAY_MODULE`` extension point
(:mod:`spmd.compiler.extensions`): the compiler never imports the layers above
it, nor cupy.

- :func:`current` is the module (resolved once, on first use; numpy when the
  extension point is not filled);
- :func:`is_device_array`, :func:`to_host` and :func:`to_device` move values
  between host memory (numpy) and the device module without ever touching
  cupy on the CPU path: device array types are registered by the resolver
  (:func:`register_device_type`) when it loads a device module.  Every entry
  point that takes a user's value converts it through these (CuPy refuses the
  implicit ``np.asarray`` of a device array);
- :data:`device_id` is this process's GPU, set by the resolver: a device array
  that sits on another GPU (made before spmd chose its GPU, say) is copied to
  this one by :func:`to_device`.

>>> current() is np
True
>>> to_host(np.arange(3))
array([0, 1, 2])
"""

from __future__ import annotations

import numpy as np

# The resolved module (None: not resolved yet) and whether it is a device one.
_xp: list = [None]
on_device: list = [False]
# Types of device arrays (cupy.ndarray) and their module, registered when loaded.
device_types: set = set()
_module_of_type: dict = {}
# The GPU this process's device arrays belong on (None: not chosen, or no GPU).
device_id: list = [None]
# Host values: to_host never needs to resolve the module for these.
_HOST_TYPES = (list, tuple, int, float, complex, bool, np.generic)


def current():
    """The array module of this process's devices (numpy unless they are GPUs)."""
    xp = _xp[0]
    if xp is None:
        from spmd.compiler import extensions  # (a module that imports nothing of ours)

        point = extensions.ARRAY_MODULE
        if point.installed_by is None:  # before the installer ran: decide later
            return np
        xp, device_id[0] = point.fn()
        _xp[0] = xp
        on_device[0] = xp is not np
    return xp


def set_current(xp) -> None:
    """Use ``xp`` from now on (``None``: resolve again on the next use).

    Called when the runtime is reconfigured (``spmd.distributed.initialize``)
    and by tests that run the same program on several array modules.
    """
    _xp[0] = xp
    on_device[0] = xp is not None and xp is not np
    if xp is None or xp is np:
        device_id[0] = None


def register_device_type(t: type, module) -> None:
    """Record ``t`` (e.g. ``cupy.ndarray``) as an array type of device ``module``."""
    device_types.add(t)
    _module_of_type[t] = module


def is_device_array(x) -> bool:
    """Whether ``x`` is an array of a device module (cupy).  Device types are known
    once the module is resolved, so an unknown type resolves it first: a cupy array
    may be the very first value a process gives spmd."""
    if type(x) in device_types:
        return True
    if _xp[0] is None:
        current()
        return type(x) in device_types
    return False


def module_of(x):
    """The array module that holds ``x`` (numpy for host values)."""
    return _module_of_type.get(type(x), np)


def to_host(x) -> np.ndarray:
    """``x`` as a numpy array: a copy from device memory, ``x`` itself on the host.
    Anything ``np.asarray`` takes works too (an spmd Array copies its value)."""
    t = type(x)
    if t is np.ndarray:
        return x
    if t in device_types or (not isinstance(x, _HOST_TYPES) and is_device_array(x)):
        return _module_of_type[t].asnumpy(x)
    return np.asarray(x)


def synchronize(x) -> None:
    """Wait for the device work queued on the current stream (a no-op on the host)."""
    t = type(x)
    if t in device_types:
        _module_of_type[t].cuda.get_current_stream().synchronize()


def to_device(x, dtype=None):
    """``x`` (numpy, scalar or device array) as an array of the current module, in
    ``dtype`` when given; on the CPU, a numpy array."""
    xp = current()
    t = type(x)
    if t in device_types:
        if device_id[0] is not None and x.device.id != device_id[0]:
            # Made on another GPU (CuPy's default is GPU 0): CuPy's asarray copies
            # it to the current one, which is this process's.
            x = _module_of_type[t].asarray(x)
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)
    if xp is np:
        return np.asarray(x, dtype=dtype)
    return xp.asarray(np.asarray(x, dtype=dtype))
