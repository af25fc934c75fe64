"""Generate the results tables of ``docs/results.md`` from ``benchmarks/results/``.

Every table of the results page (``docs/performance.md`` explains them) is written by this
script from the recorded JSON files (never by hand), each with the date, the
commit and command that produced it, the machine and its load, so that a number
in the docs can always be traced to a run.  The text between the markers
``<!-- results: begin -->`` and ``<!-- results: end -->`` is replaced; the rest
of the page is left as it is.

Usage::

    python benchmarks/make_tables.py            # rewrite docs/results.md
    python benchmarks/make_tables.py --check    # exit 1 if the page is out of date
    python benchmarks/make_tables.py --print    # print the generated section only

``--quick`` smoke results (``tmp_quick_*.json``) are never used.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402

DOC = os.path.join(os.path.dirname(HERE), "docs", "results.md")
RESULTS = os.path.join(HERE, "results")
BEGIN, END = "<!-- results: begin -->", "<!-- results: end -->"
# The order of the sections; other result files follow in alphabetical order.
ORDER = ("mlp", "train", "data_parallel", "mpi_n2", "mpi_n4", "partitioner", "transformer")
# A 1-minute load average at or above this, before the run started, means other
# jobs shared the cores: ratios are then noisy and absolute times inflated.
LOADED_AT = 1.0


class ResultsError(ValueError):
    """A results file that cannot be turned into a table."""


def load_results(directory: str = RESULTS) -> list[dict]:
    """The recorded results documents, in :data:`ORDER` (quick smoke runs excluded)."""
    docs = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        name = os.path.basename(path)[:-len(".json")]
        if name.startswith("tmp_quick_"):
            continue
        with open(path) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise ResultsError(f"make_tables: {path} is not valid JSON ({e}); rerun the "
                                   "benchmark that writes it") from e
        if not isinstance(doc.get("rows"), list):
            raise ResultsError(f"make_tables: {path} has no 'rows' list; rerun the benchmark "
                               "that writes it")
        doc["_name"] = name
        docs.append(doc)
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(docs, key=lambda d: (rank.get(d["_name"], len(ORDER)), d["_name"]))


def _machine_line(machine: dict) -> str:
    blas = machine.get("blas", {})
    if blas.get("source") == "threadpoolctl":
        blas_text = ", ".join(f"{lib.get('internal_api')} {lib.get('version')} "
                              f"({lib.get('num_threads')} threads)"
                              for lib in blas.get("libraries", []))
    else:
        blas_text = f"{blas.get('name')} {blas.get('version')}"
    return (f"{machine.get('cpu', '?')}, {machine.get('usable_cores', '?')} usable cores, "
            f"Python {machine.get('python', '?')}, numpy {machine.get('numpy', '?')}, "
            f"BLAS {blas_text}")


def _load_line(machine: dict) -> str:
    start = machine.get("load_average_at_start")
    if not start:
        return "load not recorded"
    text = f"load average {start[0]:g} / {start[1]:g} / {start[2]:g} at start"
    if start[0] >= LOADED_AT:
        text = (f"**measured on a loaded machine** ({text}): ratios are noisy and absolute "
                "times inflated; to be rerun on a quiet machine")
    return text


def provenance_line(doc: dict) -> str:
    """One sentence: when, from which commit, by which command, where."""
    commit = doc.get("commit")
    if commit:
        where = f"commit `{commit[:10]}`" + (" with uncommitted changes" if doc.get("dirty")
                                              else "")
    else:
        where = "commit not recorded"
    command = f" by `{doc['command']}`" if doc.get("command") else ""
    wall = f", {doc['wall_seconds']:g} s" if doc.get("wall_seconds") is not None else ""
    return (f"Measured {doc.get('date', '(date not recorded)')} at {where}{command}{wall}; "
            f"{_machine_line(doc.get('machine', {}))}; {_load_line(doc.get('machine', {}))}.")


# Results whose rows are not timing samples: the benchmark module that wrote them
# renders its own table (a function ``table(rows) -> str``, or the one named after
# a colon).
OWN_TABLES = {"transformer": "bench_transformer", "engine": "bench_engine",
              "jax_shard_map_tests": "jax_compat", "scaling": "bench_scaling",
              "scaling_binding": "bench_scaling:binding_table",
              "scaling_probe": "bench_scaling:probe_table",
              "scaling_waits": "scaling_waits", "against": "against",
              "trace": "bench_trace", "fast_tier": "bench_fast_tier"}


def section(doc: dict) -> str:
    """The Markdown of one results file: a heading, its provenance and its table."""
    rows = doc["rows"]
    head = f"### `{doc['_name']}` (`benchmarks/results/{doc['_name']}.json`)"
    if doc["_name"] in OWN_TABLES:
        import importlib

        module, _, function = OWN_TABLES[doc["_name"]].partition(":")
        text = getattr(importlib.import_module(module), function or "table")(rows)
        return f"{head}\n\n{provenance_line(doc)}\n\n{text}\n"
    if rows and "median_s" not in rows[0]:
        rows = common.summarize(rows)
    return f"{head}\n\n{provenance_line(doc)}\n\n{common.table(rows)}\n"


def generate(directory: str = RESULTS) -> str:
    docs = load_results(directory)
    body = "\n".join(section(d) for d in docs) if docs else \
        "(no results recorded yet: run `make bench` and `make bench-mpi`)\n"
    return (f"{BEGIN}\n<!-- Generated by `python benchmarks/make_tables.py` from "
            f"benchmarks/results/*.json: edit those runs, not this text. -->\n\n{body}\n{END}")


def splice(page: str, generated: str) -> str:
    """``page`` with the text between the markers replaced by ``generated``."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ResultsError(f"make_tables: the page needs exactly one {BEGIN!r} followed by one "
                           f"{END!r}; add them where the results tables go")
    return page[:page.index(BEGIN)] + generated + page[page.index(END) + len(END):]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    ap.add_argument("--print", action="store_true", help="print the generated section only")
    ap.add_argument("--results", default=RESULTS, help="the results directory")
    ap.add_argument("--doc", default=DOC, help="the page to update")
    args = ap.parse_args(argv)
    generated = generate(args.results)
    if args.print:
        print(generated)
        return 0
    with open(args.doc) as f:
        page = f.read()
    new = splice(page, generated)
    if args.check:
        if new != page:
            print(f"{args.doc} is out of date: run python benchmarks/make_tables.py")
            return 1
        return 0
    if new != page:
        with open(args.doc, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
