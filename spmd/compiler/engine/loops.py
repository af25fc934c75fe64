"""Compiled loops: generated numba modules, compiled in the background, cached on
disk, and switched to at a fixed call.

Three kinds of kernels use it: row kernels (:mod:`spmd.compiler.engine.rows_jit`),
elementwise groups (:mod:`spmd.compiler.engine.fusion_jit`) and the attention kernel's
softmax passes (:mod:`spmd.compiler.ops.attention_jit`).  Each gives the source
of a module; this module compiles it once per process and source, and a
:class:`Tier` per call site decides when the compiled code is used.

Compilation is tiered: a call site runs its numpy code until its
:data:`SWITCH_AT`-th call; at call :data:`COMPILE_AFTER` a background thread
compiles the module (numba's compiler lock keeps compilations apart), and at call
:data:`SWITCH_AT` the site waits for it if it must and switches to the compiled
loop: at the same call on every rank and in every run.  The module is written under
:func:`cache_dir` and numba caches its machine code beside it, so a later process
(another rank, the next run) loads it in milliseconds.  A module that fails to
compile leaves its sites on numpy, with one warning.  :func:`wait_compiled` waits
for the compilations under way.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import math
import os
import sys
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from spmd.config import config, release_free_memory

# A site's loop is compiled (in the background) when the site runs for the
# COMPILE_AFTER-th time, and used from its SWITCH_AT-th call on (waiting for the
# compilation if it has not finished).  A program run once (most tests, a first
# call) never waits for or competes with a compilation; and the call that switches
# is fixed, not whenever a thread finished: every rank of a job, and every run,
# switches at the same step (the compiled loop's sums may differ in their last bits).
COMPILE_AFTER = 2
SWITCH_AT = COMPILE_AFTER + 3

_lock = threading.Lock()
_executor = None
_compiled: dict = {}  # source -> Future of the loaded module (None: failed)
_warned: list = []


def numba_available() -> bool:
    """Whether numba can be imported here (checked without importing it)."""
    return importlib.util.find_spec("numba") is not None


def enabled() -> bool:
    """Whether compiled loops are in force: ``spmd.config.compile_kernels`` (the
    ``SPMD_COMPILE_KERNELS`` switch) and numba installed."""
    return config.compile_kernels and numba_available()


def cache_dir() -> str:
    """Where generated kernel modules and numba's cache of them live:
    ``SPMD_CACHE_DIR``, else ``$XDG_CACHE_HOME/spmd/kernels`` (``~/.cache``)."""
    root = os.environ.get("SPMD_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        root = os.path.join(base, "spmd")
    return os.path.join(root, "kernels")


# The expression a generated loop computes for each kernel op (numpy's function name,
# ``spmd.compiler.ops.elementwise``'s ``kernel_op``), on its operands' names; ``exp``
# and ``tanh`` are kernel_math's float32 functions (float32 nodes only).
EXPR = {"add": "{0} + {1}", "subtract": "{0} - {1}", "multiply": "{0} * {1}",
        "divide": "{0} / {1}", "negative": "-{0}", "sqrt": "np.sqrt({0})",
        "rsqrt": "{one} / np.sqrt({0})", "absolute": "abs({0})",
        "where": "{2} if {0} else {1}", "less": "{0} < {1}", "less_equal": "{0} <= {1}",
        "greater": "{0} > {1}", "greater_equal": "{0} >= {1}", "equal": "{0} == {1}",
        "not_equal": "{0} != {1}", "exp": "expf({0})", "tanh": "tanhf({0})"}


def expression(op: str, xs: list, params: dict, one: str) -> str:
    """The expression of a node ``op`` on operand expressions ``xs`` (``one``: the
    node's 1, for ``rsqrt`` and negative powers)."""
    if op == "integer_pow":
        y = params["y"]
        if y == 0:
            return one
        prod = " * ".join([xs[0]] * abs(y))
        return prod if y > 0 else f"{one} / ({prod})"
    return EXPR[op].format(*xs, one=one)


def kernel_math_digest() -> str:
    """A digest of :mod:`spmd.compiler.engine.kernel_math`'s source, read without importing
    it (which imports numba): a generated module that uses it names it, so that
    numba's cache of the module is never reused after those functions change."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_math.py")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def literal(v) -> str:
    """Source for the value of a 0-d numpy array in a generated module (``inf`` and
    ``nan``, which ``repr`` writes as names Python does not know, as numpy's)."""
    x = v.item()
    if isinstance(x, float) and not math.isfinite(x):
        x = "np.nan" if math.isnan(x) else "np.inf" if x > 0 else "-np.inf"
    else:
        x = repr(x)
    name = "bool_" if v.dtype == bool else v.dtype.name
    return f"np.{name}({x})"


def module_name(src: str, prefix: str) -> str:
    return f"spmd_{prefix}_{hashlib.sha256(src.encode()).hexdigest()[:24]}"


def _load(src: str, prefix: str):
    """Import the generated module (compiling its functions, or loading them from
    numba's cache)."""
    name = module_name(src, prefix)
    try:
        folder = cache_dir()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name + ".py")
        if not os.path.exists(path):
            # Written whole or not at all: ranks of one job may write it at once.
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(src)
            os.replace(tmp, path)
    except OSError:  # an unwritable cache: compiled each time, in a private folder
        folder = tempfile.mkdtemp(prefix="spmd-kernels-")
        path = os.path.join(folder, name + ".py")
        with open(path, "w") as f:
            f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # numba's cache records the module's name and imports it again by that name
    # when it loads the machine code (a stale entry recorded another: `_forget`).
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _forget(src: str, prefix: str) -> None:
    """Remove numba's cache of ``src``'s module (a stale or unreadable entry)."""
    name = module_name(src, prefix)
    for path in glob.glob(os.path.join(cache_dir(), "__pycache__", name + ".*")):
        try:
            os.remove(path)
        except OSError:
            pass


def _compile(src: str, prefix: str, pick):
    try:
        try:
            return pick(_load(src, prefix))
        except Exception:  # noqa: BLE001 - once more, without what numba had cached
            _forget(src, prefix)
            return pick(_load(src, prefix))
        finally:
            # The compiler's scratch (hundreds of MiB over a model's loops) is freed
            # but stays resident under spmd's raised trim threshold: give it back.
            release_free_memory()
    except Exception as e:  # noqa: BLE001 - any failure leaves the numpy code running
        if not _warned:
            _warned.append(True)
            warnings.warn(f"spmd: a {prefix} kernel could not be compiled "
                          f"({type(e).__name__}: {e}); it keeps running as numpy calls. "
                          "Set SPMD_COMPILE_KERNELS=0 to stop trying.", RuntimeWarning,
                          stacklevel=2)
        return None


def compile_async(src: str, prefix: str, pick=lambda module: module):
    """The Future of ``pick(module)`` for the module of source ``src`` (None if it
    could not be compiled); one per distinct source (the layer norms of a model's
    layers share one)."""
    global _executor
    with _lock:
        fut = _compiled.get(src)
        if fut is None:
            if _executor is None:
                _executor = ThreadPoolExecutor(1, thread_name_prefix="spmd-compile")
            fut = _compiled[src] = _executor.submit(_compile, src, prefix, pick)
    return fut


def kern_of(module):
    """A generated module's loop ``kern``, allowed no other types (a wrong call raises
    rather than compiles)."""
    module.kern.disable_compile()
    return module.kern


def wait_compiled(timeout: float | None = None) -> None:
    """Wait until the kernels submitted so far are compiled (or failed).

    >>> wait_compiled()
    """
    with _lock:
        futures = list(_compiled.values())
    wait(futures, timeout=timeout)


class Tier:
    """When one call site switches to its compiled code: ``ready()`` counts the
    site's calls and returns the compiled object from call :data:`SWITCH_AT` on
    (None before, and for good if it could not be compiled); ``request()`` gives the
    Future to wait for, asked for at call :data:`COMPILE_AFTER`."""

    __slots__ = ("request", "calls", "future", "done")

    def __init__(self, request):
        self.request, self.calls, self.future, self.done = request, 0, None, None

    def ready(self):
        if self.done is not None:
            return self.done
        self.calls += 1
        if self.calls == COMPILE_AFTER or (self.calls > COMPILE_AFTER and self.future is None):
            self.future = self.request()
        if self.calls < SWITCH_AT or self.future is None:
            return None
        fut, self.future = self.future, None
        compiled = fut.result() if fut.exception() is None else None
        if compiled is None:  # could not be compiled (warned): numpy from now on
            self.calls = -(1 << 62)
            return None
        self.done = compiled
        # The numpy calls' buffers, freed but kept by the heap, are not needed again.
        release_free_memory()
        return compiled


class Site:
    """One equation's implementation on numpy with a compiled tier: ``impl(np, *args,
    **params)`` (the numpy code) and a :class:`Tier` whose request is the subclass's
    ``compile`` (a function giving the Future of its module).  Subclasses decide per
    call which calls the compiled code serves."""

    __slots__ = ("impl", "params", "tier")
    compile = None

    def __init__(self, impl, params: dict):
        self.impl, self.params, self.tier = impl, params, Tier(type(self).compile)


def bind_site(impl, site):
    """A primitive's ``bind_impl`` rule: a ``site`` (a :class:`Site` subclass) per
    equation on numpy where compiled loops are in force (:func:`enabled`), else
    ``impl`` with its parameters bound."""
    def bind(xp, **params):
        if xp is np and enabled():
            return site(impl, params)
        return functools.partial(impl, xp, **params)

    return bind
