"""``spmd.tree_util``: JAX's pytree API (None is an empty node, not a leaf)."""

import collections
import dataclasses

import numpy as np
import pytest

from spmd import tree_util as tu


TREE = {"b": [1, (2, None)], "a": 3, "c": None}


def test_flatten_unflatten_roundtrip():
    leaves, treedef = tu.tree_flatten(TREE)
    assert leaves == [3, 1, 2]  # dict keys in sorted order, as in JAX
    assert tu.tree_unflatten(treedef, leaves) == TREE
    assert tu.tree_unflatten(treedef, [30, 10, 20]) == {"b": [10, (20, None)], "a": 30,
                                                        "c": None}
    assert treedef.num_leaves == 3


def test_none_is_an_empty_node():
    assert tu.tree_leaves(None) == []
    assert tu.tree_leaves([None, 1, (None,)]) == [1]
    leaves, treedef = tu.tree_flatten(None)
    assert leaves == [] and tu.tree_unflatten(treedef, []) is None
    assert tu.tree_map(lambda x: x * 10, [None, 1]) == [None, 10]
    assert not tu.treedef_is_leaf(tu.tree_structure(None))


def test_leaves_and_structure():
    assert tu.tree_leaves(TREE) == [3, 1, 2]
    assert tu.tree_structure(TREE) == tu.tree_structure({"a": 0, "b": [0, (0, None)],
                                                         "c": None})
    assert tu.tree_structure([1, 2]) != tu.tree_structure((1, 2))
    assert tu.tree_structure([1, None]) != tu.tree_structure([1, 2])
    assert tu.treedef_is_leaf(tu.tree_structure(1))
    assert tu.tree_leaves(np.ones(3))[0].shape == (3,)  # arrays are leaves


def test_treedefs_are_hashable_cache_keys():
    a = tu.tree_structure({"x": [1, 2], "y": None})
    b = tu.tree_structure({"y": None, "x": [5, 6]})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, tu.tree_structure([1, 2])}) == 2


def test_tree_map_one_and_several_trees():
    assert tu.tree_map(lambda x: x + 1, TREE) == {"b": [2, (3, None)], "a": 4, "c": None}
    assert tu.tree_map(lambda x, y: x * y, [1, (2, 3)], [4, (5, 6)]) == [4, (10, 18)]
    with pytest.raises((ValueError, TypeError)):
        tu.tree_map(lambda x, y: x, [1, 2], [1, 2, 3])


def test_tree_map_is_leaf():
    tree = [(1, 2), (3, 4)]
    assert tu.tree_map(lambda t: sum(t), tree, is_leaf=lambda x: isinstance(x, tuple)) == [3, 7]
    leaves, _ = tu.tree_flatten(tree, is_leaf=lambda x: isinstance(x, tuple))
    assert leaves == [(1, 2), (3, 4)]


def test_paths():
    pairs, _ = tu.tree_flatten_with_path({"a": [10, 20], "b": 30})
    assert [(tuple(p), v) for p, v in pairs] == [
        ((tu.DictKey("a"), tu.SequenceKey(0)), 10), ((tu.DictKey("a"), tu.SequenceKey(1)), 20),
        ((tu.DictKey("b"),), 30)]
    assert tu.keystr(pairs[1][0]) == "['a'][1]"
    out = tu.tree_map_with_path(lambda p, x: (tu.keystr(p), x), {"a": [1]})
    assert out == {"a": [("['a'][0]", 1)]}


def test_tree_reduce_and_children():
    assert tu.tree_reduce(lambda a, b: a + b, [1, (2, 3)]) == 6
    assert tu.tree_reduce(lambda a, b: a + b, [], 7) == 7
    children = tu.treedef_children(tu.tree_structure([1, (2, 3)]))
    assert len(children) == 2 and children[1].num_leaves == 2
    assert tu.all_leaves([1, 2.0, np.ones(2)])
    assert not tu.all_leaves([1, (2,)])


