"""``out += a @ b`` in place, as one BLAS call: numpy's OpenBLAS's ``cblas_?gemm`` with
``beta = 1``, which adds each block of the product into ``out`` as it makes it
(``np.matmul`` has no ``beta``).  The generated code calls :func:`gemm_into` where
:mod:`spmd.compiler.passes.accumulate` finds a product summed into a buffer it owns.  Through
numpy's own OpenBLAS, so its thread count and holds (:mod:`spmd.compiler.engine.threads`)
apply.  Where numpy's BLAS is not OpenBLAS, or for other dtypes, a numpy product is
added instead: the same sum, rounded as written.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from spmd.compiler.engine.threads import numpy_openblas

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
# The dtypes with a CBLAS product: its name and scalar type.
GEMM_DTYPES = {np.dtype(np.float32): ("sgemm", ctypes.c_float),
               np.dtype(np.float64): ("dgemm", ctypes.c_double)}


@functools.lru_cache(maxsize=None)
def _cblas(dtype: np.dtype):
    """numpy's OpenBLAS ``cblas_?gemm`` for ``dtype``, argument types set; None where
    there is none (another BLAS, another dtype)."""
    if dtype not in GEMM_DTYPES:
        return None
    lib = numpy_openblas()
    if lib is None:
        return None
    name, scalar = GEMM_DTYPES[dtype]
    # numpy's wheels: 64-bit integers, symbols suffixed (scipy_openblas64_).
    for symbol, integer in ((f"scipy_cblas_{name}64_", ctypes.c_int64),
                            (f"cblas_{name}64_", ctypes.c_int64)):
        fn = getattr(lib, symbol, None)
        if fn is not None:
            i, p = integer, ctypes.c_void_p
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i, i, i, scalar, p, i,
                           p, i, scalar, p, i]
            fn.restype = None
            return fn
    return None


def _matrix(x):
    """``(x, trans, ld)``: ``x`` as CBLAS reads a row-major matrix, itself (no
    transpose) or its transpose's rows; copied first where neither reads it."""
    (r, c), (s0, s1), item = x.shape, x.strides, x.itemsize
    if s1 == item and s0 % item == 0 and s0 >= c * item and s0 > 0:
        return x, _NO_TRANS, s0 // item
    if s0 == item and s1 % item == 0 and s1 >= r * item and s1 > 0:
        return x, _TRANS, s1 // item
    x = np.ascontiguousarray(x)
    return x, _NO_TRANS, max(c, 1)


def gemm_into(a, b, out):
    """``out += a @ b`` in place, returning ``out``: matrices, or stacks of one
    (``(1, m, k) @ (1, k, n)`` or ``(1, m, k) @ (k, n)``: a process's one device).

    >>> acc = np.zeros((2, 2), np.float32)
    >>> gemm_into(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32), acc)
    array([[3., 3.],
           [3., 3.]], dtype=float32)
    """
    o = out[0] if out.ndim == 3 else out
    a2 = a[0] if a.ndim == 3 else a
    b2 = b[0] if b.ndim == 3 else b
    fn = _cblas(o.dtype) if a2.dtype == b2.dtype == o.dtype else None
    (m, k), n = a2.shape, b2.shape[1]
    item = o.itemsize
    if fn is None or not (o.strides[1] == item and o.strides[0] >= n * item) \
            or min(m, n, k) == 0:
        if min(m, n) > 0:
            np.add(o, np.matmul(a2, b2), out=o)
        return out
    a2, ta, lda = _matrix(a2)
    b2, tb, ldb = _matrix(b2)
    fn(_ROW_MAJOR, ta, tb, m, n, k, 1.0, a2.ctypes.data, lda, b2.ctypes.data, ldb, 1.0,
       o.ctypes.data, o.strides[0] // item)
    return out
