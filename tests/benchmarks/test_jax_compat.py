"""benchmarks/jax_compat.py counts JAX's shard_map tests by method (issue 58): a
parametrised method's cases count once, and each failing method carries its cause.

These tests need no JAX: they run the counting on case rows of the results file's form
and the method lookup on pytest's own collection of a unittest file."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = os.path.join(ROOT, "benchmarks", "jax_compat.py")


@pytest.fixture
def jc(monkeypatch):
    # The module sets these for its own run when they are unset: keep them as they are
    # here, and undone after the test.
    monkeypatch.setenv("SPMD_NUM_DEVICES", os.environ.get("SPMD_NUM_DEVICES", "1"))
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    spec = importlib.util.spec_from_file_location("jax_compat", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def case(test, outcome, why=""):
    return {"test": test, "outcome": outcome, "why": why}


def test_parametrised_cases_count_once_and_fail_together(jc):
    cases = [case("T::test_a0", "pass"),
             case("T::test_a1", "fail", "spmd.errors.DTypeError: no bfloat16"),
             case("T::test_a2", "fail", "AssertionError: 1 != 2"),
             case("T::test_b", "pass")]
    methods = {"T::test_a0": "T::test_a", "T::test_a1": "T::test_a",
               "T::test_a2": "T::test_a", "T::test_b": "T::test_b"}
    rows = jc.by_method(cases, methods)
    assert [r["test"] for r in rows] == ["T::test_a", "T::test_b"]
    a, b = rows
    assert a["outcome"] == "fail"
    assert (a["error"], a["why"]) == ("DTypeError", "no bfloat16")  # the first failure's
    assert a["failed_cases"] == ["test_a1", "test_a2"]
    assert a["case_outcomes"] == {"pass": 1, "fail": 2}
    assert (b["outcome"], b["failed_cases"], b["error"]) == ("pass", [], "")


def test_method_outcomes_follow_their_cases(jc):
    def one(*cases):
        row, = jc.by_method(list(cases), {c["test"]: "T::m" for c in cases})
        return row

    assert one(case("T::m0", "n/a", "skipped: gpu"), case("T::m1", "n/a"))["outcome"] == "n/a"
    # n/a cases are not applicable: the method is judged on the others.
    assert one(case("T::m0", "n/a"), case("T::m1", "pass"))["outcome"] == "pass"
    other = one(case("T::m0", "pass"), case("T::m1", "pass, other wording", "w"))
    assert (other["outcome"], other["why"]) == ("pass, other wording", "w")
    unclaimed = one(case("T::m0", "not claimed", "jax.new_ref"), case("T::m1", "pass"))
    assert (unclaimed["outcome"], unclaimed["why"]) == ("not claimed", "jax.new_ref")
    # A method that also fails on a claimed name fails, with that failure's cause.
    mixed = one(case("T::m0", "not claimed", "jax.new_ref"),
                case("T::m1", "fail", "ValueError: bad"))
    assert (mixed["outcome"], mixed["error"], mixed["why"]) == ("fail", "ValueError", "bad")
    assert mixed["failed_cases"] == ["m0", "m1"]


def test_a_case_not_in_the_collection_is_its_own_method(jc):
    row, = jc.by_method([case("T::test_x", "pass")], {})
    assert row["test"] == "T::test_x"


def test_split_cause(jc):
    assert jc.split_cause("spmd.errors.DTypeError: no bfloat16") == ("DTypeError",
                                                                    "no bfloat16")
    assert jc.split_cause("AssertionError: ValueError not raised") == (
        "AssertionError", "ValueError not raised")
    assert jc.split_cause("Timeout >120.0s") == ("", "Timeout >120.0s")


def test_table_heads_by_method_and_lists_failing_methods_with_causes(jc):
    cases = [case(f"T::test_a{i}", "pass") for i in range(9)]
    cases += [case("T::test_a9", "fail", "AssertionError: 28 != 2"),
              case("T::test_b", "pass"), case("T::test_c", "n/a", "skipped: gpu"),
              case("T::test_d", "not claimed", "jax.freeze")]
    methods = {f"T::test_a{i}": "T::test_a" for i in range(10)}
    text = jc.table(jc.by_method(cases, methods))
    # methods: a fails, b passes, c n/a, d not claimed: 1 of 3 applicable
    assert "| pass | 1 | 10 |" in text
    assert "| fail | 1 | 1 |" in text
    assert "| applicable (all but n/a) | 3 | 12 |" in text
    assert "**33.3%** (goal >= 90%: FAIL) | 83.3% |" in text
    assert "| `T::test_a` | fail | 1 of 10: `test_a9` | AssertionError: 28 != 2 |" in text
    assert "| `T::test_d` | not claimed | 1 of 1 | jax.freeze |" in text
    assert "`T::test_b`" not in text and "`T::test_c`" not in text


def test_methods_come_from_pytests_collection_of_parametrised_cases(jc, tmp_path):
    # absl's parametrised cases are functions made with functools.wraps around their
    # method, named after it plus a suffix; a plain method that only extends a
    # parametrised one's name stays its own.
    (tmp_path / "test_cases.py").write_text(textwrap.dedent("""
        import functools
        import unittest

        def cases(fn, suffixes):
            out = {}
            for s in suffixes:
                @functools.wraps(fn)
                def bound(self, s=s):
                    return fn(self, s)
                bound.__name__ = fn.__name__ + s
                out[bound.__name__] = bound
            return out

        def _p(self, s):
            pass
        _p.__name__ = "test_p"

        class T(unittest.TestCase):
            locals().update(cases(_p, ["0", "1", "_named"]))

            def test_p_extra(self):
                pass

            def test_plain(self):
                pass
        """))
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.dirname(PATH)!r})
        import jax_compat, pytest
        plugin = jax_compat.Collect()
        pytest.main([{str(tmp_path / 'test_cases.py')!r}, "--collect-only", "-q",
                     "-p", "no:cacheprovider"], plugins=[plugin])
        print("METHODS=" + json.dumps(plugin.methods))
        """)
    env = dict(os.environ, SPMD_NUM_DEVICES="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=str(tmp_path), env=env)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("METHODS=")]
    assert line, out.stdout + out.stderr
    assert json.loads(line[0][len("METHODS="):]) == {
        "T::test_p0": "T::test_p", "T::test_p1": "T::test_p",
        "T::test_p_named": "T::test_p", "T::test_p_extra": "T::test_p_extra",
        "T::test_plain": "T::test_plain"}


def test_an_error_without_a_message_takes_the_lines_that_follow(jc):
    text = "\n".join(["    def test_x(self):", ">       self.assertArraysEqual(a, b)",
                      "E       AssertionError: ", "E       Arrays are not equal",
                      "E       ", "E        [0, 0]: 28.0 (ACTUAL), 2.0 (DESIRED)",
                      "", "E   later: chained"])
    assert jc.first_error(text) == ("AssertionError: Arrays are not equal "
                                    "[0, 0]: 28.0 (ACTUAL), 2.0 (DESIRED)")
    assert jc.first_error("E   ValueError: bad\nE   more") == "ValueError: bad"
    assert jc.first_error("no E lines\nlast line") == "last line"
