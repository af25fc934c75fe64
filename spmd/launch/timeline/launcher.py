"""``spmd-run``'s side of a trace: its options, their checks before the job starts, the
ranks' spool directory, and after the job the merge, the summary and the picture.

    spmd-run -n 4 --trace trace.json.gz train.py     # merged trace + summary
    spmd-run -n 4 --trace-summary train.py           # the summary alone
    spmd-run -n 4 --trace-plot steps.png train.py    # summary + picture

Each rank records into ``<launch dir>/timeline/rank-<k>.jsonl``
(``SPMD_TRACE_DIR``, read by :mod:`spmd.launch._rank`); the launch directory is
already visible to every rank.  When the job ends -- finished, failed, timed out
or interrupted -- this module merges what the spool holds
(:mod:`spmd.launch.timeline.merge`), writes it, prints the summary after the
job's own output and draws the picture.  A failure of any of that is said in one
line and never replaces the job's exit status.

With ``--max-restarts`` every attempt's trace is written to ``PATH``; before an
attempt's is written, the previous attempt's is moved to ``PATH`` with
``.attempt-N`` before its suffix (``trace.attempt-1.json.gz``: the first attempt),
and the same for ``--trace-plot``.

``spmd-run`` imports this module and the merge's, never the compiler nor numpy;
matplotlib is loaded only to draw.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile

from spmd.errors import ArgumentError
from spmd.launch import _rank
from spmd.launch.timeline import merge, plot, summary

SPOOL_ENV = _rank.TRACE_DIR_ENV      # the spool directory, for the ranks
PATH_ENV = "SPMD_TRACE"              # --trace's default
RANK_VARS = (SPOOL_ENV, _rank.TRACE_EVENTS_ENV, _rank.TRACE_SKEW_ENV)  # (Open MPI exports)
_SUFFIXES = (".json.gz", ".json")
PROG = "spmd-run"


class TraceOptionError(ArgumentError):
    """A trace option or setting of ``spmd-run`` that cannot work (found before launch)."""


# ------------------------------------------------------------------ options

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--trace``, ``--trace-summary`` and ``--trace-plot`` to ``spmd-run``'s parser."""
    parser.add_argument(
        "--trace", metavar="PATH",
        help="record every rank's compiled calls, collectives and spans, and write them "
             "merged on one clock as a Chrome trace (Perfetto, chrome://tracing) to PATH, "
             "ending in .json or .json.gz, also when the job fails; prints the summary "
             f"(default: ${PATH_ENV}). With --max-restarts each attempt's trace is written "
             "to PATH, the previous one first moved to PATH with .attempt-N before its "
             "suffix (N=1: the first attempt)")
    parser.add_argument(
        "--trace-summary", action="store_true",
        help="record as --trace does and print the summary (each rank's compute, transfer "
             "and wait, the straggler, the collectives with the most waiting) without "
             "writing a trace file")
    parser.add_argument(
        "--trace-plot", metavar="PNG",
        help="record as --trace does and draw per-rank bars of compute, transfer and wait "
             "and each rank's step times to PNG (needs matplotlib; attempts named as "
             "--trace's)")


def apply_defaults(ns: argparse.Namespace, environ=None) -> None:
    """``--trace`` from ``$SPMD_TRACE`` when not given.

    >>> ns = argparse.Namespace(trace=None); apply_defaults(ns, {"SPMD_TRACE": "t.json"})
    >>> ns.trace
    't.json'
    """
    environ = os.environ if environ is None else environ
    ns.trace_option = "--trace"  # (what the errors name)
    if ns.trace is None and environ.get(PATH_ENV, "").strip():
        ns.trace, ns.trace_option = environ[PATH_ENV].strip(), f"${PATH_ENV}"


def wanted(ns: argparse.Namespace) -> bool:
    """Whether the job is traced (any of the three options)."""
    return bool(getattr(ns, "trace", None) or getattr(ns, "trace_summary", False)
                or getattr(ns, "trace_plot", None))


