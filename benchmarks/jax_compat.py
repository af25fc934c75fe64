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

Each test *case* (a parametrised method's cases each count once) ends in one of these
outcomes (``outcome`` in the results file):

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

The results are counted by test *method* (issue 58: ``Class::method``, a parametrised
method's cases together), :func:`by_method`: a method is ``n/a`` when all its cases
are; otherwise it passes when all its applicable cases pass (``pass, other wording``
when one of them passed so), is ``not claimed`` when every failing case failed on an
unclaimed name, and fails otherwise, with its cause: the first failing case's error
type and message, and the cases that failed.  The goal (issues 28 and 58): at least
90% of the applicable methods (all but ``n/a``) pass.  The results go to
``benchmarks/results/jax_shard_map_tests.json`` (``rows``: the methods; ``cases``: the
cases); ``benchmarks/make_tables.py`` renders them (:func:`table`).
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

    _patch_harness(jtu, spmd)


def _patch_harness(jtu, spmd) -> None:
    """JAX's test harness, with ``spmd``'s meshes and gradient checks."""
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
    """A pytest plugin: each test case's outcome and, for a failure, why; and the
    method each case belongs to (:func:`method_of`)."""

    def __init__(self):
        self.rows: dict = {}
        self.methods: dict = {}  # case name -> "Class::method"

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.methods[item.nodeid.split("::", 1)[-1]] = method_of(item)

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


def method_of(item) -> str:
    """``Class::method`` of a collected test case.  absl's parametrised cases are
    functions that wrap their method (``__wrapped__``), named after it plus a suffix
    (``test_x0``, ``test_x_named``); any other case is its own method.

    Example: the case ``ShardMapTest::test_all_to_all_single_axis_name`` gives
    ``ShardMapTest::test_all_to_all``."""
    cls_case = item.nodeid.split("::", 1)[-1]
    cls, _, case = cls_case.rpartition("::")
    fn = getattr(item, "obj", None)
    inner = getattr(getattr(fn, "__func__", fn), "__wrapped__", None)
    name = getattr(inner, "__name__", "") or ""
    method = name if name and case.startswith(name) else case
    return f"{cls}::{method}" if cls else method


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
    """The collected cases with their outcomes (:data:`OUTCOMES`), sorted by name."""
    out = []
    for name, row in rows.items():
        text = row.pop("_text", "")
        at = row.pop("_at", "")
        if row["outcome"] == "failed":
            why = first_error(text)
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


def first_error(text: str) -> str:
    """A failure's first error, from pytest's report ``text``: its first ``E`` line, and
    when that line has no message (``AssertionError:`` of an array comparison), the
    ``E`` lines that follow it, joined.

    Example: ``E   AssertionError:`` then ``E   Arrays are not equal`` gives
    ``AssertionError: Arrays are not equal``."""
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("E ")), None)
    if first is None:
        return (text.strip().splitlines() or [""])[-1]
    why = lines[first][2:].strip()
    if why.endswith(":"):
        more = []
        for ln in lines[first + 1:]:
            if not ln.startswith("E"):
                break
            if ln[2:].strip():
                more.append(ln[2:].strip())
        why = " ".join([why] + more[:6])
    return why


OUTCOMES = ("pass", "pass, other wording", "fail", "not claimed", "n/a")
PASSING = ("pass", "pass, other wording")
FAILING = ("fail", "not claimed")
# A failure's first line: ``module.ErrorType: message`` (pytest's ``E`` line).
CAUSE = re.compile(r"^([A-Za-z_][\w.]*):\s?(.*)$", re.S)


def split_cause(why: str) -> tuple[str, str]:
    """A failure's error type (its last dotted part) and message.

    Example: ``split_cause("spmd.errors.DTypeError: no bfloat16")`` is
    ``("DTypeError", "no bfloat16")``; a line of no such form is all message."""
    m = CAUSE.match(why)
    return (m.group(1).rsplit(".", 1)[-1], m.group(2)) if m else ("", why)


def by_method(cases: list[dict], methods: dict) -> list[dict]:
    """The cases counted by method (``methods``: case name -> ``Class::method``, from
    :class:`Collect`; a case not in it is its own method), one row a method, sorted.

    Example: the cases ``T::test_a0`` (pass) and ``T::test_a1`` (fail) make the
    method ``T::test_a``, failed, with ``test_a1`` in ``failed_cases``."""
    groups: dict = {}
    for r in cases:
        groups.setdefault(methods.get(r["test"], r["test"]), []).append(r)
    return sorted((method_row(m, rs) for m, rs in groups.items()), key=lambda r: r["test"])


