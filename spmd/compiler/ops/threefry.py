"""Counter-based random numbers: the Threefry-2x32 hash and the primitives of ``spmd.random``.

- ``threefry2x32(k0, k1, x0, x1) -> (y0, y1)``: the 20-round Threefry-2x32
  block cipher of Salmon et al. (2011), elementwise on ``uint32`` words (equal
  shapes, or scalars that broadcast).  Key derivation (``fold_in``) uses it.
- ``random_bits(key, *offsets, shape, global_shape, bit_width, split)``: the
  random bits of JAX's *partitionable* layout: element ``i`` (row-major flat
  index in ``global_shape``) is ``threefry2x32(key, (hi(i), lo(i)))``, its two
  words xor-ed for 8/16/32-bit output, concatenated for 64 bits, or stacked
  into a new key for ``split``.  ``key`` is ``uint32[..., 2]``: leading
  dimensions are a batch of keys (``vmap`` over keys is one call).  ``shape`` is
  the block computed and ``offsets`` (one int scalar per dimension, or none)
  its position in ``global_shape``: the partitioner binds each device's block,
  so a sharded random array equals the unsharded one and no device computes
  another's numbers.
- ``random_unit_float(bits, dtype)``: ``bits`` (unsigned) to floats in [0, 1)
  with JAX's mantissa recipe: ``bitcast((bits >> (nbits - nmant)) | 1.0) - 1``.

``normal`` maps uniforms through ``lax.erf_inv`` (:mod:`spmd.compiler.ops.special`),
whose float32 evaluation is XLA's.  All outputs here are integers or piecewise
constant in their integer inputs, so the jvps are symbolic zeros.
"""

from __future__ import annotations

import math

import numpy as np

from spmd.compiler.core import dtypes
from spmd.compiler.transforms.ad_util import Zero
from spmd.compiler.core.avals import ShapedArray, tangent_aval
from spmd.compiler.ops import threefry_native
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind, get_aval
from spmd.errors import DTypeError, ShapeError
from spmd.compiler import ops
from spmd.compiler.transforms.batching import bdim_size, move_to_front

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
UINT_DTYPES = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32),
               64: np.dtype(np.uint64)}


def _is_host(xp) -> bool:
    return xp is np


# ------------------------------------------------------------------ the hash

def threefry_rounds(xp, k0, k1, x0, x1):
    """Threefry-2x32 on arrays of module ``xp`` (broadcasting): 20 rounds, the key
    injected every 4 rounds.  Returns ``(y0, y1)``, new arrays."""
    u32 = np.uint32
    k0 = xp.asarray(k0, dtype=u32)
    k1 = xp.asarray(k1, dtype=u32)
    ks = (k0, k1, k0 ^ k1 ^ u32(_PARITY))
    with np.errstate(over="ignore"):
        x0 = xp.add(xp.asarray(x0, dtype=u32), ks[0])
        x1 = xp.add(xp.asarray(x1, dtype=u32), ks[1])
        x0, x1 = xp.broadcast_arrays(x0, x1)
        x0, x1 = x0.copy(), x1.copy()
        for block in range(5):
            for r in _ROTATIONS[block % 2]:
                x0 += x1
                x1 = (x1 << u32(r)) | (x1 >> u32(32 - r))
                x1 ^= x0
            x0 += ks[(block + 1) % 3]
            x1 += ks[(block + 2) % 3] + u32(block + 1)
    return x0, x1


threefry2x32_p = Primitive("threefry2x32", traits=(), multiple_results=True)


@threefry2x32_p.def_impl
def _threefry_impl(xp, k0, k1, x0, x1):
    return list(threefry_rounds(xp, k0, k1, x0, x1))


