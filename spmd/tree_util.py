"""Pytrees (nested tuples, lists, dicts, dataclasses, None), backed by optree.

The names and semantics follow ``jax.tree_util``: ``None`` is an empty node,
not a leaf.

>>> tree_map(lambda x: x * 2, {"a": 1, "b": (2, 3)})
{'a': 2, 'b': (4, 6)}
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import optree

NAMESPACE = "spmd"

PyTreeDef = optree.PyTreeSpec


def tree_flatten(tree, is_leaf: Callable | None = None):
    """Return ``(leaves, treedef)``."""
    return optree.tree_flatten(tree, is_leaf=is_leaf, none_is_leaf=False, namespace=NAMESPACE)


def tree_flatten_with_path(tree, is_leaf: Callable | None = None):
    """Return ``([(path, leaf), ...], treedef)``; paths are tuples of keys."""
    paths, leaves, treedef = optree.tree_flatten_with_path(
        tree, is_leaf=is_leaf, none_is_leaf=False, namespace=NAMESPACE)
    return list(zip(paths, leaves)), treedef


def tree_unflatten(treedef, leaves):
    return optree.tree_unflatten(treedef, leaves)


def tree_leaves(tree, is_leaf: Callable | None = None) -> list:
    return optree.tree_leaves(tree, is_leaf=is_leaf, none_is_leaf=False, namespace=NAMESPACE)


def tree_structure(tree, is_leaf: Callable | None = None):
    return optree.tree_structure(tree, is_leaf=is_leaf, none_is_leaf=False, namespace=NAMESPACE)


def tree_map(f: Callable, tree, *rest, is_leaf: Callable | None = None):
    return optree.tree_map(f, tree, *rest, is_leaf=is_leaf, none_is_leaf=False,
                           namespace=NAMESPACE)


def tree_map_with_path(f: Callable, tree, *rest, is_leaf: Callable | None = None):
    return optree.tree_map_with_path(f, tree, *rest, is_leaf=is_leaf, none_is_leaf=False,
                                     namespace=NAMESPACE)


_NO_INIT = object()


def tree_reduce(f: Callable, tree, initializer=_NO_INIT):
    leaves = tree_leaves(tree)
    if initializer is _NO_INIT:
        return functools.reduce(f, leaves)
    return functools.reduce(f, leaves, initializer)


def treedef_children(treedef) -> list:
    return treedef.children()


def treedef_is_leaf(treedef) -> bool:
    return treedef.is_leaf()


def keystr(path: Sequence[Any]) -> str:
    """Format a key path like ``['params'][0]``."""
    out = []
    for k in path:
        out.append(f"[{k!r}]")
    return "".join(out)


def register_pytree_node(cls: type, flatten_func: Callable, unflatten_func: Callable) -> type:
    """Register ``cls``: ``flatten_func(x) -> (children, aux)``,
    ``unflatten_func(aux, children) -> x`` (JAX's convention)."""
    optree.register_pytree_node(cls, flatten_func, unflatten_func, namespace=NAMESPACE)
    return cls


def register_dataclass(cls: type | None = None, data_fields: Sequence[str] | None = None,
                       meta_fields: Sequence[str] | None = None):
    """Register a dataclass; fields in ``meta_fields`` are static (part of the treedef).

    Usable as a decorator: ``@register_dataclass`` registers every field as data
    unless declared with ``dataclasses.field(metadata={"static": True})``.
    """
    def register(cls):
        nonlocal data_fields, meta_fields
        if data_fields is None:
            if not dataclasses.is_dataclass(cls):
                raise TypeError(f"register_dataclass: {cls.__name__} is not a dataclass; "
                                "pass data_fields and meta_fields")
            fields = dataclasses.fields(cls)
            meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
            data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
        meta_fields = list(meta_fields or [])
        data = tuple(data_fields)
        meta = tuple(meta_fields)

        def flatten(x):
            return [getattr(x, n) for n in data], tuple(getattr(x, n) for n in meta), data

        def unflatten(aux, children):
            obj = object.__new__(cls)
            for n, v in zip(data, children):
                object.__setattr__(obj, n, v)
            for n, v in zip(meta, aux):
                object.__setattr__(obj, n, v)
            return obj

        optree.register_pytree_node(cls, flatten, unflatten, namespace=NAMESPACE)
        return cls

    return register if cls is None else register(cls)


def all_leaves(iterable) -> bool:
    return all(treedef_is_leaf(tree_structure(x)) for x in iterable)


class Partial:
    """``functools.partial`` that is a pytree (its bound arguments are leaves)."""

    def __init__(self, func, *args, **kwargs):
        self.func, self.args, self.keywords = func, args, kwargs

    def __call__(self, *args, **kwargs):
        return self.func(*self.args, *args, **{**self.keywords, **kwargs})


register_pytree_node(Partial, lambda p: ((p.args, p.keywords), p.func),
                     lambda func, ch: Partial(func, *ch[0], **ch[1]))


# ------------------------------------------------------------ prefix trees

class PrefixMismatch(ValueError):
    """``prefix`` is not a pytree prefix of ``tree``: at ``path`` the prefix has
    ``prefix_node`` where the tree has ``tree_node``."""

    def __init__(self, path: str, prefix_node, tree_node):
        self.path, self.prefix_node, self.tree_node = path, prefix_node, tree_node
        super().__init__(f"at {path or 'the top'} the prefix has {describe(prefix_node)} but "
                         f"the value is {describe(tree_node)}")


def describe(x) -> str:
    """A short description of a pytree node for error messages."""
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of length {len(x)}"
    if isinstance(x, dict):
        return f"a dict with keys {sorted(x)}"
    return f"a {type(x).__name__}"


def broadcast_prefix(prefix, tree, is_leaf: Callable) -> list:
    """``[(entry, path), ...]``: the entry of ``prefix`` that covers each leaf of ``tree``
    (in ``tree_leaves`` order), where ``is_leaf(entry)`` marks the prefix's leaves
    (e.g. ``in_axes`` ints, ``PartitionSpec``s).  Raises :class:`PrefixMismatch`.

    >>> broadcast_prefix((0, None), ([1, 2], 3), lambda e: e is None or isinstance(e, int))
    [(0, '[0]'), (0, '[0]'), (None, '[1]')]
    """
    out: list = []

    def walk(p, t, path):
        if is_leaf(p):
            out.extend([(p, path)] * len(tree_leaves(t)))
        elif isinstance(p, (tuple, list)) and isinstance(t, (tuple, list)) and len(p) == len(t):
            for i, (pc, tc) in enumerate(zip(p, t)):
                walk(pc, tc, f"{path}[{i}]")
        elif isinstance(p, dict) and isinstance(t, dict) and set(p) == set(t):
            for k in sorted(t):
                walk(p[k], t[k], f"{path}[{k!r}]")
        else:
            raise PrefixMismatch(path, p, t)

    walk(prefix, tree, "")
    return out
