"""Control flow as plain Python on concrete values, for ``spmd.disable_jit()``.

Under ``disable_jit`` (and outside any transformation) ``cond``, ``switch``,
``while_loop``, ``fori_loop`` and ``scan`` run their functions directly, once per
taken branch or iteration, so a ``print`` in a body shows concrete values, as
in JAX.
"""

from __future__ import annotations

from spmd import tree_util
from spmd.config import config
from spmd.compiler.ops.control_cond import branch_index
from spmd.compiler.core.trace import is_eager
from spmd.numpy._shape import stack


def active() -> bool:
    """Whether control flow runs as Python now."""
    return config.disable_jit and is_eager()


def cond(pred, true_fun, false_fun, *operands):
    return (true_fun if bool(pred) else false_fun)(*operands)


def switch(index, branches, *operands):
    return branches[branch_index(index, len(branches))](*operands)


def while_loop(cond_fun, body_fun, init_val):
    val = init_val
    while bool(cond_fun(val)):
        val = body_fun(val)
    return val


def scan(f, init, xs, length, reverse):
    leaves, tree = tree_util.tree_flatten(xs)
    n = int(length) if length is not None else len(leaves[0])
    carry, ys = init, []
    for k in (reversed(range(n)) if reverse else range(n)):
        x = tree_util.tree_unflatten(tree, [leaf[k] for leaf in leaves])
        carry, y = f(carry, x)
        ys.append(y)
    if reverse:
        ys.reverse()
    if not ys:
        raise ValueError("scan under disable_jit: a scan of length 0 has no outputs to stack")
    return carry, tree_util.tree_map(lambda *y: stack(y), *ys)
