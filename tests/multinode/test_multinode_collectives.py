"""Collectives and arrays across nodes: the multi-process test modules of
``tests/mpi`` run in place on the ranks of a job on emulated nodes, as ``make
test-mpi`` runs them on one machine, on 2 nodes of 2 ranks and on 3 nodes of
2 + 1 + 1 ranks (the modules' meshes need 4 devices).

A selection, for time: every collective on each mesh of ``tests.mpi.make_mesh``
over each axis and tuple of axes, in float32; ``psum`` in every dtype as well (a
dtype's MPI type and operation are used only where ranks are on different nodes);
``all_to_all`` with the split and concatenated dimensions different (both
orders); the gradients of collectives jitted over all four devices; and every test
of ``test_mpi_arrays.py``.  The dimensions left out (other dtypes of the data
movements, eager gradients, each axis's gradient, ``all_to_all`` within one
dimension) take the same paths across nodes as those kept.  All 1,363 tests take
about 100 s a layout on 2 cores, this selection about a third of that.
"""

from __future__ import annotations

import pytest

from tests.multinode.conftest import in_place_pytest

pytestmark = pytest.mark.timeout(300)

MODULES = ["tests/mpi/test_mpi_collectives.py", "tests/mpi/test_mpi_arrays.py"]
SELECTION = ("(not test_reductions or psum- or float32)"
             " and (test_reductions or not (f64 or f16 or bool or i32))"
             " and (not test_all_to_all or s0c1 or s1c0)"
             " and (not test_gradients_of_collectives or (jit and 2dT-a+b))")
# The selection held 347 tests when written; far fewer means it no longer selects
# what this module says (a renamed parameter, a module that vanished).
AT_LEAST = 250

LAYOUTS = {"2nodes": [2, 2], "3nodes": [2, 1, 1]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_collective_and_array_tests_pass_across_nodes(make_nodes, tmp_path, layout):
    slots = LAYOUTS[layout]
    nodes = make_nodes(len(slots))
    ranks = in_place_pytest(nodes, slots, tmp_path, ["-k", SELECTION, *MODULES])
    hosts = [f"node{k}" for k, n in enumerate(slots) for _ in range(n)]
    assert [r["host"] for r in ranks] == hosts
    for r in ranks:
        # pytest's exit 5 (nothing collected) is a failure here, as any other code.
        assert r["exit"] == 0 and not r["failed"], (r["rank"], r["exit"], r["failed"][:10])
        assert r["collected"] >= AT_LEAST and len(r["passed"]) == r["collected"], \
            (r["rank"], r["collected"], len(r["passed"]), r["skipped"][:10])
        assert r["passed"] == ranks[0]["passed"]  # the same tests, in the same order
    for module in MODULES:
        assert any(t.startswith(module) for t in ranks[0]["passed"]), module
    assert nodes.leftovers() == {}
