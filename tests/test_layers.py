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
BASE = {"errors", "config", "tree_util", "tree"}
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


def inner_imports(root: pathlib.Path = ROOT, spmd_only: bool = False) -> int:
    """Import statements inside functions (or lambdas) under ``root``; with
    ``spmd_only``, imports of ``spmd`` modules only, one per name imported."""
    count = 0

    def counted(node) -> int:
        if not spmd_only:
            return 1
        if isinstance(node, ast.Import):
            return sum(a.name.split(".")[0] == "spmd" for a in node.names)
        return int(bool(node.level or (node.module or "").split(".")[0] == "spmd"))

    def visit(node, inside):
        nonlocal count
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                count += counted(child)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda)))

    for path in root.rglob("*.py"):
        visit(ast.parse(path.read_text(), str(path)), False)
    return count


def strongly_connected(edges: dict) -> list:
    """The strongly connected groups of the graph ``edges`` (node -> its successors;
    successors that are not keys are left out), each sorted, in the order Tarjan's
    algorithm closes them."""
    index, low, stack, on, groups, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in edges:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            groups.append(sorted(group))

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10000))
    try:
        for v in edges:
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(old)
    return groups


# The import circles and the imports inside functions are measured, honestly (through
# package attributes, inside functions), by tests/test_structure.py.


def test_the_scan_sees_the_layers(tmp_path):
    """The scanner itself: it classifies modules and finds every form of import,
    including those inside functions."""
    assert layer("spmd.compiler.core.trace") == 0 and layer("spmd.shard.arrays.placing") == 4
    assert layer("spmd.errors") == -1 and layer("spmd.numpy") == FRONT == layer("spmd")
    src = tmp_path / "m.py"
    src.write_text("import os\nimport spmd.mesh\nfrom spmd import numpy\n"
                   "def f():\n    from spmd.shard.arrays.spec import P\n    from . import x\n")
    assert sorted(t for t, _ in imports(src)) == ["spmd.mesh", "spmd.numpy", "spmd.shard.arrays.spec"]


# ------------------------------------------------------------ each layer alone

_ALONE = r"""
import importlib, json, pkgutil, sys, types
root, top = sys.argv[1], sys.argv[2]
# The package without its __init__ (which registers the installer): the layer alone.
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
    from spmd.compiler.core.jit import jit
    from spmd.compiler.ops.elementwise import mul, tanh
    from spmd.compiler.transforms.ad import jvp_flat
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


# ------------------------------------------------- the lazy root and the installer
# spmd/__init__.py imports nothing of the layers (Python runs it before any submodule)
# and registers the installer of the extension points with the compiler; the shard
# layer, every front end and the root's __getattr__ run it (spmd/_install.py).

_REPORT = r"""
import json, sys
modules = sorted(m for m in sys.modules if m == "spmd" or m.startswith("spmd."))
from spmd.compiler import extensions
from spmd.compiler.core.array import Array
from spmd.compiler.core.trace import Tracer
print(json.dumps({
    "modules": modules,  # before the report's own imports
    "left": [p.name for p in extensions.POINTS if p.installed_by is None],
    "points": [p.name for p in extensions.POINTS],
    "methods": [hasattr(c, "__add__") and hasattr(c, "sum") for c in (Array, Tracer)],
    "shard_loaded": "spmd.shard.explicit.mesh_context" in sys.modules}))
"""


def _fresh(code: str, *args: str) -> dict:
    """Run ``code`` then the report in a fresh interpreter (the real spmd/__init__)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent))
    out = subprocess.run([sys.executable, "-c", code + "\n" + _REPORT, *args], env=env,
                         capture_output=True, text=True, timeout=300, cwd=str(ROOT.parent))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_spmd_compiler_loads_no_upper_layer():
    rep = _fresh("import spmd.compiler")
    above = [m for m in rep["modules"] if m != "spmd" and layer(m) > LAYERS["compiler"]]
    assert not above, f"`import spmd.compiler` loaded upper layers: {above}"
    # Nothing ran the installer: the defaults, which are exact while no mesh exists.
    assert len(rep["left"]) == len(rep["points"]) and not rep["shard_loaded"]


def test_import_spmd_alone_loads_nothing_of_the_layers():
    rep = _fresh("import spmd")
    assert rep["modules"] == ["spmd", "spmd.compiler", "spmd.compiler.extensions",
                              "spmd.config", "spmd.errors"]


# Every way in: each must end with every point filled and the array methods there.
STYLES = {
    "attribute": "import spmd; spmd.jit",
    "from-root": "from spmd import shard_map",
    "star": "from spmd import *",
    "numpy-alone": "import spmd.numpy as snp",
    "shard-module-alone": "from spmd.shard.maps.shard_map import shard_map",
    "mesh-context-alone": "from spmd.shard.explicit.mesh_context import set_mesh",
    "lax": "import spmd.lax",
    "sharding": "from spmd.sharding import NamedSharding, PartitionSpec",
    "random-keys": "from spmd.random.keys import PRNGKey",
    "launch-then-numpy": "import spmd.launch.cli; import spmd.numpy",
}


