"""spmd: SPMD distributed execution for Python with a JAX-compatible API.

>>> import spmd, spmd.numpy as snp
>>> f = spmd.jit(lambda x: snp.tanh(x) * 2.0)
>>> print(spmd.make_jaxpr(f)(snp.ones(3)))   # doctest: +SKIP

The package root is lazy (PEP 562): Python runs this file before any submodule
(``import spmd.compiler`` runs it too), so it imports nothing of the layers and
only registers the installer of the compiler's extension points
(:func:`spmd._install.install_extensions`) with the compiler.  Each public name
is imported on first access (``spmd.jit``, ``from spmd import shard_map``), after
the installer has run, and then kept in this module.  See docs/architecture.md,
"Loading lazily".
"""

import importlib as _importlib
import time as _time

# A base module: the Config object, not the module, is ``spmd.config`` (importing the
# module first keeps the import system from binding the module over it later).
from spmd import config as _config_module  # noqa: F401
from spmd.config import config  # noqa: F401  (spmd.config)
from spmd.compiler import extensions as _extensions

__version__ = "0.1.0"

# Every public name: (module, attribute), or (module, None) for a module itself.
_PUBLIC: dict = {
    # base modules
    "config": ("spmd.config", "config"), "disable_jit": ("spmd.config", "disable_jit"),
    "default_matmul_precision": ("spmd.config", "default_matmul_precision"),
    "errors": ("spmd.errors", None), "tree": ("spmd.tree", None),
    "tree_util": ("spmd.tree_util", None),
    # the compiler
    "compiler": ("spmd.compiler", None),
    "Array": ("spmd.compiler.core.array", "Array"),
    "ShapedArray": ("spmd.compiler.core.avals", "ShapedArray"),
    "ShapeDtypeStruct": ("spmd.compiler.core.avals", "ShapeDtypeStruct"),
    "eval_shape": ("spmd.compiler.core.jit", "eval_shape"),
    "make_jaxpr": ("spmd.shard.call.jit", "make_jaxpr"),
    "custom_jvp": ("spmd.compiler.transforms.custom", "custom_jvp"),
    "custom_vjp": ("spmd.compiler.transforms.custom", "custom_vjp"),
    "checkpoint": ("spmd.compiler.transforms.remat", "checkpoint"),
    "checkpoint_name": ("spmd.compiler.transforms.remat", "checkpoint_name"),
    "checkpoint_policies": ("spmd.compiler.transforms.remat", "checkpoint_policies"),
    "remat": ("spmd.compiler.transforms.remat", "remat"),
    # launch, mesh, collectives
    "launch": ("spmd.launch", None), "mesh": ("spmd.mesh", None),
    "collectives": ("spmd.collectives", None),
    **{n: ("spmd.mesh", n) for n in (
        "Device", "Mesh", "device_count", "devices", "local_device_count", "local_devices",
        "make_mesh", "process_count", "process_index")},
    # the shard layer
    "shard": ("spmd.shard", None),
    "NamedSharding": ("spmd.shard.arrays.spec", "NamedSharding"),
    "P": ("spmd.shard.arrays.spec", "P"), "PartitionSpec": ("spmd.shard.arrays.spec", "PartitionSpec"),
    "shard_map": ("spmd.shard.maps.shard_map", "shard_map"),
    "smap": ("spmd.shard.maps.smap", "smap"),
    "pmap": ("spmd.shard.maps.pmap", "pmap"),
    "make_array_from_callback": ("spmd.shard.arrays.placing", "make_array_from_callback"),
    "visualize_array_sharding": ("spmd.shard.arrays.placing", "visualize_array_sharding"),
    # device_put also resolves a bare PartitionSpec against the mesh context.
    "device_put": ("spmd.shard.explicit.mesh_context", "device_put"),
    "set_mesh": ("spmd.shard.explicit.mesh_context", "set_mesh"),
    "make_array_from_process_local_data": ("spmd.shard.arrays.local_data",
                                           "make_array_from_process_local_data"),
    "process_allgather": ("spmd.shard.arrays.multiprocess", "process_allgather"),
    "jit": ("spmd.shard.partition.api", "jit"),  # plain or partitioned
    # front ends
    **{n: ("spmd.autodiff", n) for n in (
        "grad", "hessian", "jacfwd", "jacrev", "jvp", "linearize", "value_and_grad", "vjp")},
    "vmap": ("spmd.vectorize", "vmap"),
    "typeof": ("spmd.shard.explicit.types", "typeof"),
    "reshard": ("spmd.shard.explicit.types", "reshard"),  # also spmd.sharding.reshard, as in JAX
    "pure_callback": ("spmd.callback", "pure_callback"),
    "effects_barrier": ("spmd.debug", "effects_barrier"),
    "linear_transpose": ("spmd.linear_util", "linear_transpose"),
    **{n: (f"spmd.{n}", None) for n in (
        "numpy", "lax", "nn", "random", "scipy", "sharding", "distributed", "debug",
        "experimental",
        "autodiff", "vectorize", "linear_util", "ad_checkpoint", "custom_derivatives",
        "test_util")},
}
# `from spmd import *` gives what it gave when this file imported everything eagerly.
__all__ = sorted(_PUBLIC)
# Reachable as attributes too, but not star-imported (this file never imported them).
_PUBLIC.update({n: (f"spmd.{n}", None) for n in ("optim", "checkpointing", "testing", "parallel",
                                                  "dtypes", "profiler")})
