"""Every registered primitive has every rule it needs.

The registry ``spmd.compiler.core.primitives.PRIMITIVES`` holds a primitive once the
module that defines it is imported (``spmd/__init__.py`` is lazy), so the tests
first import every module of the package.  Each test lists *all* offenders at once, so that one run
says what is left to write.  A primitive needs:

- ``impl`` and ``abstract_eval`` (to run eagerly and to be traced);
- ``jvp`` (forward mode; reverse mode is built from it by linearize + transpose);
- ``batch`` (``vmap``);
- ``transpose`` when it is declared ``linear=True`` (reverse mode).
"""

import importlib
import pkgutil

import pytest

import spmd
from spmd.compiler.core.primitives import PRIMITIVES, Primitive


@pytest.fixture(autouse=True, scope="module")
def _every_primitive():
    """Import every module, so that every primitive is registered (the backends and
    the front ends' primitives too), whatever ran before in this process."""
    for m in pkgutil.walk_packages(spmd.__path__, "spmd."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)


def _missing(attr: str, only_linear: bool = False) -> list[str]:
    return sorted(name for name, p in PRIMITIVES.items()
                  if (p.linear or not only_linear) and not callable(getattr(p, attr, None)))


def _fail(rule: str, names: list[str], why: str) -> None:
    pytest.fail(f"{len(names)} primitive(s) lack a {rule} rule: {', '.join(names)}.\n{why}",
                pytrace=False)


def test_registry_is_populated_and_consistent():
    for core in ("add", "mul", "tanh", "dot_general", "reduce_sum", "broadcast_in_dim",
                 "reshape", "convert_element_type", "select_n", "jit"):
        assert core in PRIMITIVES, f"core primitive {core!r} is not registered"
    for name, p in PRIMITIVES.items():
        assert isinstance(p, Primitive) and p.name == name


def test_every_primitive_has_impl_and_abstract_eval():
    missing = sorted(set(_missing("impl")) | set(_missing("abstract_eval")))
    if missing:
        _fail("impl/abstract_eval", missing,
              "Without them the primitive can neither run eagerly nor be traced.")


def test_every_primitive_has_jvp():
    missing = _missing("jvp")
    if missing:
        _fail("jvp", missing,
              "JVP RULES MISSING: spmd.jvp / spmd.grad / spmd.linearize fail on programs using "
              "these primitives. Every primitive needs a jvp (DESIGN.md section 3); a "
              "piecewise-constant one returns a symbolic Zero tangent.")


def test_every_primitive_has_batch():
    missing = _missing("batch")
    if missing:
        _fail("batch", missing,
              "BATCHING RULES MISSING: spmd.vmap fails on programs using these primitives.")


def test_every_linear_primitive_has_transpose():
    missing = _missing("transpose", only_linear=True)
    if missing:
        _fail("transpose", missing,
              "TRANSPOSE RULES MISSING: these primitives are declared linear=True, so reverse "
              "mode (spmd.vjp / spmd.grad) transposes them; write def_transpose.")


def test_emit_rules_are_callable_when_present():
    bad = sorted(name for name, p in PRIMITIVES.items()
                 if p.emit is not None and not callable(p.emit))
    assert not bad, f"emit rules that are not callable: {bad}"
