"""The package's shape, measured honestly and held to ceilings that only come down.

``tests/test_layers.py`` checks the layer order.  This module measures what issue 55
("the house in order") sets goals for, reading every import as what it reaches:

- ``from spmd.pkg import module`` is an import of ``spmd.pkg.module`` (not of the
  package), and ``pkg.module.f()`` after ``from spmd import pkg`` or
  ``import spmd.pkg as pkg`` reaches ``spmd.pkg.module`` too (a dependency through a
  package's attributes);
- imports inside functions count like those at the top.

Each measure has a ceiling (today's value) and the issue's goal.  A change that makes
a measure worse fails; one that makes it better fails too until the ceiling is
lowered to the new value, so the ceilings only ever come down to the goals.
"""

from __future__ import annotations

import ast
import pathlib
import sys

from tests.test_layers import inner_imports as layers_inner_imports
from tests.test_layers import strongly_connected

ROOT = pathlib.Path(__file__).resolve().parents[1] / "spmd"

# measure: (ceiling, the issue's goal)
CEILINGS = {
    "largest import circle (modules)": (4, 4),    # launch's, and the op families'
    "imports of spmd inside functions": (57, 120),
    "files over 600 lines": (0, 3),
    "functions over 80 lines": (0, 3),
    "files named for overflow": (0, 0),
}
OVERFLOW_WORDS = ("_more", "more_", "misc", "extra")


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    return {_module(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> str | None:
    """The absolute module of a ``from ... import`` (relative ones resolved)."""
    if node.level == 0:
        return node.module
    base = module.split(".")
    is_package = _modules_cache[module].name == "__init__.py"
    keep = len(base) - node.level + (1 if is_package else 0)
    if keep <= 0:
        return None
    return ".".join(base[:keep] + ([node.module] if node.module else []))


_modules_cache: dict = {}


def dependencies(module: str, path: pathlib.Path, modules: dict) -> set:
    """The ``spmd`` modules ``module`` reaches: its imports (inside functions too), a
    ``from pkg import name`` read as ``pkg.name`` where that is a module, and
    ``alias.sub`` attributes of a package bound by an import."""
    tree = ast.parse(path.read_text(), str(path))
    found: set = set()
    bound: dict = {}  # local name -> the package or module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] != "spmd":
                    continue
                found.add(a.name)
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "spmd"
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if not source or source.split(".")[0] != "spmd":
                continue
            for a in node.names:
                target = f"{source}.{a.name}"
                if target in modules:
                    found.add(target)
                    bound[a.asname or a.name] = target
                else:
                    found.add(source)
    for node in ast.walk(tree):
        # alias.sub(.sub2...) where alias names a package: the submodules it reaches.
        if isinstance(node, ast.Attribute):
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                name = bound[base.id]
                for attr in reversed(chain):
                    if f"{name}.{attr}" not in modules:
                        break
                    name = f"{name}.{attr}"
                    found.add(name)
    return {m for m in found if m in modules and m != module}


def largest_circle() -> list:
    """The largest strongly connected group of modules (packages' ``__init__`` aside:
    importing a submodule runs its package's ``__init__``, which is no dependency of
    the submodule's own code)."""
    modules = _modules()
    _modules_cache.clear()
    _modules_cache.update(modules)
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    edges = {m: dependencies(m, p, modules) - packages for m, p in modules.items()
             if m not in packages}
    return max(strongly_connected(edges), key=len)


def inner_imports() -> int:
    """Imports of ``spmd`` modules inside functions or lambdas, package-wide."""
    return layers_inner_imports(ROOT, spmd_only=True)


def long_files() -> list:
    return sorted(str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py")
                  if len(p.read_text().splitlines()) > 600)


def long_functions() -> list:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > 80:
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}")
    return found


def overflow_names() -> list:
    return sorted(str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py")
                  if any(w in p.stem for w in OVERFLOW_WORDS))


def measures() -> dict:
    """Every measure of :data:`CEILINGS`: ``(value, what makes it up)``."""
    circle = largest_circle()
    files, functions, names = long_files(), long_functions(), overflow_names()
    return {"largest import circle (modules)": (len(circle), circle),
            "imports of spmd inside functions": (inner_imports(), []),
            "files over 600 lines": (len(files), files),
            "functions over 80 lines": (len(functions), functions),
            "files named for overflow": (len(names), names)}


def test_the_shape_stays_within_its_ceilings_and_they_follow_it_down():
    got = measures()
    worse = {k: (v, CEILINGS[k][0], items) for k, (v, items) in got.items()
             if v > CEILINGS[k][0]}
    better = {k: (v, CEILINGS[k][0]) for k, (v, _) in got.items() if v < CEILINGS[k][0]}
    assert not worse, "the package's shape got worse than its ceiling (issue 55's " \
        "goals in CEILINGS):\n" + "\n".join(
            f"  {k}: {v} > {c}: {items[:12]}" for k, (v, c, items) in worse.items())
    assert not better, "better than the ceilings: lower them in tests/test_structure.py " \
        "to the new values:\n" + "\n".join(f"  {k}: {v} < {c}" for k, (v, c) in better.items())


def test_the_scan_reads_imports_as_what_they_reach(tmp_path, monkeypatch):
    """``from pkg import module`` and ``pkg.module.f`` reach the module; a relative
    import resolves; a name that is no module reaches the package."""
    root = tmp_path / "spmd"
    (root / "pkg").mkdir(parents=True)
    for name, text in {"__init__.py": "", "pkg/__init__.py": "X = 1\n",
                       "pkg/a.py": "def f():\n    from spmd.pkg import b\n    return b\n",
                       "pkg/b.py": "from . import c\n",
                       "pkg/c.py": "import spmd.pkg as p\ny = p.d.g\n",
                       "pkg/d.py": "from spmd.pkg import X\nfrom spmd.pkg import a\n"}.items():
        (root / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", root)
    modules = _modules()
    _modules_cache.clear()
    _modules_cache.update(modules)
    dep = {m: dependencies(m, p, modules) for m, p in modules.items()}
    assert dep["spmd.pkg.a"] == {"spmd.pkg.b"}
    assert dep["spmd.pkg.b"] == {"spmd.pkg.c"}
    assert dep["spmd.pkg.c"] == {"spmd.pkg", "spmd.pkg.d"}
    assert dep["spmd.pkg.d"] == {"spmd.pkg", "spmd.pkg.a"}
    assert largest_circle() == ["spmd.pkg.a", "spmd.pkg.b", "spmd.pkg.c", "spmd.pkg.d"]
    assert inner_imports() == 1


def test_the_goals_of_issue_55_hold():
    """Each measure is within the goal the redesign set (the ceilings may only get
    lower than the goals, never higher)."""
    got = measures()
    missed = {k: (v, CEILINGS[k][1]) for k, (v, _) in got.items() if v > CEILINGS[k][1]}
    assert not missed, "\n".join(f"{k}: {v} > goal {g}" for k, (v, g) in missed.items())
    assert all(c <= g for c, g in CEILINGS.values())
