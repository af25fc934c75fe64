"""The layer order, checked from the code: compiler < launch < mesh < collectives <
shard < front ends (DESIGN.md section 2).  A lower layer never imports an upper one,
neither at import time nor inside a function, and each layer loads alone.

The base modules ``spmd.errors``, ``spmd.config`` and ``spmd.tree_util`` (exception
types, switches, pytrees) sit below every layer.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "spmd"
BASE = {"errors", "config", "tree_util"}
LAYERS = {"compiler": 0, "launch": 1, "mesh": 2, "collectives": 3, "shard": 4}
FRONT = 5

# Imports that still go upward, each with the issue that removes it.  The test fails
# when one is fixed, so that this list only ever shrinks.
KNOWN: dict = {}


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """The layer of an ``spmd`` module (-1 for the base modules)."""
    parts = module.split(".")
    if len(parts) == 1:
        return FRONT
    if parts[1] in BASE:
        return -1
    return LAYERS.get(parts[1], FRONT)


def imports(path: pathlib.Path):
    """``(imported spmd module, line)`` for every import in the file, including those
    inside functions; ``from spmd import x`` counts as importing ``spmd.x``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "spmd":
                    yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "spmd":
            if node.module == "spmd":
                for a in node.names:
                    yield f"spmd.{a.name}", node.lineno
            else:
                yield node.module, node.lineno


def upward_imports() -> dict:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        src = _module(path)
        for target, line in imports(path):
            if layer(target) > layer(src):
                found.setdefault((src, target), f"{path.relative_to(ROOT.parent)}:{line}")
    return found


def test_no_lower_layer_imports_an_upper_one():
    found = upward_imports()
    new = {k: v for k, v in found.items() if k not in KNOWN}
    assert not new, "imports against the layer order (compiler < launch < mesh < " \
        "collectives < shard < front ends):\n" + "\n".join(
            f"  {where}: {src} imports {dst}" for (src, dst), where in sorted(new.items()))
    fixed = sorted(set(KNOWN) - set(found))
    assert not fixed, f"known exceptions no longer present, remove them from KNOWN: {fixed}"


def test_the_scan_sees_the_layers(tmp_path):
    """The scanner itself: it classifies modules and finds every form of import,
    including those inside functions."""
    assert layer("spmd.compiler.trace") == 0 and layer("spmd.shard.array") == 4
    assert layer("spmd.errors") == -1 and layer("spmd.numpy") == FRONT == layer("spmd")
    src = tmp_path / "m.py"
    src.write_text("import os\nimport spmd.mesh\nfrom spmd import numpy\n"
                   "def f():\n    from spmd.shard.spec import P\n    from . import x\n")
    assert sorted(t for t, _ in imports(src)) == ["spmd.mesh", "spmd.numpy", "spmd.shard.spec"]


# ------------------------------------------------------------ each layer alone

_ALONE = r"""
import importlib, json, pkgutil, sys, types
root, top = sys.argv[1], sys.argv[2]
# The package without its __init__ (which assembles every layer): the layer alone.
pkg = types.ModuleType("spmd"); pkg.__path__ = [root]; sys.modules["spmd"] = pkg
mod = importlib.import_module("spmd." + top)
for m in pkgutil.walk_packages(mod.__path__, mod.__name__ + "."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
from spmd.compiler import extensions
report = {"modules": sorted(m for m in sys.modules if m.startswith("spmd.")),
          "installed": [p.name for p in extensions.POINTS if p.installed_by]}
if top == "compiler":  # the compiler works alone: trace, differentiate, run
    import numpy as np
    from spmd.compiler import ops
    from spmd.compiler.jit import jit
    from spmd.compiler.ops.elementwise import mul, tanh
    from spmd.compiler.ad import jvp_flat
    f = jit(lambda x: mul(tanh(x), x))
    x = np.linspace(-1, 1, 5).astype(np.float32)
    (y,), (t,) = jvp_flat(lambda x: [f(x)], [x], [np.ones_like(x)])
    report["value"] = np.asarray(y).tolist()
    report["grad"] = np.asarray(t).tolist()
print(json.dumps(report))
"""


def _alone(top: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent))
    out = subprocess.run([sys.executable, "-c", _ALONE, str(ROOT), top], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("top", sorted(LAYERS, key=LAYERS.get))
def test_each_layer_loads_alone(top):
    """Loading a layer (every module of it) loads nothing above it and fills no
    extension point: the wiring happens only in spmd._install."""
    rep = _alone(top)
    above = [m for m in rep["modules"] if layer(m) > LAYERS[top]]
    assert not above, f"loading spmd.{top} loaded upper layers: {above}"
    assert rep["installed"] == [], f"importing spmd.{top} filled extension points " \
        f"{rep['installed']}; only spmd._install.install_extensions may"


def test_the_compiler_runs_alone():
    rep = _alone("compiler")
    x = [-1.0, -0.5, 0.0, 0.5, 1.0]
    import numpy as np

    xs = np.asarray(x, np.float32)
    np.testing.assert_allclose(rep["value"], np.tanh(xs) * xs, rtol=1e-6)
    want = np.tanh(xs) + xs * (1 - np.tanh(xs) ** 2)
    np.testing.assert_allclose(rep["grad"], want, rtol=1e-5, atol=1e-6)
