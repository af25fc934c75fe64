"""Every example of docs/testing.md runs: the code blocks in order in one namespace, the
hypothesis property among them called, the fixture examples as a user's test file in
an inner pytest run, and the failure messages quoted there are the ones raised."""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np
import pytest

import spmd
from spmd import NamedSharding, P
from spmd.testing import assert_sharded_allclose
from tests.doc_blocks import fenced

pytest_plugins = ["pytester"]

DOC = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()


BLOCKS = [b for lang, b in fenced(DOC) if lang == "python"]
PLAIN = [b for lang, b in fenced(DOC) if lang == ""]


def test_the_page_has_its_examples():
    assert len(BLOCKS) == 5 and len(PLAIN) == 2


def test_the_code_blocks_run_in_order():
    ns: dict = {}
    for block in BLOCKS:
        if "def test_on_a_4x4_mesh" in block or "@pytest.mark.spmd(" in block:
            continue  # fixtures and ranks: run by pytest below
        exec(compile(block, "docs/testing.md", "exec"), ns)
    ns["test_double_plus_one"]()  # the hypothesis property, all its examples


def test_the_fixture_examples_run_under_pytest(pytester):
    block = next(b for b in BLOCKS if "def test_on_a_4x4_mesh" in b)
    body = block.replace("    ...\n", "    assert mesh.devices.size in (8, 16)\n")
    pytester.makepyfile(test_doc="import spmd\n" + body)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(sys.executable),
                                                    "mpiexec")), reason="needs MPI")
def test_the_multi_process_example_runs_under_pytest(pytester):
    block = next(b for b in BLOCKS if "@pytest.mark.spmd(" in b)
    pytester.makepyfile(test_doc=block)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_quoted_messages_are_the_raised_ones():
    mesh = spmd.make_mesh((4, 2), ("i", "j"))
    v = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    x = spmd.device_put(v, NamedSharding(mesh, P("i", "j")))
    want = v.copy()
    want[5, 3] += 1.0
    with pytest.raises(AssertionError) as e:
        assert_sharded_allclose(x, want, err_msg="step 3")
    assert _one_line(str(e.value)) == _one_line(PLAIN[0])
    w = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    with pytest.raises(AssertionError) as e:
        assert_sharded_allclose(spmd.device_put(w, NamedSharding(mesh, P("i"))),
                                spmd.device_put(w, NamedSharding(mesh, P(None, "j"))))
    assert _one_line(str(e.value)) == _one_line(PLAIN[1])
