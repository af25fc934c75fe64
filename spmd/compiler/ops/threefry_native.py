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

_lock = threading.Lock()
_lib: list = []  # [] not tried yet; [None] unavailable; [fn] loaded


def _cache_dir() -> str:
    base = os.environ.get("SPMD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spmd")
    return base


def _build() -> str | None:
    """Compile the kernel (once per source, machine and user); the shared library's path."""
    tag = hashlib.sha256((_SOURCE + platform.machine() + platform.node()).encode()).hexdigest()
    d = _cache_dir()
    path = os.path.join(d, f"threefry_{tag[:16]}.so")
    if os.path.exists(path):
        return path
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        src = os.path.join(tmp, "threefry.c")
        with open(src, "w") as f:
            f.write(_SOURCE)
        out = os.path.join(tmp, "threefry.so")
        cc = os.environ.get("CC", "cc")
        for flags in (["-O3", "-march=native"], ["-O3"]):
            r = subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", out, src],
                               capture_output=True)
            if r.returncode == 0:
                # Atomic: several processes of one job may build at once.
                os.replace(out, path)
                return path
    return None


def kernel():
    """The loaded C function, or None (no compiler, or disabled by SPMD_RANDOM_NATIVE=0)."""
    if _lib:
        return _lib[0]
    with _lock:
        if _lib:
            return _lib[0]
        fn = None
        if os.environ.get("SPMD_RANDOM_NATIVE", "1") != "0":
            try:
                path = _build()
                if path is not None:
                    fn = ctypes.CDLL(path).spmd_threefry_rows
                    u32p = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
                    u64p = np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS")
                    fn.argtypes = [u32p, u32p, ctypes.c_int64, u64p, ctypes.c_int64,
                                   ctypes.c_int64, u32p, ctypes.c_void_p, ctypes.c_int]
                    fn.restype = None
            except (OSError, subprocess.SubprocessError):
                fn = None  # no compiler or no writable cache: the numpy rounds serve
        _lib.append(fn)
        return fn


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
