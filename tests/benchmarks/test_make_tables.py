"""benchmarks/make_tables.py: the performance page's tables come from the results files."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    spec = importlib.util.spec_from_file_location(
        "make_tables", os.path.join(ROOT, "benchmarks", "make_tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mt = _module()


def _write(directory, name, load=0.2, **extra):
    doc = {"benchmark": name, "date": "2026-12-01T21:00:00+00:00", "commit": "0123456789abcdef",
           "dirty": False, "command": "python benchmarks/run.py x", "wall_seconds": 3.5,
           "machine": {"cpu": "CPU", "usable_cores": 2, "python": "3.11", "numpy": "2.4",
                       "blas": {"source": "none"}, "load_average_at_start": [load, 0.5, 0.5]},
           "rows": [{"benchmark": "b", "variant": "floor", "times_s": [1e-3, 2e-3, 3e-3],
                     "baseline": None, "goal_ratio": None, "goal_max_s": None, "unit": "ms",
                     "note": ""},
                    {"benchmark": "b", "variant": "spmd", "times_s": [2e-3, 4e-3, 6e-3],
                     "baseline": "floor", "goal_ratio": 1.5, "goal_max_s": None, "unit": "ms",
                     "note": ""}], **extra}
    with open(os.path.join(directory, f"{name}.json"), "w") as f:
        json.dump(doc, f)


def test_generated_section_has_provenance_and_ratios(tmp_path):
    _write(tmp_path, "mlp")
    _write(tmp_path, "tmp_quick_mlp")  # smoke runs are never used
    text = mt.generate(str(tmp_path))
    assert text.count("### ") == 1
    assert "commit `0123456789`" in text and "`python benchmarks/run.py x`" in text
    assert "2026-12-01T21:00:00+00:00" in text
    # median 4 ms against 2 ms: ratio 2, goal 1.5 missed
    assert "2.000" in text
    assert "FAIL" in text
    assert "loaded machine" not in text


def test_loaded_machine_is_marked(tmp_path):
    _write(tmp_path, "mlp", load=3.2)
    assert "measured on a loaded machine" in mt.generate(str(tmp_path))


def test_order_follows_the_page(tmp_path):
    for name in ("zeta", "mpi_n2", "mlp"):
        _write(tmp_path, name)
    text = mt.generate(str(tmp_path))
    assert text.index("`mlp`") < text.index("`mpi_n2`") < text.index("`zeta`")


def test_splice_replaces_only_between_markers():
    page = f"intro\n{mt.BEGIN}\nold\n{mt.END}\noutro\n"
    out = mt.splice(page, f"{mt.BEGIN}\nnew\n{mt.END}")
    assert out == f"intro\n{mt.BEGIN}\nnew\n{mt.END}\noutro\n"


def test_splice_without_markers_names_them():
    with pytest.raises(mt.ResultsError, match="results: begin"):
        mt.splice("no markers here", "x")


def test_bad_results_file_is_named(tmp_path):
    (tmp_path / "mlp.json").write_text("{not json")
    with pytest.raises(mt.ResultsError, match="mlp.json"):
        mt.generate(str(tmp_path))
    (tmp_path / "mlp.json").write_text("{}")
    with pytest.raises(mt.ResultsError, match="no 'rows'"):
        mt.generate(str(tmp_path))


def test_check_mode(tmp_path):
    _write(tmp_path, "mlp")
    page = tmp_path / "perf.md"
    page.write_text(f"a\n{mt.BEGIN}\n{mt.END}\nb\n")
    args = ["--results", str(tmp_path), "--doc", str(page)]
    assert mt.main(args + ["--check"]) == 1
    assert mt.main(args) == 0
    assert mt.main(args + ["--check"]) == 0


def test_the_repository_page_is_up_to_date():
    """docs/results.md shows what benchmarks/results/ holds."""
    assert mt.main(["--check"]) == 0
