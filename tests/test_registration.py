"""Registration is explicit: no module fills another module's table when imported.

The compiler's extension points and the partition decisions are filled by each
layer's ``register()`` (``spmd.launch``, ``spmd.collectives``, ``spmd.shard``), which
the wiring (``spmd/_install.py``) calls in layer order.  A module-level call that
fills a table would make the table's contents depend on which modules happen to be
imported; this scan fails on one.  Allowed, each for its reason (``ALLOWED``):

- a module declaring the partition decision of a primitive it defines itself
  (``spmd/host``: its primitives sit above the shard layer, whose register() cannot
  import them), as a primitive's own module sets its own rules;
- a package wiring its own layer where the layer must work loaded alone (the op
  library fills the transformations' few ops in ``spmd/compiler/ops/__init__.py``);
- the front end that installs the array methods as it loads (``spmd.numpy``), which
  the wiring loads on purpose after the layers' register().
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "spmd"
FILLS = {"register", "register_all", "install"}  # calls that fill a table
ALLOWED = {"spmd/host/callback.py", "spmd/host/debug.py", "spmd/compiler/ops/__init__.py",
           "spmd/numpy/__init__.py"}
NOT_TABLES = {"faulthandler", "atexit", "signal"}  # the standard library's


def module_level_fills(path: pathlib.Path) -> list:
    """Calls of ``x.register(...)``, ``x.register_all(...)`` or ``x.install(...)`` that
    run when the module is imported (at its top level, or in a function called there)."""
    tree = ast.parse(path.read_text(), str(path))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    found = []

    def calls_in(nodes):
        for node in nodes:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                        and sub.func.attr in FILLS and \
                        ast.unparse(sub.func.value) not in NOT_TABLES:
                    found.append(f"{path.relative_to(ROOT.parent)}:{sub.lineno} "
                                 f"{ast.unparse(sub.func)}(...)")

    top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                       ast.AsyncFunctionDef))]
    calls_in(top)
    for node in top:  # a function called at the top level runs at import too
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and \
                    sub.func.id in functions:
                calls_in([functions[sub.func.id]])
    return found


def test_no_module_fills_a_table_when_imported():
    found = [f for p in sorted(ROOT.rglob("*.py"))
             if str(p.relative_to(ROOT.parent)) not in ALLOWED
             for f in module_level_fills(p)]
    assert not found, ("tables filled at import (fill them in the layer's register(), "
                       "called by spmd/_install.py):\n  " + "\n  ".join(found))


def test_the_scan_sees_a_fill_at_import(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import r\nr.register_all({})\ndef f():\n    r.install(1)\n"
                   "def g():\n    r.register(2)\ng()\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert [f.split(" ")[1] for f in module_level_fills(src)] == \
            ["r.register_all(...)", "r.register(...)"]
    finally:
        ROOT = old


def test_each_layer_registers_what_it_provides():
    import spmd.numpy  # noqa: F401  (runs the wiring)
    from spmd.compiler import extensions
    from spmd.shard.partition import registry
    from spmd.compiler.ops.elementwise import tanh_p

    by = {p.name: p.installed_by.split(".")[1] for p in extensions.POINTS}
    assert by == {"pvary": "collectives", "preduced": "collectives",
                  "summands": "collectives", "array_module": "launch",
                  "context_key": "shard", "plain_sharding": "shard",
                  "plain_shards": "shard", "eager_eval": "shard"}
    assert registry.decision(tanh_p)
