"""Global switches, read from the environment and changeable at run time.

Example::

    spmd.config.update("enable_x64", True)   # or SPMD_ENABLE_X64=1
"""

from __future__ import annotations

import contextlib
import os
import sys

from spmd.errors import ArgumentError

# OpenBLAS's worker threads busy-wait for a long time after each call before they
# sleep, holding the cores that spmd's threaded kernels (spmd.compiler.engine.fusion) run
# on: measured here, a kernel on 2 threads right after a matrix product ran no
# faster than on one.  OPENBLAS_THREAD_TIMEOUT=12 makes them sleep after a short
# spin, with no measured cost to back-to-back products.  The library
# reads it when it loads, so it is set only when numpy is not loaded yet (this is
# spmd's first module), and never over the user's value; spmd-run sets it for its
# ranks.  BLAS_THREADS_YIELD says whether it is in force.
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")
BLAS_THREADS_YIELD: bool = "OPENBLAS_THREAD_TIMEOUT" in os.environ


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ArgumentError(f"{name}={raw!r} is not an integer >= 0; set it to a number of "
                            "bytes (0 disables)")
    return value


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ArgumentError(f"{name}={os.environ[name]!r} is not a switch; set it to 1 or 0")


def _env_choice(names: tuple, choices: tuple, default: str) -> str:
    """The value of the first of ``names`` set in the environment, one of ``choices``."""
    for name in names:
        raw = os.environ.get(name, "").strip()
        if raw:
            if raw.lower() not in choices:
                raise ArgumentError(f"{name}={raw!r} is not one of {list(choices)}; set it to "
                                    f"one of them (or unset it for {default!r})")
            return raw.lower()
    return default


# JAX's modes of traceback filtering (spmd.shard.call.tracebacks says what each does).
TRACEBACK_FILTERING_MODES = ("off", "tracebackhide", "remove_frames", "quiet_remove_frames",
                             "auto")