@threefry2x32_p.def_abstract_eval
def _threefry_aval(k0, k1, x0, x1):
    for name, a in zip(("k0", "k1", "x0", "x1"), (k0, k1, x0, x1)):
        if a.dtype != np.uint32:
            raise DTypeError(f"threefry2x32: {name} has dtype {a.dtype}; all four operands "
                             "must be uint32 (convert with .astype(np.uint32))")
    shapes = {a.shape for a in (k0, k1, x0, x1) if a.shape != ()}
    if len(shapes) > 1:
        raise ShapeError(f"threefry2x32: operand shapes {sorted(shapes)} differ; give equal "
                         "shapes or scalars")
    shape = shapes.pop() if shapes else ()
    out = ShapedArray(shape, np.uint32)
    return [out, out]


def threefry2x32(k0, k1, x0, x1):
    """The Threefry-2x32 hash of counter words ``(x0, x1)`` under key ``(k0, k1)``.

    >>> y0, y1 = threefry2x32(np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))
    >>> hex(int(y0)), hex(int(y1))  # doctest: +SKIP
    ('0x6b200159', '0x99ba4efe')
    """
    return bind(threefry2x32_p, k0, k1, x0, x1)


def _zero_jvp(prim):
    def rule(primals, tangents, **params):
        outs = bind(prim, *primals, **params)
        many = outs if prim.multiple_results else [outs]
        zeros = [Zero(tangent_aval(get_aval(o))) for o in many]
        return outs, (zeros if prim.multiple_results else zeros[0])

    return rule


threefry2x32_p.def_jvp(_zero_jvp(threefry2x32_p))


@threefry2x32_p.def_batch
def _threefry_batch(args, dims):
    size = bdim_size(args, dims)
    shape = next((tuple(np.shape(a))[:d] + tuple(np.shape(a))[d + 1:] if d is not None
                  else tuple(np.shape(a)) for a, d in zip(args, dims)
                  if (np.ndim(a) - (d is not None)) > 0), ())
    full = (size,) + shape
    new = []
    for a, d in zip(args, dims):
        if d is None:
            nd = np.ndim(a)
            new.append(ops.structural.broadcast_in_dim(
                a, full, tuple(range(1 + len(shape) - nd, 1 + len(shape))) if nd else ()))
        else:
            a = move_to_front(a, d)
            if np.ndim(a) == 1 and shape:
                a = ops.structural.broadcast_in_dim(a, full, (0,))
            new.append(a)
    return bind(threefry2x32_p, *new), [0, 0]


# ------------------------------------------------------------- random bits

def _row_starts(shape, global_shape, offsets):
    """First global flat index (uint64) of each row (last dimension) of the block
    ``shape`` at ``offsets`` in the row-major ``global_shape``; and the row length."""
    nd = len(shape)
    if nd == 0:
        return np.zeros(1, np.uint64), 1
    strides = [math.prod(global_shape[d + 1:]) for d in range(nd)]
    start = np.zeros((1,) * max(nd - 1, 0), np.uint64) + np.uint64(
        int(offsets[-1]) if offsets else 0)
    for d in range(nd - 1):
        idx = np.arange(shape[d], dtype=np.uint64) + np.uint64(int(offsets[d]) if offsets else 0)
        view = [1] * (nd - 1)
        view[d] = shape[d]
        start = start + (idx * np.uint64(strides[d])).reshape(view)
    return start.reshape(-1), shape[-1]


def _counter_words(xp, shape, global_shape, offsets):
    starts, rowlen = _row_starts(shape, global_shape, offsets)
    n = (starts[:, None] + np.arange(rowlen, dtype=np.uint64)[None, :]).reshape(-1)
    hi, lo = (n >> np.uint64(32)).astype(np.uint32), n.astype(np.uint32)
    return (hi, lo) if _is_host(xp) else (xp.asarray(hi), xp.asarray(lo))


