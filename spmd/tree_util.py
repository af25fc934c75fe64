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
    """Return ``([(path, leaf), ...], treedef)``; a path is a tuple of keys
    (:class:`DictKey`, :class:`SequenceKey`, :class:`GetAttrKey`,
    :class:`FlattenedIndexKey`), as in JAX.

    >>> [keystr(p) for p, _ in tree_flatten_with_path({"a": [1, 2]})[0]]
    ["['a'][0]", "['a'][1]"]
    """
    accessors, leaves, treedef = optree.tree_flatten_with_accessor(
        tree, is_leaf=is_leaf, none_is_leaf=False, namespace=NAMESPACE)
    paths = [tuple(_key_of(e) for e in acc) for acc in accessors]
    return list(zip(paths, leaves)), treedef


def tree_leaves_with_path(tree, is_leaf: Callable | None = None) -> list:
    """``[(path, leaf), ...]`` (the first half of :func:`tree_flatten_with_path`)."""
    return tree_flatten_with_path(tree, is_leaf)[0]


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
    """``f(path, leaf, *others)`` at each leaf of ``tree``; ``rest`` must have
    ``tree``'s structure (or one that ``tree`` is a prefix of).

    >>> tree_map_with_path(lambda p, x: keystr(p), {"a": [0]})
    {'a': ["['a'][0]"]}
    """
    pairs, treedef = tree_flatten_with_path(tree, is_leaf)
    others = [treedef.flatten_up_to(r) for r in rest]
    return treedef.unflatten([f(p, x, *xs) for (p, x), *xs in zip(pairs, *others)])


def tree_all(tree, *, is_leaf: Callable | None = None) -> bool:
    """Whether every leaf of ``tree`` is truthy (``True`` for an empty tree).

    >>> tree_all([True, (1, None)])
    True
    """
    return all(tree_leaves(tree, is_leaf=is_leaf))


_NO_INIT = object()


def tree_reduce(f: Callable, tree, initializer=_NO_INIT, *, is_leaf: Callable | None = None):
    """Fold ``f`` over the leaves, left to right (from ``initializer`` when given)."""
    leaves = tree_leaves(tree, is_leaf=is_leaf)
    if initializer is _NO_INIT:
        return functools.reduce(f, leaves)
    return functools.reduce(f, leaves, initializer)


def tree_transpose(outer_treedef, inner_treedef, pytree_to_transpose):
    """Turn an outer tree of inner trees into an inner tree of outer trees.

    >>> tree_transpose(tree_structure([0, 0]), tree_structure((0, 0)), [(1, 2), (3, 4)])
    ([1, 3], [2, 4])
    """
    return optree.tree_transpose(outer_treedef, inner_treedef, pytree_to_transpose)


def treedef_children(treedef) -> list:
    return treedef.children()


def treedef_is_leaf(treedef) -> bool:
    return treedef.is_leaf()


@dataclasses.dataclass(frozen=True)
class SequenceKey:
    """Path entry of a list or tuple element: ``[idx]``."""
    idx: int

    def __str__(self):
        return f"[{self.idx!r}]"


@dataclasses.dataclass(frozen=True)
class DictKey:
    """Path entry of a dict value: ``[key]``."""
    key: Any

    def __str__(self):
        return f"[{self.key!r}]"


@dataclasses.dataclass(frozen=True)
class GetAttrKey:
    """Path entry of an attribute (namedtuple or dataclass field): ``.name``."""
    name: str

    def __str__(self):
        return f".{self.name}"


@dataclasses.dataclass(frozen=True)
class FlattenedIndexKey:
    """Path entry of the ``key``-th child of a custom node without named children."""
    key: int

    def __str__(self):
        return f"[<flat index {self.key}>]"


def _key_of(entry):
    """The JAX-style key of one optree accessor entry."""
    if isinstance(entry, (optree.NamedTupleEntry, optree.StructSequenceEntry)):
        return GetAttrKey(entry.field)
    if isinstance(entry, optree.GetAttrEntry):  # dataclass fields too
        return GetAttrKey(entry.name)
    if isinstance(entry, optree.MappingEntry):
        return DictKey(entry.entry)
    if isinstance(entry, optree.SequenceEntry):
        return SequenceKey(entry.entry)
    if isinstance(entry.entry, _KEY_TYPES):  # a key given by register_pytree_with_keys
        return entry.entry
    return FlattenedIndexKey(entry.entry)


_KEY_TYPES = (SequenceKey, DictKey, GetAttrKey, FlattenedIndexKey)


def _simple(k) -> str:
    for attr in ("idx", "key", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def keystr(path: Sequence[Any], *, simple: bool = False, separator: str = "") -> str:
    """Format a key path: ``['params'][0].name``; with ``simple=True`` the bare keys
    joined by ``separator`` (``params/0/name`` with ``separator="/"``).

    >>> keystr((DictKey("w"), SequenceKey(0), GetAttrKey("mu")))
    "['w'][0].mu"
    """
    if simple:
        return separator.join(_simple(k) for k in path)
    return separator.join(str(k) if isinstance(
        k, (SequenceKey, DictKey, GetAttrKey, FlattenedIndexKey)) else f"[{k!r}]" for k in path)


def register_pytree_node(cls: type, flatten_func: Callable, unflatten_func: Callable) -> type:
    """Register ``cls``: ``flatten_func(x) -> (children, aux)``,
    ``unflatten_func(aux, children) -> x`` (JAX's convention)."""
    optree.register_pytree_node(cls, flatten_func, unflatten_func, namespace=NAMESPACE)
    return cls


def register_pytree_with_keys(nodetype: type, flatten_with_keys: Callable,
                              unflatten_func: Callable, flatten_func: Callable | None = None):
    """Register ``nodetype`` with named children: ``flatten_with_keys(x) ->
    (((key, child), ...), aux)``, keys being :class:`GetAttrKey`, :class:`DictKey`,
    :class:`SequenceKey` or :class:`FlattenedIndexKey` (as in JAX); key paths
    (``tree_flatten_with_path``, ``keystr``) then show them.

    >>> register_pytree_with_keys(Point, lambda p: (((GetAttrKey("x"), p.x),), None),
    ...                           lambda aux, ch: Point(*ch))  # doctest: +SKIP
    """
    def flatten(x):
        pairs, aux = flatten_with_keys(x)
        pairs = list(pairs)
        for k, _ in pairs:
            if not isinstance(k, _KEY_TYPES):
                raise TypeError(f"register_pytree_with_keys({nodetype.__name__}): a key must be "
                                "GetAttrKey, DictKey, SequenceKey or FlattenedIndexKey, got "
                                f"{k!r}")
        return [c for _, c in pairs], aux, tuple(k for k, _ in pairs)

    optree.register_pytree_node(nodetype, flatten, unflatten_func, namespace=NAMESPACE)
    return nodetype


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
