"""benchmarks/against.py: the same benchmarks at two commits, alternating in one run."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
_spec = importlib.util.spec_from_file_location("against",
                                               os.path.join(ROOT, "benchmarks", "against.py"))
against = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(against)


def test_medians_read_both_results_formats():
    doc = {"rows": [
        {"benchmark": "psum[4 KiB]", "variant": "spmd", "times_s": [3.0, 1.0, 2.0]},
        {"benchmark": "psum[4 KiB]", "variant": "mpi4py", "times_s": [1.0],
         "median_s": 1.0},
        {"config": "small", "mesh": "1", "times_s": {"spmd": [4.0, 6.0, 5.0],
                                                     "torch": [1.0]}},
        {"matmul_rate": 1e9}]}
    assert against.medians(doc) == {"psum[4 KiB] / spmd": 2.0,
                                    "psum[4 KiB] / mpi4py": 1.0,
                                    "engine small mesh 1 / spmd": 5.0}


def test_table_shows_measured_rows_and_the_ratio_of_median_rounds():
    rows = [{"benchmark": "x / spmd", "base_s": [2e-6, 4e-6, 3e-6],
             "head_s": [3e-6, 3e-6, 9e-6]},
            {"benchmark": "x / floor", "base_s": [1e-6], "head_s": [2e-6]},
            {"benchmark": "x / added", "base_s": [1e-6], "head_s": [1e-6]}]
    text = against.table(rows)
    assert "| x / spmd | 3 µs | 3 µs | 1.00 |" in text
    assert "| x / floor | 1 µs | 2 µs | 2.00 |" in text and "added" not in text


@pytest.mark.parametrize("argv, says", [
    (["--base", "HEAD", "--benches", "call_path,nope"], "--benches: unknown ['nope']"),
    (["--benches", "mpi"], "give --base COMMIT or --base-tree DIR"),
    (["--base-tree", "/", "--rounds", "1"], "--base-tree '/': not a checkout of spmd"),
])
def test_bad_arguments_are_named(argv, says):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "against.py"),
                           *argv, "--no-save"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 2 and says in done.stderr, done.stderr