def method_row(method: str, cases: list[dict]) -> dict:
    """One method's row from its cases' rows: its outcome (see the module's text), its
    cause (``error``, ``why``: the first failing case's), and the cases that failed."""
    counts = {k: sum(r["outcome"] == k for r in cases) for k in OUTCOMES}
    row = {"test": method, "outcome": "pass", "error": "", "why": "", "failed_cases": [],
           "case_outcomes": {k: v for k, v in counts.items() if v}}
    failing = [r for r in cases if r["outcome"] in FAILING]
    if counts["n/a"] == len(cases):
        row.update(outcome="n/a", why=cases[0]["why"])
    elif failing:
        outcome = "fail" if counts["fail"] else "not claimed"
        first = next(r for r in failing if r["outcome"] == outcome)
        error, message = split_cause(first["why"]) if outcome == "fail" else ("", first["why"])
        row.update(outcome=outcome, error=error, why=message,
                   failed_cases=[r["test"].rpartition("::")[2] for r in failing])
    elif counts["pass, other wording"]:
        other = next(r for r in cases if r["outcome"] == "pass, other wording")
        row.update(outcome="pass, other wording", why=other["why"])
    return row


def _cell(text: str, limit: int = 160) -> str:
    text = text.replace("|", "/").replace("\n", " ").replace("\r", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _cases_cell(row: dict) -> str:
    names = row.get("failed_cases", [])
    total = sum(row.get("case_outcomes", {}).values()) or 1
    if total == 1 or not names:
        return f"{len(names)} of {total}" if names else ""
    shown = ", ".join(f"`{n}`" for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{len(names)} of {total}: {shown}"


def table(rows: list[dict]) -> str:
    """The results (method rows, :func:`by_method`): counts by outcome, of methods and
    of their cases, against the goal, then each method that did not pass, by cause
    (make_tables calls this)."""
    counts = {k: sum(r["outcome"] == k for r in rows) for k in OUTCOMES}
    cases = {k: sum(r.get("case_outcomes", {r["outcome"]: 1}).get(k, 0) for r in rows)
             for k in OUTCOMES}

    def share(c):
        applicable = sum(c.values()) - c["n/a"]
        return applicable, (c["pass"] + c["pass, other wording"]) / (applicable or 1)

    (applicable, method_share), (case_applicable, case_share) = share(counts), share(cases)
    lines = ["| outcome | methods | cases |", "| --- | --- | --- |"]
    lines += [f"| {k} | {counts[k]} | {cases[k]} |" for k in OUTCOMES]
    lines.append(f"| applicable (all but n/a) | {applicable} | {case_applicable} |")
    lines.append(f"| **passing of applicable** | **{method_share:.1%}** (goal >= {GOAL:.0%}:"
                 f" {'pass' if method_share >= GOAL else 'FAIL'}) | {case_share:.1%} |")
    order = {"fail": 0, "not claimed": 1, "n/a": 2}
    bad = sorted((r for r in rows if r["outcome"] in FAILING
                  or r["why"].startswith("reads JAX internals")),
                 key=lambda r: (order[r["outcome"]], r.get("error", ""), r["why"], r["test"]))
    if bad:
        lines += ["", "Methods that did not pass, by cause (the first failing case's error):",
                  "", "| method | outcome | failed cases | cause |", "| --- | --- | --- | --- |"]
        lines += [f"| `{r['test']}` | {r['outcome']} | {_cases_cell(r)} | "
                  f"{_cell(': '.join(x for x in (r.get('error', ''), r['why']) if x))} |"
                  for r in bad]
    return "\n".join(lines)


def save(tests: str, rows: list[dict], cases: list[dict], seconds: float) -> str:
    """Write the results file (the methods as ``rows``, the cases as ``cases``)."""
    import hashlib
    import json

    path = os.path.join(HERE, "results", f"{RESULTS_NAME}.json")
    prov = common.provenance()
    with open(tests, "rb") as f:
        digest = hashlib.md5(f.read()).hexdigest()
    prov["command"] = (f"python benchmarks/jax_compat.py --tests shard_map_test.py (md5 "
                       f"{digest}; JAX's harness from jax {JAX_VERSION[0]})")
    doc = {"benchmark": RESULTS_NAME, "date": common.now_iso(), **prov, "quick": False,
           "wall_seconds": round(seconds, 2), "machine": common.machine_info(),
           "jax_tests": os.path.basename(tests), "counted_by": "method",
           "rows": rows, "cases": cases}
    with open(path + ".partial", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(path + ".partial", path)
    return path


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
    cases = classify(plugin.rows)
    rows = by_method(cases, plugin.methods)
    seconds = time.perf_counter() - t0
    print(table(rows))
    if not args.no_save and not args.k:
        print(f"saved {save(args.tests, rows, cases, seconds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
