"""JAX's own ``tests/shard_map_test.py``, run against ``spmd`` through a facade.

    .venv-bench/bin/python benchmarks/jax_compat.py --tests PATH/jax/tests/shard_map_test.py
                                                     [-k EXPR] [--no-save]

JAX's test file is not in this repository and not in JAX's wheel or sdist: pass the
one from a JAX checkout (``git clone https://github.com/jax-ml/jax``).  The facade is
what a user porting a program does, done for every name at once: ``jax`` and its
public modules (``jax.numpy``, ``jax.lax``, ``jax.sharding``, ``jax.random``, ...)
are replaced by modules that forward each name to ``spmd``'s of the same name.  A
name ``spmd`` does not have is an :class:`Unclaimed` placeholder, which raises
:class:`NotClaimed` when the test uses it.  JAX's test harness (``jax._src.test_util``:
``JaxTestCase``, its asserts, ``run_on_devices``) stays JAX's, but its mesh makers and
``check_grads`` are ``spmd``'s.  JAX's internals (``jax._src.core``, partial
evaluation, ...) stay JAX's: a test that reads them checks JAX's implementation, not
its behaviour.

Each test method ends in one of four outcomes (``outcome`` in the results file):

- ``pass``;
- ``pass, other wording``: it expected an error and got it, of the type JAX raises,
  worded otherwise (``assertRaisesRegex`` failed on the message alone); counted as
  a pass;
- ``not claimed``: it failed on a name ``spmd`` does not have (:class:`NotClaimed`);
- ``n/a``: JAX skipped it on this machine (GPU or TPU only, ...), or it failed at a
  line that reads JAX's internals or compiled text (:data:`INTERNALS`: ``core.``,
  partial evaluation, equation parameters, HLO, ...): there it tests JAX's
  implementation, which ``spmd`` does not share;
- ``fail``: any other failure, error or hang (each test has a time limit).

The goal (issue 28): at least 90% of the applicable methods (all but ``n/a``) pass.
The results go to ``benchmarks/results/jax_shard_map_tests.json``;
``benchmarks/make_tables.py`` renders them (:func:`table`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
import types

os.environ.setdefault("SPMD_NUM_DEVICES", "8")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (HERE, REPO):
    if p not in sys.path:
        sys.path.insert(0, p)

import common  # noqa: E402

RESULTS_NAME = "jax_shard_map_tests"
JAX_VERSION = ["?"]  # the installed JAX's (read before the facade replaces it)
GOAL = 0.9
# A failing test whose source matches reads JAX's internals or compiled text.
INTERNALS = re.compile(r"\b(core|pe|lu|api_util|config|prng|threefry2x32|saved_residuals|"
                       r"remat_transform|custom_partitioning|tree_util|partition_list|"
                       r"merge_lists|mlir|xla_extension)\.|\bjax\._src\b|as_text\(|"
                       r"\bhlo\b|compiler_ir|\.compile\(\)|cost_analysis|\.params\[|"
                       r"\b(saved_residuals|remat_transform)\(")
# assertRaisesRegex's failure when the right exception type came with other words.
WORDING = re.compile(r'AssertionError: ".*?" does not match "', re.S)


class NotClaimed(AttributeError):
    """A JAX name ``spmd`` does not have."""


_TOUCHED: set = set()  # the unclaimed names the running test used


class Unclaimed:
    """What the facade gives for a JAX name ``spmd`` does not have.  Importing it works
    (the test file imports many names at its top) and so does decorating with it (a
    decorated test raises NotClaimed when it runs); calling it records the name for the
    running test (:data:`_TOUCHED`: its failure is then classed ``not claimed``) and
    gives another placeholder; iterating, entering or testing it raises NotClaimed."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _raise(self, *_, **__):
        _TOUCHED.add(self._name)
        raise NotClaimed(f"not claimed by spmd: {self._name}")

    def __call__(self, *args, **kwargs):
        _TOUCHED.add(self._name)
        if len(args) == 1 and not kwargs and isinstance(args[0], types.FunctionType):
            fn, name = args[0], self._name

            def unclaimed(*a, **k):
                _TOUCHED.add(name)
                raise NotClaimed(f"not claimed by spmd: {name}")
            unclaimed.__name__ = fn.__name__
            return unclaimed
        return Unclaimed(self._name + "()")

    __enter__ = __iter__ = __bool__ = __len__ = __getitem__ = __array__ = _raise

    def __exit__(self, *exc):
        return False

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unclaimed(f"{self._name}.{attr}")

    def __repr__(self):
        return f"<unclaimed {self._name}>"


