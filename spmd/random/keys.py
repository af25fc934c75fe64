"""PRNG keys: typed keys (JEP 9263), legacy ``uint32[2]`` keys, and their derivation.

A typed key (:class:`PRNGKeyArray`) is an array of key elements: ``key(0).shape``
is ``()``; its data is a ``uint32[..., 2]`` array (``key_data``).  A legacy key is
that data itself (``PRNGKey(0)``, ``uint32[2]``).  Every function accepts both
and returns the kind it was given.  Keys are pytrees whose one leaf is the data,
so they pass through ``jit``, ``vmap`` (over their leading axes), ``grad``,
``scan`` and ``shard_map`` like arrays.
"""

from __future__ import annotations

import operator

import numpy as np

import spmd.numpy as snp
from spmd.compiler.core import dtypes
from spmd.compiler.core.array import Array
from spmd.compiler.ops import elementwise as ew
from spmd.compiler.ops import threefry as tf
from spmd.compiler.core.trace import Tracer, get_aval
from spmd.errors import ArgumentError, DTypeError, ShapeError
from spmd.tree_util import register_pytree_node

IMPL = "threefry2x32"


class KeyDType:
    """The dtype of typed keys (``key<fry>``): not a numeric dtype."""

    name = "key<fry>"

    def __repr__(self):
        return self.name

    __str__ = __repr__

    def __eq__(self, other):
        return isinstance(other, KeyDType)

    def __hash__(self):
        return hash(self.name)


key_dtype = KeyDType()

_ARITH_HINT = ("typed PRNG keys are not numbers: {op} is not defined on dtype key<fry>. "
               "Derive new keys with spmd.random.split / fold_in, or take the raw "
               "uint32 words with spmd.random.key_data(key)")


def _no_arith(op):
    def method(self, *args, **kwargs):
        raise DTypeError(_ARITH_HINT.format(op=op))

    method.__name__ = op
    return method


class PRNGKeyArray:
    """An array of typed PRNG keys; ``shape`` excludes the key's two data words.

    >>> k = key(0)
    >>> k.shape, k.dtype
    ((), key<fry>)
    """

    __slots__ = ("_base",)
    __array_priority__ = 100

    def __init__(self, base):
        self._base = base

    shape = property(lambda self: tuple(np.shape(self._base))[:-1])
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    dtype = property(lambda self: key_dtype)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of an unsized key array (shape ())")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        if any(i is Ellipsis for i in idx):
            raise ArgumentError("indexing a key array with ...: index its leading axes "
                                "explicitly")
        if len(idx) > self.ndim:
            raise IndexError(f"too many indices for a key array of shape {self.shape}")
        return PRNGKeyArray(self._base[idx])

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return PRNGKeyArray(snp.reshape(self._base, tuple(shape) + (2,)))

    def __array__(self, dtype=None, copy=None):
        raise DTypeError("a typed PRNG key array cannot be converted to a numpy array; use "
                         "spmd.random.key_data(key) for its uint32 words")

    def __repr__(self):
        return f"PRNGKeyArray({self.shape}, dtype=key<fry>) overlaying:\n{self._base!r}"

    def __bool__(self):
        raise DTypeError(_ARITH_HINT.format(op="bool()"))

    def __eq__(self, other):  # keys compare by their data, never as numbers
        raise DTypeError(_ARITH_HINT.format(op="==") + "; compare key_data(a) == key_data(b)")

    def __ne__(self, other):
        raise DTypeError(_ARITH_HINT.format(op="!=") + "; compare key_data(a) != key_data(b)")

    __hash__ = None


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor",
            "lshift", "rshift", "lt", "le", "gt", "ge", "matmul"):
    setattr(PRNGKeyArray, f"__{_op}__", _no_arith(f"__{_op}__"))
    setattr(PRNGKeyArray, f"__r{_op}__", _no_arith(f"__r{_op}__"))
for _op in ("neg", "pos", "abs", "invert", "int", "float", "index"):
    setattr(PRNGKeyArray, f"__{_op}__", _no_arith(f"__{_op}__"))

register_pytree_node(PRNGKeyArray, lambda k: ((k._base,), None),
                     lambda _, children: PRNGKeyArray(children[0]))


# ------------------------------------------------------------ checking keys

