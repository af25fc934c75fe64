"""``spmd-run --trace``, ``--trace-summary``, ``--trace-plot`` (spmd.launch.timeline.launcher):
real jobs of 2-4 ranks, each under a time limit (its process group is killed past it).

What they check: the merged file's format, the clock alignment (with every rank's
clock set ahead by ``SPMD_TRACE_TEST_SKEW``), the straggler named by the summary,
the trace of a job that failed or lost a rank to SIGKILL, the bounded buffer, the
attempts of ``--max-restarts``, and the options' checks before anything starts.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.mpi import PSUM_JOB, REPO_ROOT, mpiexec_or_skip, run_command  # noqa: E402

SKEW = 0.3
ALIGNED_US = 2000.0  # the bound: 2 ms


def _spmd_run(script: str, n: int, tmp_path, options=(), env=None, timeout: float = 150):
    """``spmd-run [options] -n n job.py``: (status or None on timeout, output)."""
    mpiexec_or_skip()
    path = tmp_path / "job.py"
    path.write_text(script)
    status, out, _ = run_command([sys.executable, "-m", "spmd.launch", *map(str, options),
                                  "-n", str(n), path], env=env, timeout=timeout)
    assert status is not None, f"the job hung:\n{out}"
    return status, out


def _read(path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _steps(count: int, late_rank: int | None = None, late_s: float = 0.0,
           pause_s: float = 0.0) -> str:
    """``count`` psum steps; ``late_rank`` sleeps ``late_s`` before each, every rank
    ``pause_s`` after each."""
    return PSUM_JOB + textwrap.dedent(f"""
        x = np.ones(spmd.device_count() * 4, np.float32)
        for i in range({count}):
            if me == {late_rank!r}:
                time.sleep({late_s!r})
            step(x)
            time.sleep({pause_s!r})
        print(f"rank {{me}}: steps done", flush=True)
    """)


def _calls(trace: dict) -> dict:
    """(comm, seq) -> {pid: {"wait": event, "transfer": event}} of the collectives."""
    calls: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == "collective":
            a = e["args"]
            calls.setdefault((a["comm"], a["seq"]), {}).setdefault(e["pid"], {})[a["phase"]] = e
    return calls


def _psums_of(trace: dict) -> dict:
    """pid -> the seq numbers of its psum calls."""
    out: dict = {}
    for (comm, seq), members in _calls(trace).items():
        for pid, phases in members.items():
            if phases["transfer"]["name"] == "psum":
                out.setdefault(pid, set()).add(seq)
    return out


@pytest.mark.timeout(300)
def test_the_merged_trace_is_chrome_json_on_one_aligned_clock(tmp_path):
    path = tmp_path / "trace.json.gz"
    status, out = _spmd_run(_steps(8), 4, tmp_path, ["--trace", path],
                            env={"SPMD_TRACE_TEST_SKEW": str(SKEW)})
    assert status == 0, out
    trace = _read(path)
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2, 3], names
    assert all(names[k].startswith(f"rank {k} (") and names[k].endswith(")") for k in names)
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in spans)
    # the recorded offsets: rank k's clock was k * 0.3 s ahead
    for k in range(4):
        clock = trace["otherData"]["clock"][str(k)]
        assert abs(clock["offset_us"] - SKEW * k * 1e6) < ALIGNED_US, (k, clock)
        assert clock["error_us"] < ALIGNED_US, (k, clock)
    calls = _calls(trace)
    psums = [c for c in calls.values() if next(iter(c.values()))["wait"]["name"] == "psum"]
    assert len(psums) == 8, sorted(calls)
    for members in calls.values():
        assert sorted(members) == [0, 1, 2, 3], members  # the same seq on every member
        for phases in members.values():
            assert set(phases) == {"wait", "transfer"}
            args = phases["transfer"]["args"]
            assert args["op"] == phases["transfer"]["name"] and args["comm"] == "0,1,2,3"
            assert isinstance(args["bytes"], int)
        # (in microseconds, on the common clock: 0.3 s of skew would show as 300000)
        last_arrival = max(p["wait"]["ts"] for p in members.values())
        for phases in members.values():
            t = phases["transfer"]
            assert t["ts"] + t["dur"] >= last_arrival - ALIGNED_US, members
        starts = [p["transfer"]["ts"] for p in members.values()]
        assert max(starts) - min(starts) <= ALIGNED_US, members
    assert all(p["transfer"]["args"]["bytes"] == 16 for c in psums for p in c.values())
    assert "spmd timeline: 4 ranks" in out and f"(written to {path})" in out, out


@pytest.mark.timeout(300)
def test_a_rank_that_sleeps_before_every_step_is_named_the_straggler(tmp_path):
    status, out = _spmd_run(_steps(30, late_rank=2, late_s=0.02), 4, tmp_path,
                            ["--trace-summary"])
    assert status == 0, out
    assert "straggler: rank 2 (" in out, out
    assert not list(tmp_path.glob("*.json*")), "--trace-summary wrote a file"


@pytest.mark.timeout(300)
def test_a_failed_job_leaves_a_trace_of_every_ranks_steps_before_the_failure(tmp_path):
    path = tmp_path / "trace.json"
    # 2 s of steps: the ranks mpiexec ends have written their files meanwhile (their
    # recorders write four times a second; the failing rank writes at its end)
    script = _steps(20, pause_s=0.1) + textwrap.dedent("""
        if me == 1:
            raise RuntimeError("boom after twenty steps")
        step(x)
    """)
    status, out = _spmd_run(script, 3, tmp_path, ["--trace", path])
    assert status == 1, out
    assert "boom after twenty steps" in out, out
    seqs = _psums_of(_read(path))
    assert sorted(seqs) == [0, 1, 2], seqs
    # (the others lose at most their last quarter second, ~3 steps; 10 leaves room
    # for a loaded machine's late writes)
    assert len(seqs[1]) == 20 and len(seqs[0]) >= 10 and len(seqs[2]) >= 10, seqs
    # the summary comes after the failure's
    assert out.index("spmd timeline:") > out.index("boom after twenty steps"), out


@pytest.mark.timeout(300)
def test_a_rank_killed_by_sigkill_leaves_what_it_recorded_a_second_before(tmp_path):
    path = tmp_path / "trace.json"
    # 2 s of steps: the killed rank's recorder wrote its file at least once meanwhile
    script = _steps(20, pause_s=0.1) + textwrap.dedent("""
        if me == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        step(x)
    """)
    status, out = _spmd_run(script, 3, tmp_path, ["--trace", path])
    assert status == 128 + 9, out
    seqs = _psums_of(_read(path))
    assert sorted(seqs) == [0, 1, 2], seqs
    assert all(len(s) >= 5 for s in seqs.values()), seqs


@pytest.mark.timeout(300)
def test_a_full_buffer_drops_events_and_says_so(tmp_path):
    path = tmp_path / "trace.json"
    status, out = _spmd_run(_steps(80), 2, tmp_path, ["--trace", path],
                            env={"SPMD_TRACE_EVENTS": "50"})
    assert status == 0, out
    other = _read(path)["otherData"]
    assert all(other["dropped"][k] >= 30 for k in ("0", "1")), other
    assert "dropped events: rank 0 dropped" in out and "(capacity 50)" in out, out


@pytest.mark.timeout(300)
def test_each_attempt_of_a_restarted_job_keeps_its_trace(tmp_path):
    path = tmp_path / "trace.json"
    script = _steps(3) + "sys.exit(5)\n"
    status, out = _spmd_run(script, 2, tmp_path, ["--max-restarts", "1", "--trace", path])
    assert status == 5, out
    first, last = _read(tmp_path / "trace.attempt-1.json"), _read(path)
    for trace in (first, last):
        assert all(len(s) == 3 for s in _psums_of(trace).values()), trace
    assert out.count("spmd timeline: 2 ranks") == 2, out


@pytest.mark.timeout(300)
def test_the_trace_path_from_the_environment_and_the_picture(tmp_path):
    pytest.importorskip("matplotlib")
    path, png = tmp_path / "env.json", tmp_path / "steps.png"
    status, out = _spmd_run(_steps(4), 2, tmp_path, ["--trace-plot", png],
                            env={"SPMD_TRACE": str(path)})
    assert status == 0, out
    assert _psums_of(_read(path)), out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out


# ------------------------------------------------------------ the checks before launch

_MARK = "print('the job ran', flush=True)\n"


def _refused(tmp_path, options, env=None, contains=()):
    status, out = _spmd_run(_MARK, 2, tmp_path, options, env=env, timeout=60)
    assert status == 2, out
    assert "the job ran" not in out, out
    for text in contains:
        assert text in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"], "left something behind"
    return out


def test_a_trace_path_must_end_in_json(tmp_path):
    _refused(tmp_path, ["--trace", tmp_path / "trace.txt"],
             contains=[f"--trace '{tmp_path / 'trace.txt'}': the trace is Chrome trace JSON; "
                       "give a path ending in .json or .json.gz"])


def test_a_trace_path_from_the_environment_is_named_so(tmp_path):
    _refused(tmp_path, [], env={"SPMD_TRACE": "trace.csv"},
             contains=["$SPMD_TRACE 'trace.csv': the trace is Chrome trace JSON"])


def test_a_trace_path_in_a_missing_directory(tmp_path):
    _refused(tmp_path, ["--trace", tmp_path / "nowhere" / "t.json"],
             contains=[f"the directory '{tmp_path / 'nowhere'}' does not exist; create it"])


def test_a_trace_path_in_a_directory_that_cannot_be_written():
    # (/sys refuses new files even to root, whose os.access says yes to everything)
    import tempfile
    from pathlib import Path

    try:
        with tempfile.TemporaryFile(dir="/sys"):
            pytest.skip("/sys takes new files here")
    except OSError:
        pass
    with tempfile.TemporaryDirectory() as d:
        _refused(Path(d), ["--trace", "/sys/t.json"],
                 contains=["--trace '/sys/t.json': cannot write in '/sys'"])


def test_a_plot_in_a_missing_directory(tmp_path):
    _refused(tmp_path, ["--trace-plot", tmp_path / "nowhere" / "p.png"],
             contains=["--trace-plot", "does not exist"])


def test_a_plot_without_matplotlib(tmp_path):
    # matplotlib made unimportable for spmd-run: a package of that name that raises
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('matplotlib is hidden by the test')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(stub.parent), str(REPO_ROOT)])}
    status, out = _spmd_run(_MARK, 2, tmp_path, ["--trace-plot", tmp_path / "p.png"],
                            env=env, timeout=60)
    assert status == 2 and "the job ran" not in out, out
    assert "--trace-plot" in out and "needs matplotlib" in out and "pip install" in out, out
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("value", ["0", "lots"])
def test_a_bad_event_count_is_refused_before_launch(tmp_path, value):
    _refused(tmp_path, ["--trace-summary"], env={"SPMD_TRACE_EVENTS": value},
             contains=[f"SPMD_TRACE_EVENTS={value!r} is not a positive integer"])


def test_a_bad_test_skew_is_refused_before_launch(tmp_path):
    _refused(tmp_path, ["--trace-summary"], env={"SPMD_TRACE_TEST_SKEW": "soon"},
             contains=["SPMD_TRACE_TEST_SKEW='soon' is not a number of seconds"])


# ------------------------------------------------------------ other ends of a job

@pytest.mark.timeout(300)
def test_a_job_ended_by_its_timeout_leaves_a_trace(tmp_path):
    path = tmp_path / "trace.json"
    script = _steps(3) + "time.sleep(600)\n"
    status, out = _spmd_run(script, 2, tmp_path, ["--timeout", "20", "--trace", path])
    assert status == 124, out
    seqs = _psums_of(_read(path))
    assert sorted(seqs) == [0, 1], seqs  # (each wrote its file at least at the start)
    assert out.index("spmd timeline:") > out.index("--timeout"), out


@pytest.mark.timeout(300)
def test_the_deadline_writes_the_ranks_record_before_it_aborts(tmp_path):
    path = tmp_path / "trace.json"
    # rank 1 never comes to the fourth psum: rank 0's deadline fires and aborts the job
    script = _steps(3) + textwrap.dedent("""
        if me == 1:
            time.sleep(600)
        step(x)
    """)
    status, out = _spmd_run(script, 2, tmp_path, ["--trace", path],
                            env={"SPMD_COLLECTIVE_TIMEOUT": "3"})
    assert status not in (0, None), out
    assert "CollectiveTimeoutError" in out, out
    seqs = _psums_of(_read(path))
    assert len(seqs[0]) == 3, seqs


@pytest.mark.timeout(300)
def test_a_trace_that_cannot_be_written_keeps_the_jobs_status(tmp_path):
    where = tmp_path / "out"
    where.mkdir()
    # the job removes the trace's directory: the write at its end fails
    script = _MARK + f"import shutil, sys; shutil.rmtree({str(where)!r}, True); sys.exit(3)\n"
    status, out = _spmd_run(script, 2, tmp_path, ["--trace", where / "t.json"])
    assert status == 3, out
    assert "spmd-run: the ranks' timelines could not be merged or written (" in out, out
    assert "the job's exit status is its own" in out, out


@pytest.mark.timeout(300)
def test_a_job_of_one_rank_is_traced_too(tmp_path):
    path = tmp_path / "trace.json"
    status, out = _spmd_run(_steps(3), 1, tmp_path, ["--trace", path])
    assert status == 0, out
    names = [e["args"]["name"] for e in _read(path)["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(names) == 1 and names[0].startswith("rank 0 ("), names


def test_spmd_run_with_its_trace_modules_loads_no_compiler_and_no_numpy():
    import subprocess

    code = ("import sys, spmd.launch.cli, spmd.launch.timeline.launcher\n"
            "print(sorted(m for m in sys.modules if m.startswith('spmd.compiler.')))\n"
            "print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # (spmd/__init__ registers the extension points, which are no compiler; numpy would
    # start its BLAS threads in the launcher, for nothing)
    assert out.stdout.split() == ["['spmd.compiler.extensions']", "False"], out.stdout
