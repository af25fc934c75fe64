"""``spmd.tree``: the short pytree names of ``jax.tree`` (``spmd.tree.map`` is
``spmd.tree_util.tree_map``, and so on).

>>> import spmd
>>> spmd.tree.map(lambda x: x + 1, {"a": 1, "b": (2, None)})
{'a': 2, 'b': (3, None)}
>>> spmd.tree.reduce(lambda a, b: a + b, [1, (2, 3)])
6
"""

from spmd.tree_util import (  # noqa: F401
    tree_all as all,  # noqa: A004
    tree_flatten as flatten,
    tree_flatten_with_path as flatten_with_path,
    tree_leaves as leaves,
    tree_leaves_with_path as leaves_with_path,
    tree_map as map,  # noqa: A004
    tree_map_with_path as map_with_path,
    tree_reduce as reduce,
    tree_structure as structure,
    tree_transpose as transpose,
    tree_unflatten as unflatten,
)

__all__ = ["all", "flatten", "flatten_with_path", "leaves", "leaves_with_path", "map",
           "map_with_path", "reduce", "structure", "transpose", "unflatten"]
