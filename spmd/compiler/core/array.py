"""The concrete array that eager operations and jitted calls return.

An :class:`Array` holds one buffer of the array module (numpy, or cupy when the
devices are GPUs: reading its value, ``np.asarray(x)``, then copies it to the
host) and its aval.  Arithmetic operators are installed by ``spmd.numpy`` (the
compiler does not import the front end).

Upper layers may define array types of their own as subclasses (the sharding
layer's :class:`spmd.shard.arrays.sharded.ShardedArray`, whose value need not all be in
this process).  Eager evaluation (and an eager jitted call) hands every primitive
application that has such an array among its arguments to the extension point
:data:`spmd.compiler.extensions.EAGER_EVAL`; everything else it reads through
``.value``, which a subclass may refuse.
"""

from __future__ import annotations

import numpy as np

from spmd.compiler import extensions as _ext
from spmd.compiler.core import dlpack as _dlpack
from spmd.compiler.core.array_module import device_types, synchronize, to_host
from spmd.compiler.core.avals import ShapedArray
from spmd.errors import DeletedArrayError


class Array:
    """A concrete array: ``np.asarray(x)`` gives its value.

    >>> import spmd.numpy as snp
    >>> snp.arange(3)
    Array([0, 1, 2], dtype=int32)
    """

    __slots__ = ("_value", "aval", "_deleted", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, value, aval: ShapedArray):
        self._value = value
        self.aval = aval
        self._deleted = False

    # ------------------------------------------------ the extension interface
    def _holds_value(self) -> bool:
        """Whether ``.value`` can be read in this process.  A subclass whose data is
        spread over processes says False; the compiler then keeps the array itself
        where it would copy its buffer (a constant of a traced program, which is
        then evaluated by binding its equations, e.g. by ``grad``)."""
        return True

    def __setstate__(self, state) -> None:
        """Unpickling.  The process may have imported nothing of spmd but this module
        (``spmd/__init__.py`` is lazy), so run the installer it registered: the
        array gets its operators and placement (``extensions.run_installer``)."""
        _ext.run_installer()
        inst, slots = state if isinstance(state, tuple) else (state, None)
        for k, v in {**(inst or {}), **(slots or {})}.items():
            object.__setattr__(self, k, v)

    # ---------------------------------------------------------------- data
    @property
    def value(self):
        if self._deleted:
            raise DeletedArrayError(
                "this Array was donated to a jitted call (donate_argnums) and its buffer "
                "may have been reused; use the call's result instead of the donated input")
        return self._value

    def __array__(self, dtype=None, copy=None):
        v = to_host(self.value)
        return v if dtype is None else v.astype(dtype, copy=False)

    # ---------------------------------------------------------------- DLPack
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The array API standard's export (as numpy >= 2 has it): a DLPack capsule
        sharing this Array's buffer (``copy=True``: a fresh copy).  Deleted (donated)
        Arrays raise ``DeletedArrayError``; see :mod:`spmd.compiler.core.dlpack`.

        >>> np.from_dlpack(snp.arange(3))   # doctest: +SKIP
        array([0, 1, 2], dtype=int32)
        """
        buffer, made = self._dlpack_buffer(copy)
        return _dlpack.export(buffer, made, "x", stream=stream, max_version=max_version,
                              dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(DLPack device type, id)`` of the buffer: ``(1, 0)`` for host memory."""
        return _dlpack.device_of(self.value)

    def _dlpack_buffer(self, copy):
        """``(buffer, made)``: what :meth:`__dlpack__` exports, and whether it was
        made for it.  A subclass whose buffer is not the whole value overrides it."""
        return self.value, False

    def delete(self) -> None:
        self._deleted = True

    def is_deleted(self) -> bool:
        return self._deleted

    def block_until_ready(self) -> "Array":
        """Wait until the value is computed (GPU work is asynchronous)."""
        v = self.value
        if type(v) in device_types:
            synchronize(v)
        return self

    def copy(self) -> "Array":
        v = self.value
        v = v.copy() if type(v) in device_types else np.array(v, copy=True)
        return Array(v, self.aval)

    def item(self):
        return to_host(self.value).item()

    def tolist(self):
        return to_host(self.value).tolist()

    # ------------------------------------------------------------- metadata
    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)
    size = property(lambda self: self.aval.size)
    weak_type = property(lambda self: self.aval.weak_type)
    nbytes = property(lambda self: self.aval.nbytes)

    # JAX's placement properties.  Where an Array that was never placed lives is
    # the shard layer's to say (the PLAIN_SHARDING / PLAIN_SHARDS extension points:
    # one whole copy on this process's first device); the shard layer's placed
    # subclass overrides all of these.
    sharding = property(lambda self: _ext.PLAIN_SHARDING.fn(self))
    addressable_shards = property(lambda self: _ext.PLAIN_SHARDS.fn(self))
    is_fully_addressable = property(lambda self: True)
    is_fully_replicated = property(lambda self: True)

    def addressable_data(self, i: int):
        """The data of the ``i``-th addressable shard."""
        return self.addressable_shards[i].data

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d Array")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d Array")
        return (self[i] for i in range(self.shape[0]))

    # Concrete values convert to Python values, as numpy's do.
    def __bool__(self):
        return bool(to_host(self.value))

    def __int__(self):
        return int(to_host(self.value))

    def __float__(self):
        return float(to_host(self.value))

    def __index__(self):
        return int(to_host(self.value).__index__())

    def __complex__(self):
        return complex(to_host(self.value))

    __hash__ = None  # arrays are mutable-looking values: unhashable, as in numpy and JAX

    def __repr__(self):
        if self._deleted:
            return "Array(<deleted>)"
        body = np.array2string(to_host(self._value), separator=", ", prefix="Array(")
        extra = ", weak_type=True" if self.aval.weak_type else ""
        return f"Array({body}, dtype={self.dtype}{extra})"

    def __str__(self):
        return str(to_host(self.value))

    def __format__(self, spec):
        return format(to_host(self.value) if self.shape else self.item(), spec)
