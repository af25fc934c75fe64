"""Dtypes: which are supported, 32-bit canonicalisation, and type promotion.

The rules follow JAX (JEP 9407): a lattice ``bool < int < float < complex`` in which Python
scalars are *weak* (they adopt the dtype of the array they meet), and 64-bit
types are narrowed to 32 bits unless ``enable_x64`` is on.
"""

from __future__ import annotations

import numpy as np

from spmd.config import config
from spmd.errors import DTypeError

bool_ = np.dtype(np.bool_)
int8, int16, int32, int64 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
uint8, uint16, uint32, uint64 = (np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
float16, float32, float64 = (np.dtype(t) for t in (np.float16, np.float32, np.float64))
complex64, complex128 = np.dtype(np.complex64), np.dtype(np.complex128)

SUPPORTED = frozenset([bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64,
                       float16, float32, float64, complex64, complex128])

try:  # the narrow floats come with ml_dtypes (a dependency; optional here all the same)
    import ml_dtypes

    bfloat16 = np.dtype(ml_dtypes.bfloat16)
    float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
    float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
except ImportError:  # pragma: no cover - depends on the environment
    bfloat16 = float8_e4m3fn = float8_e5m2 = None

# The 8-bit floats: no implicit promotion with other floats (JAX's rule).
FLOAT8 = frozenset(d for d in (float8_e4m3fn, float8_e5m2) if d is not None)
# Floats narrower than the machine computes in: every op computes in float32 and rounds
# its result to the narrow type (XLA's CPU does the same; docs/jax_differences.md).
NARROW_FLOATS = FLOAT8 | frozenset(d for d in (bfloat16,) if d is not None)
SUPPORTED = SUPPORTED | NARROW_FLOATS

_NARROW = {int64: int32, uint64: uint32, float64: float32, complex128: complex64}

# float0 is the dtype of cotangents of integer inputs (as in JAX): no data.
float0 = np.dtype([("float0", np.void, 0)])


def _short_names() -> dict:
    names = {bool_: "bool", float16: "f16", float32: "f32", float64: "f64",
             complex64: "c64", complex128: "c128"}
    for d in (int8, int16, int32, int64):
        names[d] = f"i{d.itemsize * 8}"
    for d in (uint8, uint16, uint32, uint64):
        names[d] = f"u{d.itemsize * 8}"
    if bfloat16 is not None:
        names[bfloat16] = "bf16"
    for d in FLOAT8:  # JAX's short names: f8_e4m3fn, f8_e5m2
        names[d] = d.name.replace("float", "f")
    names[float0] = "float0"
    return names


SHORT_NAMES = _short_names()


def x64_enabled() -> bool:
    return bool(config.enable_x64)


def default_int() -> np.dtype:
    return int64 if x64_enabled() else int32


def default_float() -> np.dtype:
    return float64 if x64_enabled() else float32


def default_complex() -> np.dtype:
    return complex128 if x64_enabled() else complex64


def is_float(dtype) -> bool:
    """Real floating point (not complex): ``is_float('f32')`` is True."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype in NARROW_FLOATS


def is_narrow_float(dtype) -> bool:
    """bfloat16 or an 8-bit float: computed in float32, each result rounded back.

    >>> is_narrow_float(bfloat16), is_narrow_float(np.float16)
    (True, False)
    """
    return np.dtype(dtype) in NARROW_FLOATS


def issubdtype(a, b) -> bool:
    """``numpy.issubdtype``, with the narrow floats under ``np.floating`` as in JAX
    (numpy puts ml_dtypes' types right under ``np.generic``, so
    ``np.issubdtype(bfloat16, np.floating)`` is False).

    >>> issubdtype(bfloat16, np.floating), issubdtype(bfloat16, np.integer)
    (True, False)
    """
    try:
        d = np.dtype(a)
    except TypeError:
        d = None
    if d in NARROW_FLOATS and b in (np.floating, np.inexact, np.number):
        return True
    return bool(np.issubdtype(a, b))


def compute_dtype(dtype) -> np.dtype:
    """The dtype an op computes in: float32 for the narrow floats, else ``dtype``.

    >>> compute_dtype(bfloat16), compute_dtype(np.int8)
    (dtype('float32'), dtype('int8'))
    """
    d = np.dtype(dtype)
    return float32 if d in NARROW_FLOATS else d


def finfo(dtype):
    """Machine limits of a float dtype, the narrow floats too (numpy's ``finfo`` does
    not know them; ml_dtypes' does): ``finfo(bfloat16).eps`` is 2**-7."""
    d = np.dtype(dtype)
    if d in NARROW_FLOATS:
        return ml_dtypes.finfo(d)
    return np.finfo(d)


def is_complex(dtype) -> bool:
    return np.dtype(dtype).kind == "c"


def is_inexact(dtype) -> bool:
    """Float or complex: the dtypes that carry tangents (``is_inexact('c64')`` is True)."""
    return is_float(dtype) or is_complex(dtype)


def real_dtype(dtype) -> np.dtype:
    """The dtype of the real and imaginary parts: ``real_dtype('c64')`` is f32."""
    d = np.dtype(dtype)
    return {complex64: float32, complex128: float64}.get(d, d)


def complex_dtype(dtype) -> np.dtype:
    """The complex dtype with parts of ``dtype``'s width (f64 -> c128, else c64)."""
    d = np.dtype(dtype)
    if is_complex(d):
        return d
    return complex128 if d == float64 or (is_int(d) and x64_enabled()) else complex64


def is_int(dtype) -> bool:
    return np.dtype(dtype).kind in "iu"


def is_bool(dtype) -> bool:
    return np.dtype(dtype) == bool_


def check_dtype(dtype, where: str = "") -> np.dtype:
    """Return ``dtype`` as a supported ``np.dtype`` or raise :class:`DTypeError`."""
    try:
        d = np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"{where or 'spmd'}: {dtype!r} is not a dtype ({e})") from None
    if d not in SUPPORTED and d != float0:
        supported = ", ".join(sorted(SHORT_NAMES[t] for t in SUPPORTED))
        raise DTypeError(
            f"{where or 'spmd'}: unsupported dtype {d} (supported: {supported}); "
            "convert the value first, e.g. x.astype(np.float32)")
    return d


def canonicalize(dtype, where: str = "") -> np.dtype:
    """Narrow 64-bit dtypes to 32 bits unless x64 mode is on."""
    d = check_dtype(dtype, where)
    if not x64_enabled():
        return _NARROW.get(d, d)
    return d


def python_scalar_dtype(x) -> np.dtype:
    """The (weak) dtype a Python scalar takes."""
    if isinstance(x, (bool, np.bool_)):
        return bool_
    if isinstance(x, int):
        return default_int()
    if isinstance(x, float):
        return default_float()
    if isinstance(x, complex):
        return default_complex()
    raise DTypeError(f"spmd: {type(x).__name__} is not a Python scalar")


# Kinds on the promotion lattice, in order: a higher kind wins.
def _kind_rank(dtype) -> int:
    if is_bool(dtype):
        return 0
    if is_int(dtype):
        return 1
    return 3 if is_complex(dtype) else 2


def _promote_strong(a: np.dtype, b: np.dtype) -> np.dtype:
    if a == b:
        return a
    ra, rb = _kind_rank(a), _kind_rank(b)
    if a in FLOAT8 or b in FLOAT8:
        return _promote_float8(a, b, ra, rb)
    if ra != rb:  # int with float gives the float (JAX's lattice), bool gives the other
        hi, lo = (a, b) if ra > rb else (b, a)
        if is_complex(hi) and is_float(lo):  # f64 with c64 gives c128, as in numpy and JAX
            return complex_dtype(np.promote_types(real_dtype(hi), _no_bf16(lo)))
        return hi
    if ra == 3:
        return a if a.itemsize >= b.itemsize else b
    if ra == 2:
        if bfloat16 is not None and bfloat16 in (a, b):
            other = b if a == bfloat16 else a
            return float32 if other == float16 else other
        return a if a.itemsize >= b.itemsize else b
    return np.promote_types(a, b)


def _promote_float8(a: np.dtype, b: np.dtype, ra: int, rb: int) -> np.dtype:
    """JAX's lattice: an 8-bit float sits right above the weak float and below nothing,
    so bools and integers promote to it and every other float or complex type has
    no common type with it."""
    if min(ra, rb) < 2:
        return a if ra > rb else b
    raise DTypeError(
        f"spmd: no implicit promotion between {a} and {b}: 8-bit floats do not promote "
        "with other floats (as in JAX); convert explicitly, e.g. x.astype(np.float32)")


def _no_bf16(d: np.dtype) -> np.dtype:
    return float32 if d == bfloat16 else d


def result_type(*typed) -> tuple:
    """Promote ``(dtype, weak)`` pairs; return ``(dtype, weak)`` of the result.

    >>> result_type((np.dtype('int32'), False), (np.dtype('float32'), True))
    (dtype('float32'), True)
    """
    strong = [d for d, w in typed if not w]
    weak = [d for d, w in typed if w]
    if strong:
        out = strong[0]
        for d in strong[1:]:
            out = _promote_strong(out, d)
        # A weak operand only matters when it is of a higher kind.
        top_weak = max((_kind_rank(d) for d in weak), default=-1)
        if top_weak > _kind_rank(out):
            if top_weak == 3 and out in FLOAT8:
                raise DTypeError(
                    f"spmd: no implicit promotion between {out} and a complex scalar (as in "
                    "JAX); convert explicitly, e.g. x.astype(np.complex64)")
            if top_weak == 3:  # a complex scalar meets a real array: f32 -> c64 (JAX)
                return canonicalize(complex_dtype(out) if is_float(out)
                                    else default_complex()), not is_float(out)
            return (default_float() if top_weak == 2 else default_int()), True
        return canonicalize(out), False
    out = weak[0]
    for d in weak[1:]:
        if _kind_rank(d) > _kind_rank(out):
            out = d
    return canonicalize(out), True
