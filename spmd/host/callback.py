"""``spmd.pure_callback``: call a Python function on host values from inside
transformed code (``jax.pure_callback``); ``io_callback`` (``spmd.experimental``) and
``spmd.debug.callback`` are its effectful siblings, never dropped or merged and run in
program order.

The callback receives numpy arrays and must return arrays of the shapes and dtypes
given in ``result_shape_dtypes`` (checked on every call: a mismatch is an error, never
a silently reshaped value).  It is *pure*: a call whose results are unused may be
dropped, and two identical calls merged, so it must not have side effects that
matter.  Under ``jit`` it runs each time the compiled program runs.

- ``vmap``: ``vmap_method`` says how a batched call runs: ``"sequential"`` (one call
  per batch element), ``"expand_dims"`` (one call; unbatched arguments get a size-1
  leading axis) or ``"broadcast_all"`` (one call; unbatched arguments broadcast to the
  batch).  Left out, the call runs per element, as ``"sequential"`` (JAX raises
  there unless inside a ``shard_map``, where each device calls it on its blocks;
  a ``shard_map`` body over simulated devices is one batch of them here).
- ``grad``/``jvp``: not differentiable (as in JAX): wrap the function in
  ``spmd.custom_jvp`` or ``custom_vjp`` to give it a derivative.
- Placed values: under ``jit`` with shardings (or on explicit axes) the callback sees
  whole values, gathered first; inside a ``shard_map`` body each device's blocks.

>>> def host_fn(x):
...     return np.sinc(x)
>>> y = spmd.jit(lambda x: spmd.pure_callback(host_fn, spmd.ShapeDtypeStruct(x.shape, x.dtype), x))(x)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.compiler.core import dtypes
from spmd.compiler.core.array_module import to_host
from spmd.compiler.core.avals import ShapedArray, ShapeDtypeStruct
from spmd.compiler.transforms.batching import move_to_front
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import bind
from spmd.errors import ArgumentError, SpmdError
from spmd.shard.explicit import rules as explicit_rules
from spmd.shard.partition import registry

VMAP_METHODS = (None, "sequential", "expand_dims", "broadcast_all")


class CallbackError(SpmdError, TypeError):
    """A callback returned values that are not what ``result_shape_dtypes`` says."""


pure_callback_p = Primitive("pure_callback", traits=(), multiple_results=True)
# Effectful: never dropped or merged (a host side effect, a value read from outside).
io_callback_p = Primitive("io_callback", traits=(), multiple_results=True, effectful=True)


class _Fn:
    """The callback with its pytree structures (hashable by identity: a program's
    parameter)."""

    __slots__ = ("fn", "in_tree", "out_tree", "name", "where")

    def __init__(self, fn, in_tree, out_tree, where):
        self.fn, self.in_tree, self.out_tree = fn, in_tree, out_tree
        self.name = getattr(fn, "__name__", "callback")
        self.where = where  # pure_callback or io_callback, for the errors

    def __repr__(self):
        return self.name


def pure_callback(callback: Callable, result_shape_dtypes: Any, *args,
                  sharding=None, vmap_method: str | None = None, **kwargs):
    """``callback(*args, **kwargs)`` on host (numpy) values, as a step of the program;
    its results have the shapes and dtypes of ``result_shape_dtypes`` (a pytree of
    ``ShapeDtypeStruct`` s or arrays).  ``sharding`` is accepted for JAX's sake (the
    results are whole values).

    >>> spmd.pure_callback(np.sort, spmd.ShapeDtypeStruct((3,), np.float32), x)  # doctest: +SKIP
    """
    if vmap_method not in VMAP_METHODS:
        raise ArgumentError(f"pure_callback: vmap_method={vmap_method!r} is not one of "
                            f"{VMAP_METHODS}")
    return _bind(pure_callback_p, "pure_callback", callback, result_shape_dtypes, args,
                 kwargs, vmap_method)


def io_callback(callback: Callable, result_shape_dtypes: Any, *args, sharding=None,
                ordered: bool = False, **kwargs):
    """``jax.experimental.io_callback``: ``callback(*args, **kwargs)`` on host values,
    with side effects: it runs every time the program reaches it, in program order
    (``ordered`` is accepted: spmd's effects are always in order), never dropped or
    merged.  Under ``vmap`` it runs once per element.  ``result_shape_dtypes`` may be
    None (no results).

    >>> io_callback(log.append, None, loss)  # doctest: +SKIP
    """
    return _bind(io_callback_p, "io_callback", callback, result_shape_dtypes, args, kwargs,
                 "sequential")


def _bind(prim, where, callback, result_shape_dtypes, args, kwargs, vmap_method):
    if not callable(callback):
        raise ArgumentError(f"{where}: callback must be callable, got "
                            f"{type(callback).__name__}")
    leaves, in_tree = tree_util.tree_flatten((args, kwargs))
    out_leaves, out_tree = tree_util.tree_flatten(result_shape_dtypes)
    avals = []
    for k, r in enumerate(out_leaves):
        shape, dtype = getattr(r, "shape", None), getattr(r, "dtype", None)
        if shape is None or dtype is None:
            raise ArgumentError(f"{where}: result_shape_dtypes leaf {k} is a "
                                f"{type(r).__name__}; give ShapeDtypeStruct(shape, dtype) "
                                "(or an array) for each result")
        avals.append(ShapeDtypeStruct(shape, dtype).to_aval())
    outs = bind(prim, *leaves, fn=_Fn(callback, in_tree, out_tree, where),
                result_avals=tuple(avals), vmap_method=vmap_method, levels=())
    return tree_util.tree_unflatten(out_tree, list(outs))


def _call(fn, values, result_avals):
    args, kwargs = tree_util.tree_unflatten(fn.in_tree, list(values))
    got = tree_util.tree_leaves(fn.fn(*args, **kwargs))
    if len(got) != len(result_avals):
        raise CallbackError(f"{fn.where}: {fn.name} returned {len(got)} arrays, but "
                            f"result_shape_dtypes gives {len(result_avals)}")
    outs = []
    for k, (g, a) in enumerate(zip(got, result_avals)):
        g = np.asarray(g)
        if g.dtype != a.dtype and dtypes.canonicalize(g.dtype) == a.dtype:
            g = g.astype(a.dtype)  # (float64 asked for and made, without x64: float32)
        if g.shape != a.shape or g.dtype != a.dtype:
            raise CallbackError(
                f"{fn.where}: result {k} of {fn.name} is {g.dtype}{list(g.shape)}, but "
                f"result_shape_dtypes says {a.dtype}{list(a.shape)}; return that (e.g. "
                ".astype or reshape in the callback), or fix result_shape_dtypes")
        outs.append(g)
    return outs


def _per_levels(fn, values, result_avals, levels):
    """The results of the call batched over ``levels`` (``(size, batched flags,
    method)`` each, the outermost last: its batch axis leads).  An outer level runs
    its elements one by one; the innermost one by its method (a function that may be
    called on a whole batch may be called on one element too)."""
    if not levels:
        return _call(fn, values, result_avals)
    size, batched, method = levels[-1]
    if len(levels) == 1 and method in ("expand_dims", "broadcast_all"):
        # One call over the whole batch: the unbatched arguments expanded or broadcast.
        full = [v if b else np.asarray(v)[None] if method == "expand_dims"
                else np.broadcast_to(np.asarray(v), (size,) + np.shape(v))
                for v, b in zip(values, batched)]
        return _call(fn, full, result_avals)
    inner = [ShapedArray(a.shape[1:], a.dtype) for a in result_avals]
    per = [_per_levels(fn, [v[k] if b else v for v, b in zip(values, batched)], inner,
                       levels[:-1]) for k in range(size)]
    return [np.stack([o[j] for o in per]) for j in range(len(result_avals))]


def _impl(xp, *args, fn, result_avals, vmap_method, levels):
    from spmd.compiler.core.array_module import to_device

    outs = _per_levels(fn, [np.asarray(to_host(a)) for a in args], list(result_avals),
                       list(levels))
    return [o if xp is np else to_device(o, o.dtype) for o in outs]


def _abstract(*avals, fn, result_avals, vmap_method, levels):
    return list(result_avals)


def _vma(*avals, **params):
    # A result may differ between devices wherever an argument does.
    vma = frozenset().union(*(a.vma for a in avals))
    return [vma] * len(params["result_avals"])


def _jvp(prim):
    def jvp(primals, tangents, **params):
        if params["result_avals"]:
            raise CallbackError(f"{prim.name} is not differentiable (as in JAX): wrap the "
                                "function in spmd.custom_jvp or spmd.custom_vjp to give it "
                                "a derivative")
        bind(prim, *primals, **params)  # no results: it runs on the primal values
        return [], []
    return jvp


def _batch(prim):
    def batch(args, dims, *, fn, result_avals, vmap_method, levels):
        size = next(np.shape(a)[d] for a, d in zip(args, dims) if d is not None)
        args = [a if d is None else move_to_front(a, d) for a, d in zip(args, dims)]
        level = (int(size), tuple(d is not None for d in dims), vmap_method)
        avals = tuple(ShapedArray((size,) + a.shape, a.dtype) for a in result_avals)
        outs = bind(prim, *args, fn=fn, result_avals=avals, vmap_method=vmap_method,
                    levels=levels + (level,))
        return list(outs), [0] * len(outs)
    return batch


for _p in (pure_callback_p, io_callback_p):
    _p.def_impl(_impl)
    _p.def_abstract_eval(_abstract)
    _p.def_vma(_vma)
    _p.def_jvp(_jvp(_p))
    _p.def_batch(_batch(_p))


def _register_partition_decision():
    for p in (pure_callback_p, io_callback_p):
        registry.register(p, registry.Replicate(
            "a callback is a host function of whole values: under jit with shardings its "
            "operands are gathered, and its results are whole on every device",
            explicit=explicit_rules.untyped))


_register_partition_decision()