def check(ns: argparse.Namespace, environ=None) -> None:
    """Raise :class:`TraceOptionError` naming the option, its value and the fix when a
    trace option cannot work; nothing is made or left behind.

    >>> check(parse_args(["-n", "2", "--trace", "t.txt", "job.py"]))  # doctest: +SKIP
    TraceOptionError: --trace 't.txt': the trace is Chrome trace JSON; give a path ...
    """
    environ = os.environ if environ is None else environ
    if not wanted(ns):
        return
    path, png = getattr(ns, "trace", None), getattr(ns, "trace_plot", None)
    if path:
        option = getattr(ns, "trace_option", "--trace")
        if not path.endswith(_SUFFIXES):
            raise TraceOptionError(
                f"{option} {path!r}: the trace is Chrome trace JSON; give a path ending "
                f"in .json or .json.gz (e.g. {_stem(path)}.json.gz)")
        _writable_dir(option, path)
    if png:
        _writable_dir("--trace-plot", png)
        try:
            importlib.import_module("matplotlib")
        except ImportError as e:
            raise TraceOptionError(
                f"--trace-plot {png!r}: the picture needs matplotlib, which cannot "
                f"be imported ({e}); install it with `pip install matplotlib` (or "
                "the `spmd[examples]` extra), or leave out --trace-plot") from None
    try:
        _rank.trace_settings(environ)
    except ArgumentError as e:
        raise TraceOptionError(str(e)) from None


def _stem(path: str) -> str:
    return os.path.splitext(path)[0] or "trace"


def _writable_dir(option: str, path: str) -> None:
    """The directory ``path`` would be written in must exist and take a new file."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise TraceOptionError(f"{option} {path!r}: the directory {directory!r} does not "
                               "exist; create it, or give a path in an existing directory")
    try:  # (a trial file: os.access says yes to root on a read-only directory)
        with tempfile.TemporaryFile(dir=directory, prefix=".spmd-run-check-"):
            pass
    except OSError as e:
        raise TraceOptionError(f"{option} {path!r}: cannot write in {directory!r} "
                               f"({e.strerror}); give a path in a writable directory") from None


# ------------------------------------------------------------------ the job

def spool_dir(launch_dir: str) -> str:
    """Where the ranks of the attempt in ``launch_dir`` write their events."""
    return os.path.join(launch_dir, "timeline")


def rank_env(ns: argparse.Namespace, launch_dir: str, env: dict) -> None:
    """Have the ranks record into the attempt's spool (made here), when traced.
    ``$SPMD_TRACE`` names the launcher's output: the ranks do not see it."""
    env.pop(PATH_ENV, None)
    if wanted(ns):
        os.makedirs(spool_dir(launch_dir), exist_ok=True)
        env[SPOOL_ENV] = spool_dir(launch_dir)


def attempt_path(path: str, number: int) -> str:
    """``path`` with ``.attempt-<number>`` before its suffix.

    >>> attempt_path("out/trace.json.gz", 1)
    'out/trace.attempt-1.json.gz'
    """
    for suffix in _SUFFIXES + (os.path.splitext(path)[1],):
        if suffix and path.endswith(suffix):
            return f"{path[:-len(suffix)]}.attempt-{number}{suffix}"
    return f"{path}.attempt-{number}"


def finish(ns: argparse.Namespace, launch_dir: str, attempt: int = 0) -> None:
    """After attempt ``attempt`` (0: the first) of a traced job, however it ended: merge
    the spool, write the trace, print the summary to stderr, draw the picture.  Any
    failure is printed in one line (the job's status stays the caller's)."""
    if not wanted(ns):
        return
    try:
        trace = merge.merge(merge.read_parts(spool_dir(launch_dir)))
        if ns.trace:
            _keep_previous(ns.trace, attempt)
            merge.write(trace, ns.trace)
        text = summary.render(summary.summarize(trace))
    except Exception as e:  # noqa: BLE001 - the job's own status must come through
        print(f"{PROG}: the ranks' timelines could not be merged or written "
              f"({type(e).__name__}: {e}); the job's exit status is its own", file=sys.stderr)
        return
    where = f" (written to {ns.trace})" if ns.trace else ""
    print(f"{PROG}: timeline{where}:\n{text}", file=sys.stderr, flush=True)
    if ns.trace_plot:
        try:
            _keep_previous(ns.trace_plot, attempt)
            plot.plot(trace, ns.trace_plot)
        except Exception as e:  # noqa: BLE001 - as above
            print(f"{PROG}: --trace-plot {ns.trace_plot!r}: the picture could not be drawn "
                  f"({type(e).__name__}: {e})", file=sys.stderr)


def _keep_previous(path: str, attempt: int) -> None:
    """Before attempt ``attempt``'s output goes to ``path``: move the previous attempt's
    there to its ``.attempt-N`` name."""
    if attempt > 0 and os.path.exists(path):
        os.replace(path, attempt_path(path, attempt))
