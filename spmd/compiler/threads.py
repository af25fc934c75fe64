"""The engine's threads: one pool per process.

Generated numpy code runs one equation at a time.  Two kinds of equation share
their work among :data:`POOL`'s threads (the calling thread is one of them):
fused elementwise kernels (:mod:`spmd.compiler.fusion`) and batches of small
matrix products (``dot_general``: attention's per-head products, a simulated
mesh's per-device ones), cut by batch into BLAS calls, which numpy makes without
the GIL: OpenBLAS runs such small products on one thread
(:data:`SINGLE_THREADED_MNK`), so the parts do not compete for its threads
(measured: 1.2-1.9x faster than one call).  Larger products stay one call, in
BLAS's own threads.

Both need BLAS's threads to sleep between calls: OpenBLAS's busy-wait on the
cores for long after each call by default (measured: a kernel on two threads
right after a product ran no faster than on one).  ``spmd`` sets
``OPENBLAS_THREAD_TIMEOUT`` when it is imported before numpy, and ``spmd-run``
for its ranks (``spmd.config.BLAS_THREADS_YIELD``); without it nothing runs on
the pool.

Threads: ``SPMD_NUM_THREADS``, else ``OMP_NUM_THREADS`` (``spmd-run`` sets it to
the cores per rank), else the cores this process may use.
"""

from __future__ import annotations

import contextvars
import functools
import os
import threading

from spmd.config import BLAS_THREADS_YIELD
from spmd.errors import ArgumentError


def num_threads() -> int:
    """Threads the engine uses: ``SPMD_NUM_THREADS``, else ``OMP_NUM_THREADS``, else the
    cores this process may use.

    >>> num_threads() >= 1
    True
    """
    for name in ("SPMD_NUM_THREADS", "OMP_NUM_THREADS"):
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                n = int(raw)
            except ValueError:
                n = 0
            if n < 1:
                raise ArgumentError(f"{name}={raw!r} is not a number of threads >= 1; set it "
                                    "to a positive integer (or unset it: the usable cores)")
            return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


class Pool:
    """Worker threads that run parts of an equation; the caller runs the first part."""

    def __init__(self):
        self._lock = threading.Lock()
        self._executor = None
        self.threads = None  # read from the environment at first use
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self):  # a forked child has none of its parent's threads
        self._executor, self.threads = None, None

    def size(self) -> int:
        if self.threads is None:
            with self._lock:
                if self.threads is None:
                    self.threads = num_threads()
        return self.threads

    def run(self, parts) -> None:
        """Call each of ``parts`` (functions of no argument), in parallel; return when
        all have finished, raising the first failure."""
        if len(parts) == 1 or self.size() == 1:
            for p in parts:
                p()
            return
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._executor = ThreadPoolExecutor(self.threads - 1,
                                                        thread_name_prefix="spmd-engine")
        # Each part runs in a copy of the caller's context: numpy's error state
        # (np.errstate, a context variable) holds in the workers as in the caller.
        futures = [self._executor.submit(contextvars.copy_context().run, p)
                   for p in parts[1:]]
        try:
            parts[0]()
        finally:
            # Every part has finished (none still writes into a result) before a
            # failure is raised.
            from concurrent.futures import wait

            wait(futures)
        for f in futures:
            f.result()


POOL = Pool()


# ------------------------------------------------------------ BLAS's own threads

@functools.lru_cache(maxsize=None)
def blas_is_openblas() -> bool:
    """Whether numpy's BLAS is OpenBLAS (the wheels' BLAS), whose rule for threading a
    product :data:`SINGLE_THREADED_MNK` states."""
    import numpy as np

    try:
        name = np.__config__.CONFIG["Build Dependencies"]["blas"]["name"]
    except (AttributeError, KeyError, TypeError):  # another layout: assume nothing
        return False
    return "openblas" in str(name).lower()


# OpenBLAS runs a product with m * n * k at most this on one thread, whatever its
# thread count (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD,
# 65536 * 4 by default).  Such products may be made from several threads at once;
# larger ones from two threads at once ran 15x slower than one call (measured:
# 128 products of (128, 32) @ (32, 128), 22 ms against 1.5 ms).
SINGLE_THREADED_MNK = 65536 * 4


def can_split() -> bool:
    """Whether a batch of small products may be shared among the pool's threads: more
    than one thread, OpenBLAS (each part stays on one of its threads), and BLAS's
    threads sleeping between calls (else they spin on the cores the parts need)."""
    return POOL.size() > 1 and BLAS_THREADS_YIELD and blas_is_openblas()


def threads_help() -> bool:
    """Whether threaded kernels beat the unfused code here: more than one thread, and
    BLAS's threads sleeping between calls (``spmd.config.BLAS_THREADS_YIELD``:
    otherwise they busy-wait on the cores for long after each product, and a kernel on
    two threads ran no faster than on one)."""
    return num_threads() > 1 and BLAS_THREADS_YIELD
