"""Every example of docs/explicit_sharding.md runs, in order in one namespace, and
prints the lines shown under it (JAX's explicit-sharding tutorial, ported by
changing imports)."""

from __future__ import annotations

import contextlib
import io
import pathlib

import pytest

from tests.doc_blocks import fenced

DOC = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "explicit_sharding.md").read_text()


def _examples() -> list:
    """``(code, expected printed text or None)`` for each python block."""
    blocks, res = fenced(DOC), []
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            res.append((body, nxt[1] if nxt is not None and nxt[0] == "" else None))
    return res


EXAMPLES = _examples()


def test_the_page_has_its_examples():
    assert len(EXAMPLES) == 13
    assert all(e is not None for _, e in EXAMPLES)


def test_the_examples_run_in_order_and_print_what_the_page_says():
    import spmd

    ns: dict = {}
    try:
        for k, (code, expected) in enumerate(EXAMPLES):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"docs/explicit_sharding.md (example {k})", "exec"), ns)
            if expected is not None:
                assert out.getvalue() == expected, f"example {k}"
    finally:
        spmd.sharding.set_mesh(None)  # the page sets a global mesh


@pytest.fixture(autouse=True)
def _no_mesh_left():
    yield
    import spmd

    spmd.sharding.set_mesh(None)
