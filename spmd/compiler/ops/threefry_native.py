"""A compiled Threefry-2x32 kernel for host (numpy) arrays, built on first use.

Threefry is 20 rounds of add/rotate/xor on ``uint32`` words: numpy runs each
round as several passes over memory, about 20x slower than numpy's own
generators.  This module compiles a small C kernel with the system C compiler
(``cc``) into a per-user cache directory, loads it with :mod:`ctypes`, and
falls back to the numpy rounds (same bits; the tests compare both) where no
compiler is available or ``SPMD_RANDOM_NATIVE=0``.

The kernel fills rows of consecutive 64-bit counters, which is what the
partitionable counter layout needs: a block of a row-major array is a set of
rows whose first counters are computed in numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading

import numpy as np

_SOURCE = r"""
#include <stdint.h>

static inline uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

#define R(r) x0 += x1; x1 = rotl(x1, r); x1 ^= x0;
#define INJECT(a, b, i) x0 += a; x1 += b + i;

/* Threefry-2x32, 20 rounds (Salmon et al. 2011), on counter (hi, lo) words. */
static inline void tf(uint32_t k0, uint32_t k1, uint32_t k2, uint32_t *p0, uint32_t *p1) {
    uint32_t x0 = *p0 + k0, x1 = *p1 + k1;
    R(13) R(15) R(26) R(6)  INJECT(k1, k2, 1)
    R(17) R(29) R(16) R(24) INJECT(k2, k0, 2)
    R(13) R(15) R(26) R(6)  INJECT(k0, k1, 3)
    R(17) R(29) R(16) R(24) INJECT(k1, k2, 4)
    R(13) R(15) R(26) R(6)  INJECT(k2, k0, 5)
    *p0 = x0; *p1 = x1;
}

/* For each key and each row, rowlen consecutive counters from row_start[row].
   mode 0: out0 = y0 ^ y1 (32-bit random bits); mode 1: out0 = y0, out1 = y1. */
void spmd_threefry_rows(const uint32_t *k0s, const uint32_t *k1s, int64_t nkeys,
                        const uint64_t *row_start, int64_t nrows, int64_t rowlen,
                        uint32_t *out0, uint32_t *out1, int mode) {
    for (int64_t k = 0; k < nkeys; k++) {
        uint32_t k0 = k0s[k], k1 = k1s[k], k2 = k0 ^ k1 ^ 0x1BD11BDAu;
        for (int64_t r = 0; r < nrows; r++) {
            uint64_t c = row_start[r];
            int64_t base = (k * nrows + r) * rowlen;
            uint32_t *o0 = out0 + base;
            if (mode == 0) {
                for (int64_t j = 0; j < rowlen; j++) {
                    uint64_t n = c + (uint64_t)j;
                    uint32_t a = (uint32_t)(n >> 32), b = (uint32_t)n;
                    tf(k0, k1, k2, &a, &b);
                    o0[j] = a ^ b;
                }
            } else {
                uint32_t *o1 = out1 + base;
                for (int64_t j = 0; j < rowlen; j++) {
                    uint64_t n = c + (uint64_t)j;
                    uint32_t a = (uint32_t)(n >> 32), b = (uint32_t)n;
                    tf(k0, k1, k2, &a, &b);
                    o0[j] = a; o1[j] = b;
                }
            }
        }
    }
}
"""

_ERF_INV_SOURCE = r"""
#include <math.h>

/* Giles (2010) single-precision erfinv, the polynomial XLA uses for float32, given
   w = -log1p(-x*x) (computed by numpy's vectorised log1p).  Both branches are
   evaluated and one selected, so that the loop vectorises; the operations are
   those of the numpy version, in its order (no fused multiply-add). */
