"""``spmd.debug``: printing values, and calling host functions, from inside transformed
code (``jax.debug``).

``spmd.debug.print("x = {}", x)`` prints when the program runs, not when it is
traced: eagerly at once, under ``jit`` each time the compiled program runs, in
program order (the ``debug_print`` primitive is effectful: dead-code
elimination and CSE keep it, also inside ``jit``/``shard_map``/loop bodies).
Under ``vmap`` it prints once per batch element, and inside a ``shard_map`` once
per device, in device order (row-major over the mesh; on a job of several
processes, each process prints its own devices).  Under ``grad`` it prints the
primal values.  ``visualize_array_sharding`` draws where an Array's blocks are.
"""

from __future__ import annotations

import builtins
import sys

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd import tree_util
from spmd.compiler.core.array import Array
from spmd.compiler.core.array_module import to_host
from spmd.compiler.transforms.batching import move_to_front
from spmd.compiler.core.primitives import Primitive
from spmd.compiler.core.trace import Tracer, axes_in_scope, bind
from spmd.errors import ArgumentError
from spmd.shard.arrays.placing import visualize_array_sharding as viz
from spmd.shard.explicit import rules as explicit_rules
from spmd.shard.partition import registry

debug_print_p = Primitive("debug_print", traits=(), multiple_results=True, effectful=True)
debug_print_p.def_abstract_eval(lambda *avals, **params: [])
debug_print_p.def_vma(lambda *avals, **params: [])


def _is_operand(x) -> bool:
    return isinstance(x, (Tracer, Array, np.ndarray, np.generic))


def print(fmt: str, *args, ordered: bool = False, **kwargs) -> None:  # noqa: A001
    """Print ``fmt.format(*args, **kwargs)`` with the arrays' values when the code runs.

    Prints always come in program order (``ordered`` is accepted for JAX's sake).

    >>> spmd.debug.print("step {i}: loss {l:.3f}", i=step, l=loss)   # inside jit
    """
    if not isinstance(fmt, str):
        raise ArgumentError(f"spmd.debug.print: fmt must be a format string, got "
                            f"{type(fmt).__name__}")
    leaves, tree = tree_util.tree_flatten((args, kwargs))
    operands = [x for x in leaves if _is_operand(x)]
    # Other leaves (Python numbers, strings) are formatted as they are.
    statics = tuple((i, x) for i, x in enumerate(leaves) if not _is_operand(x))
    # The named axes in scope (of enclosing shard_maps and named vmaps): the print
    # belongs to their levels, and runs per device even when no operand varies.
    axes = tuple(dict.fromkeys(axes_in_scope()))
    bind(debug_print_p, *operands, fmt=fmt, tree=tree, statics=statics, levels=(),
         axes=axes)


@debug_print_p.def_impl
def _impl(xp, *operands, fmt, tree, statics, levels, axes):
    _print_levels([np.asarray(to_host(x)) for x in operands], fmt, tree, statics,
                  list(levels))
    return []


def _print_levels(values, fmt, tree, statics, levels):
    """One print per element of each batch level (the outermost level's axis is
    the leading axis of the operands it batches)."""
    if not levels:
        leaves = list(values)
        for i, x in statics:
            leaves.insert(i, x)
        args, kwargs = tree_util.tree_unflatten(tree, leaves)
        builtins.print(fmt.format(*args, **kwargs), file=sys.stdout, flush=True)
        return
    size, batched = levels[-1]
    for k in range(size):
        sub = [v[k] if b else v for v, b in zip(values, batched)]
        _print_levels(sub, fmt, tree, statics, levels[:-1])


@debug_print_p.def_jvp
def _jvp(primals, tangents, **params):
    bind(debug_print_p, *primals, **params)
    return [], []


def _batch(args, dims, *, fmt, tree, statics, levels, axes, _axis_data):
    names, size = _axis_data
    args = [a if d is None else move_to_front(a, d) for a, d in zip(args, dims)]
    level = (int(size), tuple(d is not None for d in dims))
    # This level's axes are done with; the enclosing levels print each of its prints.
    rest = tuple(a for a in axes if a not in getattr(names, "names", ()))
    bind(debug_print_p, *args, fmt=fmt, tree=tree, statics=statics, levels=levels + (level,),
         axes=rest)
    return [], []


debug_print_p.def_batch(_batch)
# Printed per element (per device in a shard_map) even when nothing is batched:
# ``axes`` ties the print to the levels of those axes, as for axis_index.
debug_print_p.rules.batch_needs_axis = True
debug_print_p.rules.batch_always = True


def callback(fn, *args, ordered: bool = False, **kwargs) -> None:
    """Call ``fn(*args, **kwargs)`` on host (numpy) values when the code runs
    (``jax.debug.callback``): every time, in program order, per element under ``vmap``
    and per device inside a ``shard_map``; under ``grad`` with the primal values.  Its
    return value is ignored.

    >>> spmd.debug.callback(lambda l: losses.append(float(l)), loss)   # inside jit
    """
    from spmd.host.callback import io_callback

    def call(*a, **k):
        fn(*a, **k)

    call.__name__ = getattr(fn, "__name__", "callback")
    io_callback(call, None, *args, ordered=ordered, **kwargs)


def effects_barrier() -> None:
    """Wait until every effect of the programs run so far has happened
    (``jax.effects_barrier``).  spmd runs a program's effects (``spmd.debug.print``,
    callbacks) while it runs, in program order, before its call returns: there is
    nothing left to wait for when this is called, so it returns at once."""
    return None


def visualize_array_sharding(x, *, use_color: bool = False) -> str:
    """Draw which devices hold which block of ``x`` (``jax.debug.visualize_array_sharding``).

    >>> spmd.debug.visualize_array_sharding(spmd.device_put(x, NamedSharding(mesh, P("i"))))
    """
    return viz(x, use_color=use_color)


def _register_partition_decision():
    # On explicit axes: a print has no results to type, and reads whole values.
    registry.register(debug_print_p, registry.Replicate(
        "a print shows whole values: under jit with shardings the value is gathered and "
        "printed once", explicit=explicit_rules.untyped))


_register_partition_decision()
