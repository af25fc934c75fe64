"""Abstract values: what the compiler knows of an array without its data."""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core import dtypes


class ManualAxisType:
    """A value's relation to the manual mesh axes of a ``shard_map`` body
    (``jax.typeof(x).mat``): the axes it varies along (``varying``), those along which
    each device holds a summand of it (``unreduced``), and those along which it is the
    same everywhere but its cotangent is left unreduced (``reduced``)."""

    __slots__ = ("varying", "unreduced", "reduced")

    def __init__(self, varying=frozenset(), unreduced=frozenset(), reduced=frozenset()):
        self.varying = frozenset(varying)
        self.unreduced = frozenset(unreduced)
        self.reduced = frozenset(reduced)

    def invarying(self, mesh) -> frozenset:
        """The manual axes of ``mesh`` the value does not vary along."""
        return frozenset(getattr(mesh, "manual_axes", ())) - self.varying

    @property
    def vur(self) -> frozenset:
        return self.varying

    def __repr__(self):
        parts = [f"varying={set(self.varying) or '{}'}"]
        parts += [f"{k}={set(getattr(self, k))}" for k in ("unreduced", "reduced")
                  if getattr(self, k)]
        return f"ManualAxisType({', '.join(parts)})"


class ShapedArray:
    """An array's type: shape, dtype, weak typing and its manual-axes type.

    ``vma`` is the frozenset of mesh axes along which the value may differ between
    devices inside a ``shard_map`` body (JEP 17111); it is empty outside.  Two finer
    kinds of manual-axes type (JAX's ``P(unreduced=...)``/``P(reduced=...)``):
    ``unreduced``, a subset of ``vma``, the axes along which each device holds a
    summand of the value (its blocks differ, so it counts as varying wherever only
    the data matters); ``reduced``, disjoint from ``vma``, the axes along which the
    value is the same everywhere but its cotangent stays unreduced (no psum).

    >>> ShapedArray((4, 8), np.float32)
    f32[4,8]
    """

    __slots__ = ("shape", "dtype", "weak_type", "vma", "unreduced", "reduced", "_hash")

    def __init__(self, shape, dtype, weak_type: bool = False, vma=frozenset(),
                 unreduced=frozenset(), reduced=frozenset()):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = bool(weak_type)
        self.vma = frozenset(vma)
        self.unreduced = frozenset(unreduced)
        self.reduced = frozenset(reduced)
        self._hash = hash((self.shape, self.dtype, self.weak_type, self.vma, self.unreduced,
                           self.reduced))

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    # JAX's newer name for the manual-axes type.
    mat = property(lambda self: ManualAxisType(self.vma - self.unreduced, self.unreduced,
                                               self.reduced))

    def update(self, shape=None, dtype=None, weak_type=None, vma=None, unreduced=None,
               reduced=None) -> "ShapedArray":
        """A copy with the given fields changed.  A new ``vma`` without ``unreduced``
        keeps only the unreduced axes it still contains (the rest vary no more)."""
        vma = self.vma if vma is None else frozenset(vma)
        if unreduced is None:
            unreduced = self.unreduced & vma
        if reduced is None:
            reduced = self.reduced - vma
        return ShapedArray(self.shape if shape is None else shape,
                           self.dtype if dtype is None else dtype,
                           self.weak_type if weak_type is None else weak_type,
                           vma, unreduced, reduced)

    def __eq__(self, other):
        return (isinstance(other, ShapedArray) and self.shape == other.shape
                and self.dtype == other.dtype and self.weak_type == other.weak_type
                and self.vma == other.vma and self.unreduced == other.unreduced
                and self.reduced == other.reduced)

    def __hash__(self):
        return self._hash

    def str_short(self) -> str:
        s = f"{dtypes.SHORT_NAMES.get(self.dtype, str(self.dtype))}[{','.join(map(str, self.shape))}]"
        varying = self.vma - self.unreduced
        if varying:
            s += "{" + ",".join(sorted(varying)) + "}"
        if self.unreduced:
            s += "{U:" + ",".join(sorted(self.unreduced)) + "}"
        if self.reduced:
            s += "{R:" + ",".join(sorted(self.reduced)) + "}"
        return s

    def __repr__(self):
        return self.str_short()

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def tangent_aval(aval: ShapedArray) -> ShapedArray:
    """The aval of a tangent/cotangent of a value of type ``aval``."""
    if dtypes.is_inexact(aval.dtype):
        return aval.update(weak_type=False)
    return aval.update(dtype=dtypes.float0, weak_type=False)


class ShapeDtypeStruct:
    """An abstract array argument: a shape and a dtype, no data (``jax.ShapeDtypeStruct``).

    Accepted by ``eval_shape``, ``jit(f).lower`` / ``.trace`` and ``linear_transpose``
    wherever an array is, to trace without computing.

    >>> ShapeDtypeStruct((2, 3), np.float32)
    ShapeDtypeStruct(shape=(2, 3), dtype=float32)
    """

    __slots__ = ("shape", "dtype", "sharding", "weak_type")

    def __init__(self, shape, dtype, *, sharding=None, weak_type: bool = False):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.sharding = sharding
        self.weak_type = bool(weak_type)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))

    def to_aval(self) -> ShapedArray:
        return ShapedArray(self.shape, dtypes.canonicalize(self.dtype), self.weak_type)

    @classmethod
    def like(cls, x) -> "ShapeDtypeStruct":
        """The shape, dtype, weak type and (for an Array) sharding of ``x``
        (``jax.ShapeDtypeStruct.like``).

        >>> ShapeDtypeStruct.like(np.ones((2, 3), np.float32))
        ShapeDtypeStruct(shape=(2, 3), dtype=float32)
        """
        aval = getattr(x, "aval", None)
        if aval is None:  # a numpy value or a Python scalar
            weak = isinstance(x, (bool, int, float, complex))
            aval = ShapedArray(np.shape(x), dtypes.python_scalar_dtype(x) if weak
                               else dtypes.canonicalize(np.result_type(x)), weak)
        # An Array's sharding (a traced value has none: it has no shards).
        sharding = getattr(x, "sharding", None) if hasattr(x, "addressable_shards") else None
        return cls(aval.shape, aval.dtype, sharding=sharding, weak_type=aval.weak_type)

    def update(self, *, shape=None, dtype=None, sharding=None,
               weak_type=None) -> "ShapeDtypeStruct":
        """A copy with the given fields changed (``jax.ShapeDtypeStruct.update``).

        >>> ShapeDtypeStruct((2, 3), np.float32).update(shape=(4, 3)).shape
        (4, 3)
        """
        return ShapeDtypeStruct(self.shape if shape is None else shape,
                                self.dtype if dtype is None else dtype,
                                sharding=self.sharding if sharding is None else sharding,
                                weak_type=self.weak_type if weak_type is None else weak_type)

    def __eq__(self, other):
        return (isinstance(other, ShapeDtypeStruct) and self.shape == other.shape
                and self.dtype == other.dtype and self.weak_type == other.weak_type
                and self.sharding == other.sharding)

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type))

    def __repr__(self):
        weak = ", weak_type=True" if self.weak_type else ""
        sh = f", sharding={self.sharding}" if self.sharding is not None else ""
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name}{weak}{sh})"


def abstract_arg_aval(x):
    """The aval of an abstract argument (``ShapeDtypeStruct`` or ``ShapedArray``), or
    None for anything else."""
    t = type(x)
    if t is ShapeDtypeStruct:
        return x.to_aval()
    if t is ShapedArray:
        return x.update(vma=frozenset(), reduced=frozenset()) if x.vma or x.reduced else x
    return None