# glibc's malloc, by default, gives a freed buffer of more than 128 KiB back to the
# system (and raises that threshold only as it sees large frees), so a program that
# frees each value after its last use (spmd.compiler.engine.codegen.release_dead_names)
# faults every page of its next buffer in again: measured, the example's small
# training step took 65 ms instead of 37 (docs/history/2026-12-05-engine-rounds.md,
# "The engine, second round").  Keeping freed buffers of up to MALLOC_MMAP_THRESHOLD
# bytes in the heap, and giving memory back only when more than MALLOC_TRIM_THRESHOLD
# is free at its top, makes buffers reused instead (as a caching allocator does); peak
# memory is still the largest live set.  Done once when spmd is imported, never over
# the user's own MALLOC_* settings; SPMD_TUNE_MALLOC=0 leaves malloc as it was.
# MALLOC_TUNED says whether it is done.
MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest on 64-bit systems
MALLOC_TRIM_THRESHOLD = 512 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def _tune_malloc() -> bool:
    if not _env_bool("SPMD_TUNE_MALLOC", True) or not sys.platform.startswith("linux"):
        return False
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                     "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")):
        return False  # the user chose; theirs stand
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl's malloc has no such knobs
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``; a no-op
    elsewhere): after a burst of allocations that will not come again, such as a
    compilation, which the raised trim threshold would otherwise keep resident."""
    if not MALLOC_TUNED:
        return
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Config:
    """Holds the switches; ``update(name, value)`` changes one."""

    def __init__(self) -> None:
        self.enable_x64: bool = _env_flag("SPMD_ENABLE_X64")
        # jit runs the Python function op by op (see disable_jit).
        self.disable_jit: bool = _env_flag("SPMD_DISABLE_JIT")
        # Independent all-reduces of a program lowered for execution are combined
        # into buckets of at most this many bytes (spmd.compiler.passes.combine); 0
        # disables combining.  Applies to programs compiled after a change.
        self.combine_collectives_bytes: int = _env_int("SPMD_COMBINE_COLLECTIVES_BYTES",
                                                       32 * 1024 * 1024)
        # Combinable all-reduces whose backend can start one without waiting (mpi)
        # are started in buckets of at most this many bytes as soon as their
        # operands exist, and waited for where first used (spmd.compiler.passes.overlap);
        # 0 turns overlap off (combined blocking all-reduces, as above).
        self.overlap_bucket_bytes: int = _env_int("SPMD_OVERLAP_BUCKET_BYTES", 2 * 1024 * 1024)
        # Chains of elementwise equations of a program lowered for execution run as
        # one kernel each (spmd.compiler.engine.fusion); applies to programs compiled after.
        self.fuse_elementwise: bool = _env_bool("SPMD_FUSE_ELEMENTWISE", True)
        # Chains with row sums (layer norms) run as one loop compiled by numba, once
        # their program has run a few times (spmd.compiler.engine.rows).
        self.compile_kernels: bool = _env_bool("SPMD_COMPILE_KERNELS", True)
        # Elementwise values read again much later (the forward's, by the backward)
        # are recomputed there rather than kept (spmd.compiler.passes.recompute).
        self.recompute_elementwise: bool = _env_bool("SPMD_RECOMPUTE_ELEMENTWISE", True)
        # JAX's matmul precision setting, accepted and recorded: products here are
        # always computed in their operands' dtype (numpy's and CuPy's defaults; no
        # TF32 or bfloat16 passes), which is JAX's "highest".
        self.default_matmul_precision = None
        # Which frames a user's error under spmd.jit or shard_map shows
        # (spmd.shard.call.tracebacks): JAX's modes and environment variable, so a
        # ported program's setting carries over.
        self.traceback_filtering: str = _env_choice(
            ("SPMD_TRACEBACK_FILTERING", "JAX_TRACEBACK_FILTERING"), TRACEBACK_FILTERING_MODES,
            "auto")
        # Listeners are told of every change.  (None is registered today: a switch
        # that changes traced programs, enable_x64, is part of the jit cache key;
        # the others apply to programs compiled after the change.)
        self._listeners: list = []

    def _options(self) -> list:
        return sorted(k for k in vars(self) if not k.startswith("_"))

    def _option_name(self, name, where: str) -> str:
        """spmd's name of option ``name``: JAX's ``jax_<name>`` is spmd's ``<name>``, so
        ``config.update("jax_enable_x64", True)`` from a JAX program works unchanged."""
        if isinstance(name, str) and name.startswith("jax_") and name[4:] in vars(self) \
                and not name[4:].startswith("_"):
            return name[4:]
        if not isinstance(name, str) or name not in vars(self) or name.startswith("_"):
            known = self._options()
            raise ArgumentError(
                f"spmd.config.{where}: unknown option {name!r}; known options: {known} "
                f"(each also as JAX names it: {['jax_' + k for k in known]})")
        return name

    def __getattr__(self, name: str):
        # Only names not found normally: JAX's `config.jax_enable_x64` reads enable_x64.
        if name.startswith("jax_") and name[4:] in vars(self) and not name[4:].startswith("_"):
            return vars(self)[name[4:]]
        raise AttributeError(f"spmd.config has no option {name!r}; known options: "
                             f"{self._options()} (also with JAX's 'jax_' prefix)")

    def read(self, name: str):
        """The value of option ``name`` (spmd's or JAX's name for it), as JAX's
        ``config.read``.

        >>> spmd.config.read("jax_enable_x64")
        False
        """
        return getattr(self, self._option_name(name, "read"))

    def update(self, name: str, value) -> None:
        """Set option ``name`` (spmd's name, or JAX's: ``"jax_enable_x64"`` is
        ``"enable_x64"``) to ``value``.

        >>> spmd.config.update("jax_enable_x64", True)
        """
        name = self._option_name(name, "update")
        if name in ("combine_collectives_bytes", "overlap_bucket_bytes") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0):
            what = "combined collective; 0 disables combining" if name.startswith("combine") \
                else "overlapped bucket; 0 turns overlap off"
            raise ArgumentError(
                f"spmd.config.update: {name} must be an int >= 0 (bytes per {what}), "
                f"got {value!r}")
        if name == "default_matmul_precision" and value not in MATMUL_PRECISIONS:
            raise ArgumentError(
                f"spmd.config.update: default_matmul_precision={value!r} is not one of "
                f"JAX's names {sorted(p for p in MATMUL_PRECISIONS if p)} (or None)")
        if name in ("fuse_elementwise", "recompute_elementwise", "compile_kernels") and \
                not isinstance(value, bool):
            raise ArgumentError(f"spmd.config.update: {name} must be True or False, "
                                f"got {value!r}")
        if name == "traceback_filtering" and value not in TRACEBACK_FILTERING_MODES:
            raise ArgumentError(f"spmd.config.update: traceback_filtering={value!r} is not one "
                                f"of {list(TRACEBACK_FILTERING_MODES)} (JAX's modes; 'off' shows "
                                "spmd's own frames)")
        setattr(self, name, value)
        for fn in self._listeners:
            fn(name, value)


config = Config()
MALLOC_TUNED: bool = _tune_malloc()


MATMUL_PRECISIONS = frozenset({None, "default", "high", "highest", "fastest", "bfloat16",
                               "tensorfloat32", "float32", "bfloat16_3x", "ANY_F8_ANY_F8_F32",
                               "ANY_F8_ANY_F8_F32_FAST_ACCUM", "ANY_F8_ANY_F8_ANY",
                               "ANY_F8_ANY_F8_ANY_FAST_ACCUM", "F16_F16_F16", "F16_F16_F32",
                               "BF16_BF16_BF16", "BF16_BF16_F32", "BF16_BF16_F32_X3",
                               "BF16_BF16_F32_X6", "TF32_TF32_F32", "TF32_TF32_F32_X3",
                               "F32_F32_F32", "F64_F64_F64"})


@contextlib.contextmanager
def default_matmul_precision(precision: str | None):
    """``jax.default_matmul_precision``: within the block (or on a decorated function),
    the default precision of matrix products.  Accepted and recorded only: ``spmd``
    computes every product in its operands' dtype, which is what JAX's ``"highest"``
    (``"float32"`` for float32) gives, so a program asking for less gets at least
    what it asked for.

    >>> with default_matmul_precision("float32"):
    ...     y = spmd.numpy.dot(a, b)  # doctest: +SKIP
    """
    old = config.default_matmul_precision
    config.update("default_matmul_precision", precision)
    try:
        yield
    finally:
        config.update("default_matmul_precision", old)


@contextlib.contextmanager
def disable_jit(disable: bool = True):
    """Within the block, jitted functions run their Python code op by op (so
    ``print`` shows values), and ``lax.cond``/``switch``/``while_loop``/``fori_loop``/
    ``scan`` run as Python control flow on concrete operands, as ``jax.disable_jit``.

    >>> with disable_jit():
    ...     spmd.jit(lambda x: print(x) or x)(np.ones(2))  # doctest: +SKIP
    """
    old = config.disable_jit
    config.update("disable_jit", bool(disable))
    try:
        yield
    finally:
        config.update("disable_jit", old)