# JAX's first-hour names (issue 58): attributes and `from spmd import name`, kept out of
# `__all__` so that the star import stays what it was.
_PUBLIC.update({n: ("spmd.transfer", n) for n in (
    "block_until_ready", "device_get", "make_array_from_single_device_arrays")})
_PUBLIC.update({n: ("spmd.compilation", n) for n in (
    "clear_caches", "default_backend", "named_scope")})
_PUBLIC.update({n: (f"spmd.{n}", None) for n in ("transfer", "compilation")})
_PUBLIC["losses"] = ("spmd.optim.losses", None)


def _run_installer() -> None:
    """Fill the compiler's extension points and install the array methods (once)."""
    from spmd._install import install_extensions

    install_extensions()


# The compiler holds the installer, without importing anything above it: the shard
# layer runs it when it finishes loading, so no import path reaches a usable shard
# layer with the points at their defaults (spmd/compiler/extensions.py).
_extensions.register_installer(_run_installer, by="spmd")


def __getattr__(name: str):
    """Import a public name on first access (PEP 562) and keep it here."""
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'spmd' has no attribute {name!r}") from None
    for attempt in range(_DEADLOCK_RETRIES):
        try:
            if attr is not None or not module.startswith(_LOWER_LAYERS):
                # The shard layer first, and whole (spmd/_install.py, "Threads").
                _importlib.import_module("spmd.shard")
            value = _importlib.import_module(module)
            if attr is not None:
                # Before a name is handed out (`spmd.Array` has its operators).  A
                # module needs no call: a front end runs the installer as it loads, and
                # the layers' modules are what `from spmd import tree_util` in a lower
                # layer asks for.
                from spmd._install import install_and_wait

                install_and_wait(f"spmd.{name}")
                value = getattr(value, attr)
            break
        except _deadlock_error() as e:
            # Threads making their first spmd imports at once can close a cycle of
            # module locks (the package loads lazily); Python breaks it by failing this
            # import, which is undone.  Try again once the other thread has loaded.
            if attempt == _DEADLOCK_RETRIES - 1:
                raise ImportError(f"spmd.{name}: other threads kept importing spmd "
                                  "meanwhile; import spmd first in one thread") from e
            _time.sleep(0.01)
    globals()[name] = value
    return value


_DEADLOCK_RETRIES = 200
# Modules that lower layers import from the root (`from spmd import tree_util`): they
# load alone, without the shard layer.
_LOWER_LAYERS = ("spmd.config", "spmd.errors", "spmd.tree", "spmd.compiler", "spmd.launch",
                 "spmd.mesh", "spmd.collectives")


def _deadlock_error() -> type:
    from spmd._install import _DEADLOCK

    return _DEADLOCK


def __dir__() -> list:
    return sorted(set(globals()) | set(_PUBLIC))