def _check_key(name: str, key, single: bool = False):
    """``(data uint32[..., 2], typed)``; raises on anything that is not a key."""
    if isinstance(key, PRNGKeyArray):
        base, typed = key._base, True
    else:
        if isinstance(key, (int, float)) or key is None:
            raise DTypeError(f"{name}: key={key!r} is not a PRNG key; make one with "
                             "spmd.random.key(seed) (or the legacy PRNGKey(seed))")
        try:
            av = get_aval(key)
        except DTypeError:
            raise DTypeError(f"{name}: key of type {type(key).__name__} is not a PRNG key; "
                             "make one with spmd.random.key(seed)") from None
        if av.dtype != np.uint32 or not av.shape or av.shape[-1] != 2:
            raise DTypeError(
                f"{name}: a legacy key must be uint32[..., 2], got {av.dtype}{list(av.shape)}; "
                "make keys with spmd.random.key(seed), or wrap raw words with "
                "spmd.random.wrap_key_data(data)")
        base, typed = key, False
    shape = tuple(np.shape(base))[:-1]
    if single and shape:
        raise ShapeError(f"{name} accepts a single key, but was given a key array of shape "
                         f"{shape} != (); use spmd.vmap for batches of keys")
    return base, typed


def _wrap(base, typed):
    return PRNGKeyArray(base) if typed else base


def _u32(x):
    return x if get_aval(x).dtype == np.uint32 else ew.convert(x, np.uint32)


# ------------------------------------------------------------- constructors

def _seed_words(seed, name):
    """``(hi, lo)`` uint32 words of an integer seed (JAX's threefry_seed)."""
    if isinstance(seed, PRNGKeyArray):
        raise DTypeError(f"{name}: seed is already a typed key; pass an integer seed")
    if isinstance(seed, (bool, np.bool_)):
        seed = int(seed)
    if isinstance(seed, (int, np.integer)):
        s = int(seed)
        if not -2**63 <= s < 2**63:
            raise OverflowError(f"{name}: seed={s} does not fit in 64 bits; use a seed in "
                                "[-2**63, 2**63)")
        if not dtypes.x64_enabled():  # as JAX: the seed is first an int32
            return 0, s & 0xFFFFFFFF
        return (s >> 32) & 0xFFFFFFFF, s & 0xFFFFFFFF
    if isinstance(seed, float) or not hasattr(seed, "shape") and not isinstance(
            seed, (Tracer, Array)):
        raise DTypeError(f"{name}: seed={seed!r} must be an integer; use e.g. "
                         f"{name}(int(seed))")
    av = get_aval(seed)
    if av.dtype == np.uint32 and av.shape and av.shape[-1] == 2:
        raise DTypeError(f"{name}: the seed is a uint32{list(av.shape)} array, a legacy key, "
                         "not an integer seed; make it a typed key with "
                         "spmd.random.wrap_key_data(k) (and back with key_data)")
    if av.shape:
        raise ShapeError(f"{name} accepts a scalar seed, but was given an array of shape "
                         f"{av.shape}; use spmd.vmap for batches of seeds")
    if not dtypes.is_int(av.dtype) and not dtypes.is_bool(av.dtype):
        raise DTypeError(f"{name}: the seed must be an integer, got dtype {av.dtype}; "
                         "convert it with .astype(np.int32)")
    if isinstance(seed, (np.ndarray, np.generic)):
        return _seed_words(int(seed), name)
    if av.dtype.itemsize == 8:
        # The low word of seed >> 32: an arithmetic and a logical shift agree there.
        return _u32(snp.floor_divide(seed, 2**32)), _u32(seed)
    return np.uint32(0), _u32(seed)


def _make_base(hi, lo):
    if isinstance(hi, int) and isinstance(lo, int):
        return snp.asarray(np.array([hi, lo], np.uint32))
    return snp.stack([_u32(hi), _u32(lo)])


def key(seed, *, impl: str | None = None) -> PRNGKeyArray:
    """A typed PRNG key (shape ``()``, dtype ``key<fry>``) from an integer seed.

    >>> k = key(42)
    >>> key_data(k)
    Array([ 0, 42], dtype=uint32)
    """
    _check_impl(impl)
    return PRNGKeyArray(_make_base(*_seed_words(seed, "spmd.random.key")))


