"""Where a collective comes from reaches its report as data (issue 24, item 5): the
equation being evaluated (``trace.current_equation``) and the jitted function being
prepared (``trace.preparing``), not read off the Python stack."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import spmd.numpy  # noqa: F401  (the operators of tracers; fills the extension points)
from spmd.collectives.mpi import control as mpi_control
from spmd.compiler.core.avals import ShapedArray
from spmd.compiler.core.primitives import PRIMITIVES, Primitive
from spmd.compiler.core.trace import (current_equation, current_function, eval_program, preparing,
                                 trace_to_program)


@pytest.fixture
def probe():
    """A primitive whose implementation records the context it runs in."""
    seen = []
    p = Primitive("site_probe")

    def impl(xp, x):
        seen.append((current_equation(), mpi_control.site_here("the probe")))
        return x

    p.def_impl(impl)
    p.def_abstract_eval(lambda a: a)
    yield p, seen
    del PRIMITIVES[p.name]


def _program(p):
    aval = ShapedArray((3,), np.dtype(np.float32), False)
    return trace_to_program(lambda x: [p.bind(x * 2.0) + 1.0], [aval])


def test_the_site_names_the_equation_and_the_function_being_prepared(probe):
    p, seen = probe
    closed = _program(p)
    with preparing("jit(step)"):
        (out,) = eval_program(closed, np.ones(3, np.float32))
    np.testing.assert_array_equal(np.asarray(out), 3.0)
    (eqn, site), = seen
    assert eqn is closed.program.eqns[1] and eqn.primitive is p
    assert site.program == "jit(step)" and "site_probe" in site.equation
    assert current_equation() is None and current_function() is None  # restored


def test_outside_a_prepared_call_the_site_says_eager_and_errors_restore_the_context(probe):
    p, seen = probe
    closed = _program(p)
    eval_program(closed, np.ones(3, np.float32))
    assert seen[-1][1].program.startswith("an eager shard_map")
    with pytest.raises(ZeroDivisionError):
        with preparing("jit(failing)"):
            1 / 0
    assert current_function() is None


def test_each_thread_has_its_own_context(probe):
    p, seen = probe
    closed = _program(p)
    names = {}

    def work(k):
        with preparing(f"jit(f{k})"):
            eval_program(closed, np.ones(3, np.float32))
            names[k] = current_function()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert names == {k: f"jit(f{k})" for k in range(4)}
    assert sorted(site.program for _, site in seen) == [f"jit(f{k})" for k in range(4)]
