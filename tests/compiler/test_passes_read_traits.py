"""The passes and the engine read a primitive's traits and rules, never its name.

``docs/architecture.md`` ("Primitives and their rules") says so: a new primitive gets a
pass's treatment by declaring a trait, not by being added to a list of names in the
pass.  This test reads the source of every module of ``spmd/compiler/passes`` and
``spmd/compiler/engine`` and fails on

- a ``.name`` compared (``==``, ``!=``, ``in``, ``not in``) with a registered
  primitive's name, or looked up in a literal collection of such names (directly or
  through a module-level constant);
- any such string literal (or collection) in a comparison or a membership test,
  whatever it is compared with (a name copied into a local first), except a word of
  the kernel languages' op vocabulary (``rules.kernel_op``, :data:`loops.EXPR`:
  ``"exp"``, ``"integer_pow"``) compared with something other than a name: that is
  a decision on a rule's value, whose words are spelt as the primitives' are.

Building identifiers from a name (``f"_{prim.name}_{i}"``) is fine: that is not a
decision.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil

import pytest

from spmd.compiler.core.primitives import PRIMITIVES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDERS = ("spmd/compiler/passes", "spmd/compiler/engine")


# The packages that create primitives (``import spmd`` loads its parts lazily).
_DEFINING = ("spmd.compiler", "spmd.collectives", "spmd.parallel", "spmd.shard",
             "spmd.nn", "spmd.numpy", "spmd.lax")


def _primitive_names() -> set:
    for pkg in _DEFINING:
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            importlib.import_module(info.name)
    assert len(PRIMITIVES) > 100  # (every module above was loaded)
    return set(PRIMITIVES)


def _modules():
    for folder in FOLDERS:
        for f in sorted(os.listdir(os.path.join(ROOT, folder))):
            if f.endswith(".py"):
                yield os.path.join(folder, f)


def _strings(node, constants) -> set | None:
    """The strings ``node`` holds when it is a string, a literal collection of strings
    (or a call building one: ``frozenset((...))``, ``(...) + X``), or a module-level
    name bound to one; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        got = set()
        for e in node.elts:
            got |= _strings(e, constants) or set()
        return got
    if isinstance(node, ast.Dict):
        return set().union(*(_strings(k, constants) or set() for k in node.keys if k))
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.Call) and node.args:
        return _strings(node.args[0], constants)
    if isinstance(node, ast.BinOp):
        return (_strings(node.left, constants) or set()) | \
            (_strings(node.right, constants) or set())
    return None


def _constants(tree) -> dict:
    """Module-level names bound to strings or collections of them."""
    found: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            s = _strings(node.value, found)
            if s is not None:
                found[node.targets[0].id] = s
    return found


def _is_name_attr(node, copies) -> bool:
    """``x.name``, or a variable assigned one (``name = eqn.primitive.name``)."""
    return (isinstance(node, ast.Attribute) and node.attr == "name") or \
        (isinstance(node, ast.Name) and node.id in copies)


def _name_copies(tree) -> set:
    return {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Attribute) and node.value.attr == "name"
            for t in node.targets if isinstance(t, ast.Name)}


def _kernel_ops() -> set:
    """The kernel languages' op words (``rules.kernel_op``), some spelt as primitives."""
    from spmd.compiler.engine import loops

    return {p.rules.kernel_op for p in PRIMITIVES.values()
            if isinstance(p.rules.kernel_op, str)} | set(loops.EXPR)


def violations(source: str, path: str = "<source>") -> list:
    """``path:line: what`` for every comparison on a primitive's name in ``source``."""
    tree = ast.parse(source)
    constants = _constants(tree)
    names = _primitive_names()
    ops = _kernel_ops()
    copies = _name_copies(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for a, op, b in zip(sides, node.ops, sides[1:]):
            if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                continue
            for x, y in ((a, b), (b, a)):
                held = (_strings(y, constants) or set()) & names
                named = _is_name_attr(x, copies)
                if not named:
                    held -= ops  # (a kernel op compared: a rule's value)
                if held:
                    what = ".name" if named else "a value"
                    out.append(f"{path}:{node.lineno}: {what} compared with primitive "
                               f"names {sorted(held)}")
                    break
    return out


@pytest.mark.parametrize("path", list(_modules()))
def test_no_pass_compares_primitive_names(path):
    with open(os.path.join(ROOT, path)) as f:
        found = violations(f.read(), path)
    assert not found, "\n".join(found)


def test_the_check_catches_name_comparisons():
    bad = [
        'def f(e):\n    return e.primitive.name == "reshape"\n',
        'def f(e):\n    return e.primitive.name != "reduce_sum"\n',
        '_VIEWS = ("broadcast_in_dim", "reshape")\n'
        'def f(e):\n    return e.primitive.name in _VIEWS\n',
        'def f(e):\n    name = e.primitive.name\n    return name == "reshape"\n',
        'NAMES = frozenset(("slice", "transpose") + ("squeeze",))\n'
        'def f(x):\n    return x in NAMES\n',
    ]
    for src in bad:
        assert violations(src), src
    fine = [
        'def f(e, i):\n    return f"_{e.primitive.name}_{i}"\n',
        'def f(e):\n    return "view" in e.primitive.traits\n',
        'def f(d):\n    return d.name == "bool"\n',
        'def f(e):\n    return e.primitive.rules.kernel_op == "integer_pow"\n',
    ]
    for src in fine:
        assert not violations(src), src