def _hash_block(xp, key, shape, global_shape, offsets, pair):
    """``(nkeys, size)`` words: ``y0 ^ y1``, or the pair ``(y0, y1)``."""
    keys = key.reshape(-1, 2)
    size = math.prod(shape)
    if _is_host(xp) and threefry_native.kernel() is not None and size:
        starts, rowlen = _row_starts(shape, global_shape, offsets)
        return threefry_native.rows(keys[:, 0], keys[:, 1], starts, rowlen, pair)
    hi, lo = _counter_words(xp, shape, global_shape, offsets)
    y0, y1 = threefry_rounds(xp, keys[:, :1], keys[:, 1:], hi[None, :], lo[None, :])
    y0 = y0.reshape(keys.shape[0], size)
    y1 = y1.reshape(keys.shape[0], size)
    return (y0, y1) if pair else y0 ^ y1


random_bits_p = Primitive("random_bits", traits=())


@random_bits_p.def_impl
def _random_bits_impl(xp, key, *offsets, shape, global_shape, bit_width, split):
    batch = tuple(key.shape[:-1])
    offs = [int(o) for o in offsets]
    if split:
        y0, y1 = _hash_block(xp, key, shape, global_shape, offs, True)
        return xp.stack([y0, y1], axis=-1).reshape(batch + tuple(shape) + (2,))
    if bit_width == 64:
        y0, y1 = _hash_block(xp, key, shape, global_shape, offs, True)
        out = (y0.astype(np.uint64) << np.uint64(32)) | y1.astype(np.uint64)
    else:
        out = _hash_block(xp, key, shape, global_shape, offs, False)
        if bit_width != 32:
            out = out.astype(UINT_DTYPES[bit_width])  # the low bits, as XLA's convert
    return out.reshape(batch + tuple(shape))


@random_bits_p.def_abstract_eval
def _random_bits_aval(key, *offsets, shape, global_shape, bit_width, split):
    if key.dtype != np.uint32 or not key.shape or key.shape[-1] != 2:
        raise DTypeError(f"random_bits: the key data must be uint32[..., 2], got {key}; pass "
                         "a key from spmd.random.key or spmd.random.PRNGKey")
    if offsets and len(offsets) != len(shape):
        raise ShapeError(f"random_bits: {len(offsets)} offsets for a block of rank "
                         f"{len(shape)}")
    for o in offsets:
        if o.shape != () or not dtypes.is_int(o.dtype):
            raise DTypeError(f"random_bits: offsets must be integer scalars, got {o}")
    batch = key.shape[:-1]
    if split:
        return ShapedArray(batch + tuple(shape) + (2,), np.uint32)
    if bit_width not in UINT_DTYPES:
        raise DTypeError(f"random_bits: bit_width={bit_width}; use 8, 16, 32 or 64")
    return ShapedArray(batch + tuple(shape), UINT_DTYPES[bit_width])


random_bits_p.def_jvp(_zero_jvp(random_bits_p))


@random_bits_p.def_batch
def _random_bits_batch(args, dims, **params):
    key, offsets = args[0], args[1:]
    if any(d is not None for d in dims[1:]):
        return _random_bits_per_block(args, dims, params), 0
    if dims[0] is None:
        return bind(random_bits_p, key, *offsets, **params), None
    return bind(random_bits_p, move_to_front(key, dims[0]), *offsets, **params), 0


def _random_bits_per_block(args, dims, params):
    """Batched block offsets (the devices of one process simulated together, each
    with its own block): one bind per batch entry, stacked."""
    def entry(x, d, b):
        if d is None:
            return x
        shape = tuple(np.shape(x))
        piece = ops.slicing.slice_in_dim(x, b, b + 1, axis=d)
        return ops.structural.reshape(piece, shape[:d] + shape[d + 1:])

    outs = []
    for b in range(bdim_size(args, dims)):
        out = bind(random_bits_p, *[entry(a, d, b) for a, d in zip(args, dims)], **params)
        outs.append(ops.structural.reshape(out, (1,) + tuple(np.shape(out))))
    return ops.slicing.concatenate(outs, 0)