def test_namedtuple_and_ordered_dict():
    Point = collections.namedtuple("Point", "x y")
    leaves, treedef = tu.tree_flatten(Point(1, [2, 3]))
    assert leaves == [1, 2, 3]
    assert tu.tree_unflatten(treedef, [4, 5, 6]) == Point(4, [5, 6])
    od = collections.OrderedDict([("z", 1), ("a", 2)])
    assert tu.tree_leaves(od) == [1, 2]  # OrderedDict keeps its order


# ------------------------------------------------------------- registration

class Pair:
    def __init__(self, first, second, tag="t"):
        self.first, self.second, self.tag = first, second, tag

    def __eq__(self, other):
        return (type(other) is Pair and (self.first, self.second, self.tag)
                == (other.first, other.second, other.tag))


tu.register_pytree_node(Pair, lambda p: ((p.first, p.second), p.tag),
                        lambda tag, children: Pair(*children, tag=tag))


def test_register_pytree_node():
    p = Pair(1, [2, 3], tag="x")
    leaves, treedef = tu.tree_flatten(p)
    assert leaves == [1, 2, 3]
    assert tu.tree_unflatten(treedef, [4, 5, 6]) == Pair(4, [5, 6], tag="x")
    assert tu.tree_map(lambda v: -v, p) == Pair(-1, [-2, -3], tag="x")
    # the auxiliary data is part of the structure
    assert tu.tree_structure(Pair(1, 2, "x")) != tu.tree_structure(Pair(1, 2, "y"))


def test_unregistered_objects_are_leaves():
    class Opaque:
        pass

    o = Opaque()
    assert tu.tree_leaves([o, 1]) == [o, 1]


@tu.register_dataclass
@dataclasses.dataclass
class Params:
    w: np.ndarray
    b: np.ndarray
    name: str = dataclasses.field(default="layer", metadata={"static": True})


def test_register_dataclass_decorator():
    p = Params(np.ones(2), np.zeros(2), name="l1")
    leaves, treedef = tu.tree_flatten(p)
    assert len(leaves) == 2 and leaves[0] is p.w  # data fields in order; name is static
    q = tu.tree_unflatten(treedef, [1, 2])
    assert isinstance(q, Params) and (q.w, q.b, q.name) == (1, 2, "l1")
    assert tu.tree_structure(p) != tu.tree_structure(Params(p.w, p.b, name="l2"))
    doubled = tu.tree_map(lambda x: x * 2, p)
    np.testing.assert_array_equal(doubled.w, [2, 2])
    assert doubled.name == "l1"


def test_register_dataclass_with_explicit_fields():
    @dataclasses.dataclass(frozen=True)
    class Opt:
        lr: float
        step: int
        kind: str

    tu.register_dataclass(Opt, data_fields=["lr", "step"], meta_fields=["kind"])
    leaves, treedef = tu.tree_flatten(Opt(0.1, 3, "sgd"))
    assert leaves == [0.1, 3]
    assert tu.tree_unflatten(treedef, [0.2, 4]) == Opt(0.2, 4, "sgd")  # frozen works too


def test_register_dataclass_with_none_field():
    p = Params(np.ones(1), None)
    assert len(tu.tree_leaves(p)) == 1
    assert tu.tree_map(lambda x: x + 1, p).b is None


def test_register_dataclass_rejects_plain_class_without_fields():
    class NotADataclass:
        pass

    with pytest.raises(TypeError, match="not a dataclass"):
        tu.register_dataclass(NotADataclass)


def test_partial_is_a_pytree():
    def add(x, y, scale=1):
        return (x + y) * scale

    p = tu.Partial(add, 1, scale=2)
    assert p(3) == 8
    leaves, treedef = tu.tree_flatten(p)
    assert sorted(leaves) == [1, 2]
    q = tu.tree_map(lambda v: v * 10, p)
    assert q(3) == (10 + 3) * 20


# ------------------------------------------------- key paths and spmd.tree