def PRNGKey(seed, *, impl: str | None = None):
    """A legacy key: the ``uint32[2]`` words of ``key(seed)``.

    >>> PRNGKey(42)
    Array([ 0, 42], dtype=uint32)
    """
    _check_impl(impl)
    return _make_base(*_seed_words(seed, "spmd.random.PRNGKey"))


def _check_impl(impl):
    if impl not in (None, IMPL):
        raise ArgumentError(f"impl={impl!r}: spmd.random implements only "
                            f"{IMPL!r} (JAX's default); pass impl=None")


def key_data(keys):
    """The ``uint32[..., 2]`` words of typed keys (legacy keys are returned unchanged)."""
    base, _ = _check_key("spmd.random.key_data", keys)
    return base


def wrap_key_data(key_bits_array, *, impl: str | None = None) -> PRNGKeyArray:
    """Typed keys from ``uint32[..., 2]`` words (the inverse of ``key_data``)."""
    _check_impl(impl)
    if isinstance(key_bits_array, PRNGKeyArray):
        raise DTypeError("spmd.random.wrap_key_data: the argument is already a typed key; "
                         "pass its words, spmd.random.key_data(key)")
    base, _ = _check_key("spmd.random.wrap_key_data", key_bits_array)
    return PRNGKeyArray(base)


def key_impl(keys) -> str:
    """The name of the keys' PRNG implementation (always ``'threefry2x32'``)."""
    _check_key("spmd.random.key_impl", keys)
    return IMPL


def clone(key):
    """The same key (keys are immutable values here; JAX needs it for reused buffers)."""
    _check_key("spmd.random.clone", key)
    return key


# --------------------------------------------------------------- derivation

def _split_shape(num, name):
    if isinstance(num, (tuple, list)):
        shape = tuple(num)
    else:
        shape = (num,)
    for s in shape:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ArgumentError(f"{name}: num={num!r} must be a non-negative int or a tuple "
                                "of them (the number or shape of new keys)")
    return tuple(int(s) for s in shape)


def split(key, num: int | tuple = 2):
    """``num`` new keys (or an array of them of shape ``num``) derived from ``key``.

    >>> k1, k2 = split(key(0))
    """
    base, typed = _check_key("spmd.random.split", key, single=True)
    shape = _split_shape(num, "spmd.random.split")
    return _wrap(tf.random_bits(base, shape, split=True), typed)


def fold_in(key, data):
    """A new key from ``key`` and an integer ``data`` (e.g. a step or ``axis_index``).

    >>> k = fold_in(key(0), 3)
    """
    base, typed = _check_key("spmd.random.fold_in", key, single=True)
    if isinstance(data, (bool, np.bool_, float)) or isinstance(data, PRNGKeyArray):
        raise DTypeError(f"spmd.random.fold_in: data={data!r} must be an integer")
    if isinstance(data, (int, np.integer)):
        d = int(data)
        if not 0 <= d < 2**32:
            d &= 0xFFFFFFFF if -2**31 <= d < 0 else _range_error(d)
        word = np.uint32(d)
    else:
        av = get_aval(data)
        if av.shape or not dtypes.is_int(av.dtype):
            raise DTypeError(f"spmd.random.fold_in: data must be an integer scalar, got {av}")
        word = _u32(data)
    k0, k1 = (operator.getitem(base, 0), operator.getitem(base, 1))
    y0, y1 = tf.threefry2x32(_u32(k0), _u32(k1), np.uint32(0), word)
    return _wrap(snp.stack([y0, y1]), typed)


def _range_error(d):
    raise OverflowError(f"spmd.random.fold_in: data={d} does not fit in 32 bits; fold in "
                        "values in [-2**31, 2**32)")


def bits(key, shape=(), dtype=None):
    """Uniform random bits of an unsigned ``dtype`` (default uint32).

    >>> bits(key(42), (2,))
    Array([2098992034, 2919706841], dtype=uint32)
    """
    from spmd.random.samplers import _shape  # here: spmd.random.samplers imports this module

    base, _ = _check_key("spmd.random.bits", key, single=True)
    dtype = np.dtype(np.uint32 if dtype is None else dtype)
    if dtype.kind != "u":
        raise DTypeError(f"spmd.random.bits: dtype={dtype} must be an unsigned integer dtype "
                         "(uint8, uint16, uint32, uint64 with x64)")
    dtype = dtypes.canonicalize(dtype)
    return tf.random_bits(base, _shape(shape, "bits"), bit_width=dtype.itemsize * 8)