def random_bits(key_data, shape, bit_width: int = 32, split: bool = False):
    """Random bits (``uint{bit_width}[*batch, *shape]``) of ``key_data`` (``uint32[*batch, 2]``)
    in JAX's partitionable Threefry layout; with ``split``, new keys ``uint32[*batch, *shape, 2]``.

    >>> random_bits(np.array([0, 42], np.uint32), (3,))  # doctest: +SKIP
    """
    shape = tuple(int(s) for s in shape)
    return bind(random_bits_p, key_data, shape=shape, global_shape=shape,
                bit_width=int(bit_width), split=bool(split))


# ----------------------------------------------------------- bits to floats

random_unit_float_p = Primitive("random_unit_float", traits=())


def _float_layout(dtype):
    """(bits drawn, unsigned dtype of the float's width, mantissa bits) as JAX's uniform."""
    info = np.finfo(dtype) if dtype != dtypes.bfloat16 else None
    nbits, nmant = (16, 7) if info is None else (info.bits, info.nmant)
    return (8 if nmant < 8 else nbits), UINT_DTYPES[nbits], nmant


@random_unit_float_p.def_impl
def _unit_float_impl(xp, bits, *, dtype):
    rng_bits, udt, nmant = _float_layout(dtype)
    bits = bits.astype(udt, copy=False)
    # Scalars, not 0-d numpy arrays: CuPy arrays meet numpy scalars only.
    one = udt.type(np.array(1.0, dtype).view(udt))
    f = ((bits >> udt.type(rng_bits - nmant)) | one).view(dtype)
    f -= np.dtype(dtype).type(1.0)
    return f


@random_unit_float_p.def_abstract_eval
def _unit_float_aval(bits, *, dtype):
    if not dtypes.is_float(dtype):
        raise DTypeError(f"random_unit_float: dtype {dtype} is not a float dtype")
    rng_bits, _, _ = _float_layout(dtype)
    if bits.dtype != UINT_DTYPES[rng_bits]:
        raise DTypeError(f"random_unit_float: {dtype} needs uint{rng_bits} bits, got {bits}")
    return ShapedArray(bits.shape, dtype)


random_unit_float_p.def_jvp(_zero_jvp(random_unit_float_p))
random_unit_float_p.def_batch(lambda args, dims, dtype: (
    bind(random_unit_float_p, args[0], dtype=dtype), dims[0]))


def random_unit_float(bits, dtype):
    """Floats in [0, 1) of ``dtype`` from unsigned ``bits`` (JAX's mantissa recipe)."""
    return bind(random_unit_float_p, bits, dtype=np.dtype(dtype))


def unit_float_bits(dtype) -> int:
    """How many random bits ``random_unit_float`` needs for ``dtype``."""
    return _float_layout(np.dtype(dtype))[0]


# --------------------------------------------------- a stateful counter read

# ``rng_counter[cell]``: the current count of a host-side counter ``cell`` (any
# object with ``take() -> int``, which returns the count and advances it), as a
# uint32 scalar.  Effectful: never folded, merged or removed, so a compiled
# program reads and advances the counter on every run (and once per iteration
# of a loop body): the state of spmd.random.stateful_rng under jit.
rng_counter_p = Primitive("rng_counter", traits=(), effectful=True)


@rng_counter_p.def_impl
def _rng_counter_impl(xp, *, cell):
    v = np.array(cell.take(), np.uint32)
    return v if _is_host(xp) else xp.asarray(v)


rng_counter_p.def_abstract_eval(lambda *, cell: ShapedArray((), np.uint32))
# checkpoint/remat saves its value instead of recomputing it (a second read would
# advance the counter again and give the backward pass other numbers).
rng_counter_p.rules.never_recompute = True
rng_counter_p.def_jvp(_zero_jvp(rng_counter_p))
# Under vmap the counter is read once for the whole batch (as an eager call would).
rng_counter_p.def_batch(lambda args, dims, *, cell: (bind(rng_counter_p, cell=cell), None))


def rng_counter(cell):
    """Read and advance ``cell`` (at run time when traced)."""
    return bind(rng_counter_p, cell=cell)