class Facade(types.ModuleType):
    """A ``jax`` module whose names are ``target``'s (``spmd``'s), ``extra``'s first."""

    def __init__(self, name: str, target, extra: dict | None = None):
        super().__init__(name)
        self._target = target
        self._extra = extra or {}
        self._subs: dict = {}

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if attr in self._extra:
            return self._extra[attr]
        if self._target is not None and hasattr(self._target, attr):
            v = getattr(self._target, attr)
            if isinstance(v, types.ModuleType) and v.__name__.startswith("spmd"):
                if attr not in self._subs:
                    self._subs[attr] = Facade(f"{self.__name__}.{attr}", v)
                return self._subs[attr]
            return v
        return Unclaimed(f"{self.__name__}.{attr}")


def install() -> None:
    """Import JAX and its test harness, then put the facade in place of ``jax``."""
    import jax._src.test_util as jtu
    importlib.import_module("jax.api_util")  # (internals the test file imports stay JAX's)

    import spmd
    import spmd.ad_checkpoint
    import spmd.custom_derivatives
    import spmd.lax
    import spmd.numpy
    import spmd.random
    import spmd.sharding
    import spmd.test_util
    from spmd.compiler.core.avals import ShapedArray

    def sub(name, target, extra=None):
        m = Facade(name, target, extra)
        sys.modules[name] = m
        return m

    lax = sub("jax.lax", spmd.lax)
    jnp = sub("jax.numpy", spmd.numpy)
    sharding = sub("jax.sharding", spmd.sharding)
    adc = sub("jax.ad_checkpoint", spmd.ad_checkpoint)
    cder = sub("jax.custom_derivatives", spmd.custom_derivatives)
    smap_mod = sub("jax.experimental.shard_map", None, {"shard_map": spmd.shard_map})
    cp = sub("jax.experimental.custom_partitioning", None)
    import spmd.experimental

    exp = sub("jax.experimental", spmd.experimental,
              {"shard_map": smap_mod, "custom_partitioning": cp})
    sub("jax._src.shard_map", None, {"shard_map": spmd.shard_map})
    sub("jax._src.mesh", None, {
        "AxisType": spmd.sharding.AxisType, "get_abstract_mesh":
        getattr(spmd.sharding, "get_abstract_mesh", Unclaimed("get_abstract_mesh")),
        "AbstractMesh": getattr(spmd.sharding, "AbstractMesh", Unclaimed("AbstractMesh")),
        # JAX's mesh of no axes (set_mesh of it: no mesh in context).
        "empty_concrete_mesh": spmd.make_mesh((), ())})
    real = sys.modules["jax"]
    JAX_VERSION[0] = real.__version__
    facade = Facade("jax", spmd, {
        "numpy": jnp, "lax": lax, "sharding": sharding, "ad_checkpoint": adc,
        "custom_derivatives": cder, "experimental": exp, "api_util": real.api_util,
        "core": Facade("jax.core", None, {"ShapedArray": ShapedArray}),
        "_src": real._src})
    facade.__path__ = real.__path__  # (submodules not replaced are JAX's own)
    sys.modules["jax"] = facade

    # JAX's harness, with spmd's meshes and gradient checks.
    import unittest

    def create_mesh(mesh_shape, axis_names, iota_order=False, axis_types=None):
        import math

        if spmd.device_count() < math.prod(mesh_shape):
            raise unittest.SkipTest(f"needs {math.prod(mesh_shape)} devices")
        return spmd.make_mesh(tuple(mesh_shape), axis_names, axis_types=axis_types)

    def with_explicit_mesh(sizes, names, axis_types=None, iota_order=False):
        ts = (spmd.sharding.AxisType.Explicit,) * len(names) if axis_types is None \
            else axis_types

        def decorator(fn):
            def mesh_fn(*args, **kwargs):
                mesh = create_mesh(sizes, names, iota_order, axis_types=ts)
                with spmd.sharding.use_mesh(mesh):
                    return fn(*args, **kwargs, mesh=mesh)
            mesh_fn.__name__ = fn.__name__
            return mesh_fn
        return decorator

    # Flags of a newer JAX than the installed one: their tests are JAX's internals'
    # (compiled text); they are skipped (n/a).
    from jax._src import config as jconfig

    def flag_absent(name):
        def factory(*_):
            def decorator(fn):
                def skipped(*a, **k):
                    raise unittest.SkipTest(f"JAX config flag {name} is not in the "
                                            "installed JAX")
                skipped.__name__ = fn.__name__
                return skipped
            return decorator
        return factory

    for name in ("use_rgv3",):
        if not hasattr(jconfig, name):
            setattr(jconfig, name, flag_absent(name))

    jtu.create_mesh = create_mesh
    jtu.with_explicit_mesh = with_explicit_mesh
    jtu.check_grads = spmd.test_util.check_grads


