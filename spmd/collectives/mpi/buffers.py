"""What the MPI calls read and write: operands widened to a type MPI reduces, byte
views for data movement, the reduction ops, and the pool of receive buffers.

>>> from spmd.collectives.mpi import buffers
>>> buffers.recv_buffer((4,), np.float32).shape
(4,)
"""

from __future__ import annotations

import math
import mmap
import sys

import numpy as np

from spmd.compiler.core import dtypes


# MPI has no reduction over these types: reduce in a wider one.
WIDEN = {np.dtype(np.float16): np.dtype(np.float32), np.dtype(np.bool_): np.dtype(np.uint8)}


def widen(x):
    dt = WIDEN.get(x.dtype)
    if dt is None and (x.dtype.kind == "V" or x.dtype in dtypes.NARROW_FLOATS):
        # bfloat16 and the 8-bit floats (float8_e5m2 is of kind "f", and MPI has no
        # datatype for it either): summed in float32, rounded once at the end.
        dt = np.dtype(np.float32)
    if dt is None and type(x) is np.ndarray and x.flags.c_contiguous:
        return x, None  # the common case: MPI reads it as it is
    # C order: MPI reads the buffer's memory (astype would keep a transposed layout).
    # (np.ascontiguousarray makes 0-d arrays 1-d: keep the shape.)
    buf = np.ascontiguousarray(x, dtype=dt).reshape(x.shape)
    return (buf, x.dtype) if dt is not None else (buf, None)


def as_bytes(x):
    """A contiguous byte view of ``x`` (data movement needs no MPI datatype)."""
    return np.ascontiguousarray(x).view(np.uint8)


_OPS: dict = {}


def reduce_op(name):
    op = _OPS.get(name)
    if op is None:  # built once: this sits on every reduction's path
        from mpi4py import MPI

        _OPS.update(sum=MPI.SUM, max=MPI.MAX, min=MPI.MIN)
        op = _OPS[name]
    return op


# ------------------------------------------------------- receive buffers
#
# A fresh large numpy buffer is fresh memory from the kernel: every page
# faults (and is zeroed) when MPI first writes it, which cost as much as the
# transfer itself (32 MiB: ~10 ms of faults).  So receive buffers of
# POOL_MIN_BYTES or more are kept and reused -- but only once nothing refers to
# them any more: every numpy view holds a reference to its base, so a buffer
# whose only reference is the pool's list is dead and may be overwritten.

POOL_MIN_BYTES = 64 * 1024
POOL_PER_SHAPE = 4           # buffers kept per (shape, dtype)
POOL_MAX_BYTES = 1 << 30     # all kept buffers together
_pool: dict = {}
_pool_bytes = [0]


def _refs_when_free() -> int:
    """What sys.getrefcount reports, in recv_buffer's loop, for a buffer only the pool
    holds (3 on CPython 3.11: the list, the loop variable, the call's argument);
    measured the same way, so an interpreter that counts differently is followed."""
    kept = [np.empty(1)]
    for buf in kept:
        return sys.getrefcount(buf)
    raise AssertionError  # pragma: no cover


_FREE_REFS = _refs_when_free()


def recv_buffer(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array to receive into: a dead pooled one when there is one.

    The pool keeps each buffer's memory owner; every array made from it (the result,
    the caller's views of it) holds that owner as its ``base``, so an owner only the
    pool refers to is dead, whatever views were handed out."""
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes < POOL_MIN_BYTES:
        return np.empty(shape, dtype)
    kept = _pool.setdefault((shape, dtype), [])
    for owner in kept:
        if sys.getrefcount(owner) == _FREE_REFS:
            return _in(owner, shape, dtype, nbytes)
    owner = np.empty(shape, dtype) if nbytes < HUGE_BYTES else _huge_owner(nbytes)
    if len(kept) < POOL_PER_SHAPE and _pool_bytes[0] + owner.nbytes <= POOL_MAX_BYTES:
        kept.append(owner)
        _pool_bytes[0] += owner.nbytes
    return _in(owner, shape, dtype, nbytes)


# Receive buffers of HUGE_BYTES or more are backed by transparent huge pages: each
# is its own private anonymous mapping, advised MADV_HUGEPAGE, used from its first
# 2 MiB boundary.  MPI's shared-memory copies into such a buffer were 1.2-1.4x
# faster at 4 MiB on 2 ranks (reduce-scatter + all-gather: 550-620 against
# 760-950 us, the input and everything else the same; no difference at 256 KiB),
# 2026-12-02.  np.empty is not enough: once a process has freed large blocks,
# glibc serves the next ones from memory it already mapped with small pages, and
# numpy's advice comes too late for those -- a pool buffer made mid-run had 0 of 22
# sampled pages huge (/proc/self/pagemap), one made at start-up 16 of 18.
HUGE_BYTES = 2 * 1024 * 1024


def _huge_owner(nbytes: int) -> np.ndarray:
    """A fresh uint8 array of ``nbytes + HUGE_BYTES`` in its own private mapping,
    advised for huge pages (np.empty where the platform has no such mapping)."""
    size = nbytes + HUGE_BYTES
    try:
        mem = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError):  # no MAP_PRIVATE (Windows), or no mapping left
        return np.empty(size, np.uint8)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mem.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: small pages, still right
            pass
    # The array keeps the mapping alive (its base); every view's base is the array.
    return np.frombuffer(mem, np.uint8)


def _in(owner: np.ndarray, shape: tuple, dtype, nbytes: int) -> np.ndarray:
    """The receive array in ``owner`` (itself, or its 2 MiB-aligned part)."""
    if nbytes < HUGE_BYTES:
        return owner
    off = (-owner.__array_interface__["data"][0]) % HUGE_BYTES
    return owner[off:off + nbytes].view(dtype).reshape(shape)


def clear_buffers() -> None:
    """Drop the kept receive buffers (their memory goes back once no result uses it)."""
    _pool.clear()
    _pool_bytes[0] = 0
