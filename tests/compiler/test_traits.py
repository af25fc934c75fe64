"""Primitive traits (``spmd.compiler.core.primitives.TRAITS``): every primitive declares
them, only words of the vocabulary are used, the documentation lists them and every
rule key, and the generic passes give a primitive the treatment its traits ask for
(a toy primitive with the trait gets it, the same primitive without it does not).

The registry check runs in a fresh interpreter that imports every module of the
package: the primitives then registered are exactly those the package defines (tests
create toy primitives of their own, some of which stay registered).
"""

from __future__ import annotations

import itertools
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from spmd.compiler.passes import overlap
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.engine.codegen import compile_program
from spmd.compiler.core.ir import Eqn, Var
from spmd.compiler.ops.elementwise import add, mul
from spmd.compiler.ops.slicing import concatenate
from spmd.compiler.ops.structural import broadcast_in_dim, reshape
from spmd.compiler.core.primitives import PRIMITIVES, TRAITS, Primitive
from spmd.compiler.transforms.remat import checkpoint_policies
from spmd.compiler.core.trace import bind, trace_to_program

ROOT = pathlib.Path(__file__).resolve().parents[2]
F32 = np.dtype(np.float32)

_SCAN = r"""
import importlib, json, pkgutil
import spmd, spmd.numpy, spmd.lax, spmd.random, spmd.nn, spmd.scipy, spmd.collectives
import spmd.debug
for m in pkgutil.walk_packages(spmd.__path__, "spmd."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
from spmd.compiler.core.primitives import PRIMITIVES
print(json.dumps({n: {"declared": p.traits_declared, "traits": sorted(p.traits),
                      "rules": sorted(p.rules.names())} for n, p in PRIMITIVES.items()}))
"""


@pytest.fixture(scope="module")
def registry() -> dict:
    """``{name: {"declared", "traits", "rules"}}`` of every primitive the package defines."""
    done = subprocess.run([sys.executable, "-c", _SCAN], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_primitive_declares_its_traits(registry):
    assert len(registry) > 100 and {"add", "reshape", "dot_general", "psum", "mpi",
                                    "shard_map", "jit"} <= registry.keys()
    missing = sorted(n for n, r in registry.items() if not r["declared"])
    if missing:
        pytest.fail(f"{len(missing)} primitive(s) declare no traits: {', '.join(missing)}.\n"
                    "Create each with Primitive(name, traits=(...)) -- traits=() for none; "
                    f"the vocabulary: {sorted(TRAITS)} (spmd/compiler/core/primitives.py).",
                    pytrace=False)


def test_every_trait_is_in_the_vocabulary(registry):
    unknown = sorted(f"{n}: {t}" for n, r in registry.items() for t in r["traits"]
                     if t not in TRAITS)
    assert not unknown, f"traits outside spmd.compiler.core.primitives.TRAITS: {unknown}"


def test_an_unknown_trait_is_refused_and_nothing_is_registered():
    with pytest.raises(ValueError, match=r"unknown trait.*'viewish'"):
        Primitive("toy_unknown_trait", traits=("viewish",))
    assert "toy_unknown_trait" not in PRIMITIVES


def test_the_traits_of_todays_primitives(registry):
    """The primitives each trait stands for (the name lists the passes compared before
    traits): changing one of these sets changes generated code."""
    holders = {t: sorted(n for n, r in registry.items() if t in r["traits"]) for t in TRAITS}
    assert holders["view"] == ["broadcast_in_dim", "reshape", "slice", "squeeze", "transpose"]
    assert holders["implicit_broadcast"] == sorted(
        ["add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "and", "or", "xor",
         "eq", "ne", "lt", "le", "gt", "ge", "select_n"])
    assert holders["broadcast"] == ["broadcast_in_dim"]
    assert holders["fresh_result"] == ["dot_general", "dynamic_update_slice", "fused_elementwise",
                                       "fused_rows", "scatter", "select_n"]
    assert holders["dot"] == ["dot_general"]
    assert holders["same_order"] == ["reshape"]
    assert holders["sum"] == ["reduce_sum"]


def _section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Primitives and their rules")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _table_keys(section: str, header: str) -> set:
    """The backquoted names in the first column of the table whose header row starts
    with ``header``."""
    lines = section.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(header))
    keys = set()
    for ln in itertools.takewhile(lambda s: s.startswith("|"), lines[at + 2:]):
        m = re.match(r"\|\s*`([a-z_]+)`", ln)
        if m:
            keys.add(m.group(1))
    return keys


def test_the_documentation_lists_every_trait_and_every_rule_key(registry):
    section = _section()
    traits = _table_keys(section, "| Trait")
    assert traits == set(TRAITS), ("docs/architecture.md's trait table differs from "
                                   f"TRAITS: {sorted(traits ^ set(TRAITS))}")
    used = {k for r in registry.values() for k in r["rules"]}
    documented = _table_keys(section, "| Rule key")
    assert used <= documented, ("rule keys without a row in docs/architecture.md "
                                f"('Primitives and their rules'): {sorted(used - documented)}")


# ------------------------------------------------------------ the treatment

_ids = itertools.count()


@pytest.fixture
def toy():
    """``toy(traits, impl, aval=None)``: a fresh primitive, removed afterwards."""
    made = []

    def make(traits, impl, aval=None):
        p = Primitive(f"toy_traits_{next(_ids)}", traits=traits)
        p.def_impl(impl)
        p.def_abstract_eval(aval or (lambda x, *rest, **params: ShapedArray(x.shape, x.dtype)))
        made.append(p)
        return p

    yield make
    for p in made:
        PRIMITIVES.pop(p.name, None)


