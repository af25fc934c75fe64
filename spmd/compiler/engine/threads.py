"""The engine's threads: one pool per process.

Generated numpy code runs one equation at a time.  Two kinds of equation share
their work among :data:`POOL`'s threads (the calling thread is one of them):
fused elementwise kernels (:mod:`spmd.compiler.engine.fusion`) and batches of matrix
products (``dot_general``: attention's per-head products, a simulated mesh's
per-device ones), cut by batch into BLAS calls, which numpy makes without the GIL.
OpenBLAS keeps a small product on one thread (:data:`SINGLE_THREADED_MNK`); for
larger ones :data:`BLAS` holds it to one thread while the parts run, so that the
parts do not compete for its threads (measured: 1.2-1.9x faster than one call).
A single large product stays one call, in BLAS's own threads.

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

import contextlib
import contextvars
import ctypes
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


@functools.lru_cache(maxsize=None)
def numpy_openblas():
    """The OpenBLAS library numpy loaded, as a ``ctypes.CDLL`` (on Linux, the library
    named in ``/proc/self/maps``), or None: numpy's BLAS is another one, or it cannot
    be found.  Its thread count (:data:`BLAS`) and its CBLAS products with an
    accumulating ``beta`` (:mod:`spmd.compiler.engine.gemm`) are called through it."""
    if not blas_is_openblas():
        return None
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln}
    except OSError:  # not Linux
        return None
    # numpy's own first: scipy's wheels load another OpenBLAS (32-bit integers).
    for path in sorted(paths, key=lambda p: ("numpy" not in p, p)):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


# OpenBLAS runs a product with m * n * k at most this on one thread, whatever its
# thread count (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD,
# 65536 * 4 by default).  Larger products made from two threads at once, each on
# OpenBLAS's threads too, fight over the cores (measured: 128 products of
# (128, 32) @ (32, 128), 22 ms against 1.5 ms as one call), so those are split only
# while BLAS is held to one thread (:data:`BLAS`, ``BLAS.one()``).
SINGLE_THREADED_MNK = 65536 * 4


class _BlasThreads:
    """numpy's OpenBLAS thread count, held at one while the engine's threads make a
    batch of products between them, and put back after.

    Found through the loaded library's own ``openblas_set_num_threads`` (on Linux, the
    library numpy loaded, named in ``/proc/self/maps``).  threadpoolctl is not used:
    it lets only one Python thread ever change OpenBLAS's count and ignores the
    others, and the engine runs in whichever thread calls a program.  Holds nest and
    overlap between callers: the first hold saves the count and sets one, the last
    release puts the saved count back.  Only a pthreads build is held (an OpenMP
    build's count was not reliably restored before OpenBLAS 0.3.34).
    """

    _SYMBOLS = [("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_",
                 "scipy_openblas_get_parallel64_"),
                ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads",
                 "scipy_openblas_get_parallel"),
                ("openblas_set_num_threads64_", "openblas_get_num_threads64_",
                 "openblas_get_parallel64_"),
                ("openblas_set_num_threads", "openblas_get_num_threads",
                 "openblas_get_parallel")]

    def __init__(self):
        self._lock = threading.Lock()
        self._found = False
        self._set = self._get = None
        self._holders = 0
        self._saved = None

    def _find(self) -> None:
        self._found = True
        lib = numpy_openblas()
        if lib is None:
            return
        for set_name, get_name, parallel_name in self._SYMBOLS:
            set_, get, parallel = (getattr(lib, n, None)
                                   for n in (set_name, get_name, parallel_name))
            if set_ is not None and get is not None and parallel is not None:
                set_.restype = None
                set_.argtypes = [ctypes.c_int]
                if parallel() == 1:  # 1: pthreads (0: sequential, 2: OpenMP)
                    self._set, self._get = set_, get
                return

    def available(self) -> bool:
        """Whether the count can be held at one."""
        if not self._found:
            with self._lock:
                if not self._found:
                    self._find()
        return self._set is not None

    def count(self) -> int | None:
        """OpenBLAS's thread count now (None where it cannot be read)."""
        return int(self._get()) if self.available() else None

    @contextlib.contextmanager
    def one(self):
        """BLAS on one thread inside the block (a no-op where it cannot be held)."""
        if not self.available():
            yield
            return
        with self._lock:
            if self._holders == 0:
                self._saved = int(self._get())
                self._set(1)
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    self._set(self._saved)


BLAS = _BlasThreads()


def can_split(mnk: int = 0) -> bool:
    """Whether a batch of products of ``m * n * k = mnk`` each may be shared among the
    pool's threads: more than one thread, OpenBLAS, BLAS's threads sleeping between
    calls (else they spin on the cores the parts need), and each part on one BLAS
    thread: OpenBLAS keeps such a product on one thread, or :data:`BLAS` can hold it
    there for the split."""
    return (POOL.size() > 1 and BLAS_THREADS_YIELD and blas_is_openblas()
            and (mnk <= SINGLE_THREADED_MNK or BLAS.available()))


def run_products(parts, mnk: int) -> None:
    """Run ``parts`` (each a BLAS call on a slice of a batch of products of
    ``m * n * k = mnk``) on the pool, BLAS held to one thread where the products are
    large enough for OpenBLAS to thread them."""
    if mnk <= SINGLE_THREADED_MNK:
        POOL.run(parts)
        return
    with BLAS.one():
        POOL.run(parts)


def threads_help() -> bool:
    """Whether threaded kernels beat the unfused code here: more than one thread, and
    BLAS's threads sleeping between calls (``spmd.config.BLAS_THREADS_YIELD``:
    otherwise they busy-wait on the cores for long after each product, and a kernel on
    two threads ran no faster than on one)."""
    return num_threads() > 1 and BLAS_THREADS_YIELD
