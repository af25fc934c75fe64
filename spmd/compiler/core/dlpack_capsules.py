"""DLPack capsules read and retyped: bfloat16, which numpy's DLPack does not exchange.

numpy exports and imports integers, floats, complex and bool only; ``ml_dtypes``'s
bfloat16 (the dtype of mixed-precision training, and of PyTorch's ``torch.bfloat16``)
it refuses both ways.  DLPack itself has the type (``kDLBfloat``, 16 bits), so a
bfloat16 buffer crosses as its 16-bit pattern with the type code rewritten in the
capsule's ``DLTensor``:

- exporting, numpy exports the buffer viewed as ``uint16`` and :func:`retype`
  turns the capsule's type into bfloat16 (the consumer, e.g. PyTorch, sees
  bfloat16 on the same memory);
- importing, :func:`capsule_of` asks the producer for its capsule and, for a
  bfloat16 one, :func:`retype` turns it into ``uint16`` for numpy, whose array the
  caller views as bfloat16 -- no copy either way.

The structures are dlpack.h's (``DLManagedTensor``, and ``DLManagedTensorVersioned``
of DLPack 1, the capsule names ``"dltensor"`` and ``"dltensor_versioned"``).

>>> import numpy as np
>>> dtype_of(np.arange(3, dtype=np.uint16).__dlpack__())
(1, 16, 1)
"""

from __future__ import annotations

import ctypes

# DLDataTypeCode values (dlpack.h).
KDL_UINT = 1
KDL_BFLOAT = 4
BFLOAT16 = (KDL_BFLOAT, 16, 1)  # (code, bits, lanes)
UINT16 = (KDL_UINT, 16, 1)


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    """dlpack.h's ``DLTensor``."""
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):  # DLManagedTensor (the legacy capsule, "dltensor")
    _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):  # DLManagedTensorVersioned ("dltensor_versioned")
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", Tensor)]


_LAYOUTS = {b"dltensor": _Managed, b"dltensor_versioned": _ManagedVersioned}
_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype, _get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                ctypes.c_char_p]


def tensor(capsule) -> Tensor:
    """The ``DLTensor`` inside an unconsumed DLPack capsule (a view of its memory:
    writing its fields changes the capsule)."""
    name = _get_name(capsule)
    layout = _LAYOUTS.get(name)
    if layout is None:
        raise ValueError(f"not a DLPack capsule (named {name!r}); a consumed capsule is "
                         "renamed 'used_dltensor' and cannot be read again")
    return layout.from_address(_get_pointer(capsule, name)).dl_tensor


def dtype_of(capsule) -> tuple[int, int, int]:
    """``(type code, bits, lanes)`` of a capsule's tensor."""
    t = tensor(capsule).dtype
    return (t.code, t.bits, t.lanes)


def retype(capsule, old: tuple, new: tuple):
    """``capsule`` with its tensor's type ``old`` rewritten as ``new`` (both of one
    size: the memory is read the new way); returns the capsule."""
    t = tensor(capsule).dtype
    if (t.code, t.bits, t.lanes) != old:  # internal: the callers check the type first
        raise AssertionError(f"capsule of type {(t.code, t.bits, t.lanes)}, expected {old}")
    t.code, t.bits, t.lanes = new
    return capsule


def capsule_of(x, copy=None):
    """``x``'s DLPack capsule, DLPack 1 where the producer has it (as the standard
    asks a consumer to try first), the legacy one otherwise.  ``copy=False`` is
    passed on (the producer must not copy; one before DLPack 1 never does)."""
    given = {} if copy is not False else {"copy": False}
    try:
        return x.__dlpack__(max_version=(1, 0), **given)
    except TypeError:  # a producer before DLPack 1: no max_version (nor copy) keyword
        return x.__dlpack__()


class Held:
    """A producer that hands over one capsule already taken (to numpy's
    ``from_dlpack``, which takes producers, not capsules)."""

    def __init__(self, capsule, device: tuple):
        self._capsule, self._device = capsule, device

    def __dlpack__(self, **_):
        # (numpy's keywords -- max_version, dl_device, copy -- asked of a host
        # capsule already taken: it is what it is, and numpy checks it.)
        return self._capsule

    def __dlpack_device__(self):
        return self._device