def test_keystr_names_namedtuple_and_dataclass_fields():
    State = collections.namedtuple("State", "count mu")
    pairs = tu.tree_leaves_with_path({"opt": [State(0, {"w": 1})]})
    assert [tu.keystr(p) for p, _ in pairs] == ["['opt'][0].count", "['opt'][0].mu['w']"]
    assert pairs[0][0][-1] == tu.GetAttrKey("count") and pairs[0][0][-1].name == "count"
    assert tu.keystr(pairs[1][0], simple=True, separator="/") == "opt/0/mu/w"

    @tu.register_dataclass
    @dataclasses.dataclass
    class Layer:
        w: int
        b: int
    assert [tu.keystr(p) for p, _ in tu.tree_leaves_with_path([Layer(1, 2)])] == \
        ["[0].w", "[0].b"]


def test_custom_nodes_get_flattened_index_keys():
    pairs = tu.tree_leaves_with_path(Pair(1, (2, 3)))
    assert [tu.keystr(p) for p, _ in pairs] == \
        ["[<flat index 0>]", "[<flat index 1>][0]", "[<flat index 1>][1]"]
    assert pairs[0][0] == (tu.FlattenedIndexKey(0),)


def test_tree_all():
    assert tu.tree_all([True, (1, None), {"a": np.True_}])
    assert not tu.tree_all({"a": True, "b": [1, 0]})
    assert tu.tree_all(None) and tu.tree_all([])
    assert tu.tree_all([(1, 0)], is_leaf=lambda x: isinstance(x, tuple))


def test_map_with_path_over_several_trees():
    out = tu.tree_map_with_path(lambda p, x, y: (tu.keystr(p), x + y),
                                {"a": [1, 2]}, {"a": [10, 20]})
    assert out == {"a": [("['a'][0]", 11), ("['a'][1]", 22)]}
    with pytest.raises(ValueError):
        tu.tree_map_with_path(lambda p, x, y: x, {"a": [1, 2]}, {"a": [1]})


def test_spmd_tree_module_mirrors_jax_tree():
    import spmd

    t = {"b": [1, (2, None)], "a": 3}
    assert spmd.tree.map(lambda x: x * 2, t) == {"b": [2, (4, None)], "a": 6}
    assert spmd.tree.leaves(t) == [3, 1, 2]
    leaves, treedef = spmd.tree.flatten(t)
    assert spmd.tree.unflatten(treedef, leaves) == t
    assert spmd.tree.structure(t) == treedef
    assert spmd.tree.all(t) and not spmd.tree.all([1, 0])
    assert spmd.tree.reduce(lambda a, b: a + b, t) == 6
    assert spmd.tree.reduce(lambda a, b: a + b, [], 5) == 5
    assert [tu.keystr(p) for p, _ in spmd.tree.leaves_with_path(t)] == \
        ["['a']", "['b'][0]", "['b'][1][0]"]
    assert spmd.tree.map_with_path(lambda p, x: len(p), t) == {"b": [2, (3, None)], "a": 1}
    assert spmd.tree.transpose(spmd.tree.structure([0, 0]), spmd.tree.structure((0, 0)),
                               [(1, 2), (3, 4)]) == ([1, 3], [2, 4])


def test_register_pytree_with_keys():
    class Box:
        def __init__(self, lo, hi):
            self.lo, self.hi = lo, hi

    tu.register_pytree_with_keys(
        Box, lambda b: (((tu.GetAttrKey("lo"), b.lo), (tu.GetAttrKey("hi"), b.hi)), None),
        lambda aux, ch: Box(*ch))
    pairs = tu.tree_leaves_with_path({"b": Box(1, [2])})
    assert [tu.keystr(p) for p, _ in pairs] == ["['b'].lo", "['b'].hi[0]"]
    out = tu.tree_map(lambda v: v * 10, Box(1, 2))
    assert (out.lo, out.hi) == (10, 20)

    class Bad:
        pass

    tu.register_pytree_with_keys(Bad, lambda b: ((("k", 1),), None), lambda aux, ch: Bad())
    with pytest.raises(TypeError, match="GetAttrKey"):
        tu.tree_leaves(Bad())