class Collect:
    """A pytest plugin: each test's outcome and, for a failure, why."""

    def __init__(self):
        self.rows: dict = {}

    def pytest_runtest_setup(self, item):
        _TOUCHED.clear()

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.split("::", 1)[-1]
        row = self.rows.setdefault(name, {"test": name, "outcome": "pass", "why": ""})
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            row.update(outcome="n/a", why=f"skipped: {reason}"[:160])
        elif report.failed:
            text = str(report.longrepr)
            row["_at"] = failing_lines(report)
            if _TOUCHED:
                text += "\nnot claimed by spmd: " + ", ".join(sorted(_TOUCHED))
            row["_text"] = text
            row["outcome"] = "failed"


def failing_lines(report) -> str:
    """The lines of the test file where the failure happened (pytest marks them with
    ``>`` in each frame of its traceback; the test file's innermost frame's)."""
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", [])
    test_file = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    at = ""
    for e in entries:
        loc = getattr(e, "reprfileloc", None)
        if loc is not None and str(loc.path).endswith(test_file):
            at = "\n".join(ln[1:] for ln in getattr(e, "lines", []) if ln.startswith(">"))
    return at


def classify(rows: dict) -> list[dict]:
    out = []
    for name, row in rows.items():
        text = row.pop("_text", "")
        at = row.pop("_at", "")
        if row["outcome"] == "failed":
            last = [ln for ln in text.splitlines() if ln.startswith("E ")]
            why = (last[0][2:].strip() if last else text.strip().splitlines()[-1:] or [""])
            why = why if isinstance(why, str) else why[0]
            if "NotClaimed" in text or "not claimed by spmd" in text:
                m = re.findall(r"not claimed by spmd: ([\w.(), ]+)", text)
                row.update(outcome="not claimed", why=m[-1] if m else why)
            elif WORDING.search(text):
                row.update(outcome="pass, other wording", why=why)
            elif INTERNALS.search(at):
                row.update(outcome="n/a", why="reads JAX internals: " + why)
            else:
                row.update(outcome="fail", why=why)
            row["why"] = row["why"][:200]
        out.append(row)
    return sorted(out, key=lambda r: r["test"])


def table(rows: list[dict]) -> str:
    """The results: counts by outcome against the goal, and each test that did not
    pass (make_tables calls this)."""
    counts = {k: sum(r["outcome"] == k for r in rows) for k in
              ("pass", "pass, other wording", "fail", "not claimed", "n/a")}
    applicable = len(rows) - counts["n/a"]
    passed = counts["pass"] + counts["pass, other wording"]
    share = passed / applicable if applicable else 0.0
    lines = ["| outcome | methods |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in counts.items()]
    lines.append(f"| applicable (all but n/a) | {applicable} |")
    lines.append(f"| **passing of applicable** | **{share:.1%}** (goal >= {GOAL:.0%}: "
                 f"{'pass' if share >= GOAL else 'FAIL'}) |")
    bad = [r for r in rows if r["outcome"] in ("fail", "not claimed")
           or r["why"].startswith("reads JAX internals")]
    if bad:
        lines += ["", "| test | outcome | why |", "| --- | --- | --- |"]
        lines += [f"| `{r['test']}` | {r['outcome']} | "
                  f"{r['why'].replace('|', '/').replace(chr(10), ' ')} |" for r in bad]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", required=True, help="JAX's tests/shard_map_test.py")
    ap.add_argument("-k", default=None, help="pytest's -k: only these tests")
    ap.add_argument("--timeout", type=int, default=120, help="per test, seconds")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.tests):
        raise SystemExit(f"jax_compat: --tests {args.tests!r} is not a file; pass JAX's "
                         "tests/shard_map_test.py from a JAX checkout")
    common.provenance()
    install()
    import pytest

    plugin = Collect()
    t0 = time.perf_counter()
    # -s: JAX's tests capture stdout at its file descriptor (jtu.capture_stdout).
    pargs = [args.tests, "-q", "-s", "-p", "no:cacheprovider", f"--timeout={args.timeout}",
             "-W", "ignore", "--rootdir", os.path.dirname(os.path.abspath(args.tests))]
    if args.k:
        pargs += ["-k", args.k]
    pytest.main(pargs, plugins=[plugin])
    rows = classify(plugin.rows)
    seconds = time.perf_counter() - t0
    print(table(rows))
    if not args.no_save and not args.k:
        import json

        path = os.path.join(HERE, "results", f"{RESULTS_NAME}.json")
        prov = common.provenance()
        import hashlib

        with open(args.tests, "rb") as f:
            digest = hashlib.md5(f.read()).hexdigest()
        prov["command"] = (f"python benchmarks/jax_compat.py --tests shard_map_test.py (md5 "
                           f"{digest}; JAX's harness from jax {JAX_VERSION[0]})")
        doc = {"benchmark": RESULTS_NAME, "date": common.now_iso(), **prov, "quick": False,
               "wall_seconds": round(seconds, 2), "machine": common.machine_info(),
               "jax_tests": os.path.basename(args.tests), "rows": rows}
        with open(path + ".partial", "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(path + ".partial", path)
        print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