def _front_end_entries() -> list:
    """Every top-level front-end package or module (a submodule always runs its
    package's __init__ first, so these are all the first imports a front end has)."""
    names = {p.stem if p.suffix == ".py" else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists())}
    return sorted(n for n in names if not n.startswith("_") and layer(f"spmd.{n}") == FRONT)


@pytest.mark.parametrize("code", [*STYLES.values(), *(f"import spmd.{n}" for n in
                                                        _front_end_entries())],
                         ids=[*STYLES, *_front_end_entries()])
def test_every_import_style_installs_everything(code):
    rep = _fresh(code)
    assert rep["left"] == [], f"`{code}` left extension points at their defaults: " \
        f"{rep['left']}"
    assert rep["methods"] == [True, True], f"`{code}` left Array/Tracer without methods"


def test_the_front_ends_are_all_covered():
    assert {"numpy", "lax", "random", "nn", "scipy", "optim", "autodiff", "vectorize",
            "sharding", "distributed", "debug", "checkpointing"} <= set(_front_end_entries())


def test_a_shard_layer_without_the_root_installs_nothing():
    """Loaded under an empty parent package (no installer registered), the shard layer
    cannot run the front end's installer: run_installer says so."""
    assert _alone("shard")["installed"] == []


def test_an_unpickled_array_gets_everything(tmp_path):
    """A fresh process that only unpickles an Array (a worker, a cache) has imported
    nothing else of spmd: Array.__setstate__ runs the installer."""
    import pickle

    import spmd.numpy as snp

    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps(snp.arange(4.0)))
    rep = _fresh("import pickle, sys, numpy as np\n"
                 "x = pickle.loads(open(sys.argv[1], 'rb').read())\n"
                 "assert np.array_equal(np.asarray(x + 1), np.arange(4.0) + 1)",
                 str(path))
    assert rep["left"] == [] and rep["methods"] == [True, True]


def test_the_root_is_lazy_and_caches():
    code = ("import spmd, json\n"
            "before = 'jit' in vars(spmd)\n"
            "import spmd.shard.partition.api as api\n"
            "same = spmd.jit is api.jit and vars(spmd)['jit'] is api.jit\n"
            "try:\n    spmd.no_such_name\n    missing = 'no error'\n"
            "except AttributeError as e:\n    missing = str(e)\n"
            "ns = {}\nexec('from spmd import *', ns)\n"
            "print(json.dumps([before, same, missing, sorted(set(spmd.__all__) - set(ns)),"
            " sorted(set(spmd.__all__) - set(dir(spmd))), type(spmd.config).__name__]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, cwd=str(ROOT.parent))
    assert out.returncode == 0, out.stderr
    before, same, missing, not_starred, not_listed, config_type = json.loads(
        out.stdout.strip().splitlines()[-1])
    assert before is False and same is True
    assert missing == "module 'spmd' has no attribute 'no_such_name'"
    assert not_starred == [] and not_listed == []
    assert config_type == "Config"  # the object, not the module spmd.config


def test_the_public_names_are_those_the_eager_root_had():
    import spmd

    assert spmd.__all__ == sorted(PUBLIC)


# What `from spmd import *` gave when spmd/__init__.py imported every layer, and the
# names added since (`effects_barrier`, `smap`, `typeof`, `default_matmul_precision`,
# `reshard`, `pure_callback`, `experimental`).
PUBLIC = ["effects_barrier", "smap", "typeof", "default_matmul_precision", "reshard",
          "pure_callback", "experimental",
          
    "Array", "Device", "Mesh", "NamedSharding", "P", "PartitionSpec", "ShapeDtypeStruct",
    "ShapedArray", "ad_checkpoint", "autodiff", "checkpoint", "checkpoint_name",
    "checkpoint_policies", "collectives", "compiler", "config", "custom_derivatives",
    "custom_jvp", "custom_vjp", "debug", "device_count", "device_put", "devices",
    "disable_jit", "distributed", "errors", "eval_shape", "grad", "hessian", "jacfwd",
    "jacrev", "jit", "jvp", "launch", "lax", "linear_transpose", "linear_util", "linearize",
    "local_device_count", "local_devices", "make_array_from_callback",
    "make_array_from_process_local_data", "make_jaxpr", "make_mesh", "mesh", "nn", "numpy",
    "pmap", "process_allgather", "process_count", "process_index", "random", "remat",
    "scipy", "set_mesh", "shard", "shard_map", "sharding", "test_util", "tree", "tree_util",
    "value_and_grad", "vectorize", "visualize_array_sharding", "vjp", "vmap"]