void spmd_erf_inv_f32(const float *x, const float *w, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], wi = w[i];
        float c = wi - 2.5f;
        float p = 2.81022636e-08f;
        p = p * c + 3.43273939e-07f; p = p * c + -3.5233877e-06f;
        p = p * c + -4.39150654e-06f; p = p * c + 0.00021858087f;
        p = p * c + -0.00125372503f; p = p * c + -0.00417768164f;
        p = p * c + 0.246640727f; p = p * c + 1.50140941f;
        float t = sqrtf(wi) - 3.0f;
        float q = -0.000200214257f;
        q = q * t + 0.000100950558f; q = q * t + 0.00134934322f;
        q = q * t + -0.00367342844f; q = q * t + 0.00573950773f;
        q = q * t + -0.0076224613f; q = q * t + 0.00943887047f;
        q = q * t + 1.00167406f; q = q * t + 2.83297682f;
        float r = (wi < 5.0f ? p : q) * v;
        out[i] = (fabsf(v) == 1.0f) ? v * INFINITY : r;
    }
}
"""

_lock = threading.Lock()
_lib: list = []  # [] not tried yet; [None] unavailable; [fn] loaded


def _cache_dir() -> str:
    base = os.environ.get("SPMD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spmd")
    return base


def _build() -> str | None:
    """Compile the kernel (once per source, machine and user); the shared library's path."""
    source = _SOURCE + _ERF_INV_SOURCE
    tag = hashlib.sha256((source + platform.machine() + platform.node()).encode()).hexdigest()
    d = _cache_dir()
    path = os.path.join(d, f"threefry_{tag[:16]}.so")
    if os.path.exists(path):
        return path
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        src = os.path.join(tmp, "threefry.c")
        with open(src, "w") as f:
            f.write(source)
        out = os.path.join(tmp, "threefry.so")
        cc = os.environ.get("CC", "cc")
        for flags in (["-O3", "-march=native"], ["-O3"]):
            # No contraction into fused multiply-adds: the numpy rounds' rounding.
            r = subprocess.run([cc, *flags, "-ffp-contract=off", "-shared", "-fPIC", "-o", out,
                                src, "-lm"],
                               capture_output=True)
            if r.returncode == 0:
                # Atomic: several processes of one job may build at once.
                os.replace(out, path)
                return path
    return None


def _load():
    """The library with its argument types set, or None."""
    if os.environ.get("SPMD_RANDOM_NATIVE", "1") == "0":
        return None
    try:
        path = _build()
        if path is None:
            return None
        lib = ctypes.CDLL(path)
    except (OSError, subprocess.SubprocessError):
        return None  # no compiler or no writable cache: the numpy versions serve
    u32p = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
    u64p = np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS")
    f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    lib.spmd_threefry_rows.argtypes = [u32p, u32p, ctypes.c_int64, u64p, ctypes.c_int64,
                                       ctypes.c_int64, u32p, ctypes.c_void_p, ctypes.c_int]
    lib.spmd_threefry_rows.restype = None
    lib.spmd_erf_inv_f32.argtypes = [f32p, f32p, f32p, ctypes.c_int64]
    lib.spmd_erf_inv_f32.restype = None
    return lib


def library():
    """The loaded kernels, or None (no compiler, or disabled by SPMD_RANDOM_NATIVE=0)."""
    if _lib:
        return _lib[0]
    with _lock:
        if not _lib:
            _lib.append(_load())
        return _lib[0]


def kernel():
    """The Threefry rows kernel, or None."""
    lib = library()
    return None if lib is None else lib.spmd_threefry_rows


def erf_inv_f32(x: np.ndarray):
    """``erf_inv`` of a float32 host array with the C kernel, or None when unavailable."""
    lib = library()
    if lib is None:
        return None
    shape = np.shape(x)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)  # 1-d (never a scalar)
    w = x * x
    np.negative(w, out=w)
    with np.errstate(divide="ignore"):  # |x| = 1: -inf here, +-inf in the result
        np.log1p(w, out=w)
    np.negative(w, out=w)
    out = np.empty_like(x)
    lib.spmd_erf_inv_f32(x, w, out, x.size)
    return out.reshape(shape)


def rows(k0s, k1s, row_start, rowlen: int, pair: bool):
    """Run the kernel: ``k0s``/``k1s`` uint32[nkeys], ``row_start`` uint64[nrows].
    Returns uint32[nkeys, nrows * rowlen] (``y0 ^ y1``) or a pair of them (``pair``)."""
    fn = kernel()
    k0s = np.ascontiguousarray(k0s, dtype=np.uint32)
    k1s = np.ascontiguousarray(k1s, dtype=np.uint32)
    row_start = np.ascontiguousarray(row_start, dtype=np.uint64)
    nkeys, nrows = k0s.shape[0], row_start.shape[0]
    out0 = np.empty((nkeys, nrows * rowlen), np.uint32)
    out1 = np.empty((nkeys, nrows * rowlen), np.uint32) if pair else None
    fn(k0s, k1s, nkeys, row_start, nrows, rowlen, out0,
       out1.ctypes.data if pair else None, 1 if pair else 0)
    return (out0, out1) if pair else out0