def _compile(fn, *shapes):
    closed = trace_to_program(fn, [ShapedArray(s, F32) for s in shapes])
    return compile_program(closed)


def _args(*shapes):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(F32) for s in shapes]


@pytest.mark.parametrize("is_view", [True, False])
def test_view_results_are_never_written_into_a_flat_buffer(toy, is_view):
    """``concatenate(reshape(g), ...)``: a ``g`` computed by the program is written
    into the buffer (``xp.empty`` first); the result of a ``view`` primitive may alias
    its operand, so it is copied in by the concatenate instead."""
    p = toy(("view",) if is_view else (), lambda xp, x: x[...])
    exe = _compile(lambda x, y: [concatenate([reshape(bind(p, mul(x, 2.0)), (12,)),
                                              reshape(y, (5,))], 0)], (3, 4), (5,))
    assert ("xp.empty(" in exe.source) is not is_view, exe.source
    x, y = _args((3, 4), (5,))
    for _ in range(2):  # again: buffers reused between calls stay right
        (got,) = exe(x, y)
        np.testing.assert_array_equal(got, np.concatenate([(x * 2).ravel(), y]))


@pytest.mark.parametrize("is_view", [True, False])
def test_view_equations_are_never_heavy_for_overlap(toy, is_view):
    p = toy(("view",) if is_view else (), lambda xp, x: x)
    big = ShapedArray((overlap.HEAVY_ELEMENTS,), F32)
    assert overlap._heavy(Eqn(p, [Var(big)], [Var(big)], {})) is not is_view


@pytest.mark.parametrize("implicit", [True, False])
def test_implicit_broadcast_operands_are_not_materialised(toy, implicit):
    """``op(x, broadcast_in_dim(b))``: an ``implicit_broadcast`` primitive gets ``b``
    itself (numpy broadcasts it); another one gets the broadcast array."""
    p = toy(("implicit_broadcast",) if implicit else (), lambda xp, x, y: xp.add(x, y))
    p.def_emit(lambda ins: f"xp.add({ins[0]}, {ins[1]})")
    exe = _compile(lambda x, b: [bind(p, x, broadcast_in_dim(b, (3, 4), (1,)))], (3, 4), (4,))
    assert ("broadcast_to" in exe.source) is not implicit, exe.source
    x, b = _args((3, 4), (4,))
    np.testing.assert_array_equal(exe(x, b)[0], x + b)


def _bcast_impl(xp, x, *, shape, broadcast_dimensions):
    expanded = [1] * len(shape)
    for d, s in zip(broadcast_dimensions, x.shape):
        expanded[d] = s
    return xp.broadcast_to(x.reshape(expanded), shape)


@pytest.mark.parametrize("is_broadcast", [True, False])
def test_a_broadcast_primitive_is_left_to_the_ufunc(toy, is_broadcast):
    """A ``broadcast`` primitive (broadcast_in_dim's params) feeding a ufunc becomes a
    reshape of its operand; without the trait its impl is called."""
    p = toy(("broadcast",) if is_broadcast else (), _bcast_impl,
            lambda x, *, shape, broadcast_dimensions: ShapedArray(shape, x.dtype))
    exe = _compile(lambda x, b: [mul(x, bind(p, b, shape=(3, 4), broadcast_dimensions=(0,)))],
                   (3, 4), (3,))
    assert (f"_{p.name}_" in exe.source) is not is_broadcast, exe.source
    x, b = _args((3, 4), (3,))
    np.testing.assert_array_equal(exe(x, b)[0], x * b[:, None])


@pytest.mark.parametrize("fresh", [True, False])
def test_a_fresh_result_buffer_is_reused(toy, fresh):
    """``toy(x, w) + y``: the sum is written into a ``fresh_result``'s buffer (nothing
    else references it); into no other primitive's."""
    p = toy(("fresh_result",) if fresh else (), lambda xp, x, w: xp.matmul(x, w),
            lambda x, w: ShapedArray((x.shape[0], w.shape[1]), x.dtype))
    p.rules.emit_avals = lambda names, avals, xp=None, out=None: (  # as dot_general's
        f"({names[0]} @ {names[1]})" if out is None else
        f"xp.matmul({names[0]}, {names[1]}, out={out})")
    exe = _compile(lambda x, w, y: [add(bind(p, x, w), y)], (3, 4), (4, 5), (3, 5))
    assert ("out=" in exe.source) is fresh, exe.source
    x, w, y = _args((3, 4), (4, 5), (3, 5))
    np.testing.assert_allclose(exe(x, w, y)[0], x @ w + y, rtol=1e-6)


@pytest.mark.parametrize("is_dot", [True, False])
def test_dots_saveable_saves_dot_primitives(toy, is_dot):
    p = toy(("dot",) if is_dot else (), lambda xp, x, w: x @ w)
    dn = {"dimension_numbers": (((1,), (0,)), ((), ()))}
    batched = {"dimension_numbers": (((2,), (1,)), ((0,), (0,)))}
    assert checkpoint_policies.dots_saveable(p) is is_dot
    assert checkpoint_policies.dots_with_no_batch_dims_saveable(p, **dn) is is_dot
    assert checkpoint_policies.dots_with_no_batch_dims_saveable(p, **batched) is False


def test_rules_are_a_typed_record():
    """A primitive's further rules are named fields: a misspelt one is an error, not a
    rule nobody reads."""
    from spmd.compiler.core.primitives import Rules

    rules = Rules()
    rules.partial_eval = len
    assert rules.names() == ["partial_eval"]
    with pytest.raises(AttributeError):
        rules.partial_evaluation = len
