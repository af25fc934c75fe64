"""``spmd-run --min-ranks M``: after ranks die, the next attempt runs on the survivors
(spmd/launch/elastic.py); a failure of the program restarts at the same size; fewer
than M survivors end the run with a clear error.  The options' errors, the decision
on real host lists, and real jobs on this machine (each with a time limit)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.launch.jobs import HEADER, Launch, reported, still_there  # noqa: E402

from spmd.launch import cli, elastic, hosts  # noqa: E402

# Rank 3 kills itself in attempt 0; every attempt prints its size.
_RANK3_DIES = HEADER + textwrap.dedent("""
    attempt = os.environ["SPMD_RESTART_ATTEMPT"]
    print(f"rank {me}: attempt {attempt} size {spmd.process_count()}", flush=True)
    if me == 3 and attempt == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    step(x)
    print(f"rank {me}: done", flush=True)
""")

# Every rank raises in attempt 0.
_EVERY_RANK_RAISES = HEADER + textwrap.dedent("""
    attempt = os.environ["SPMD_RESTART_ATTEMPT"]
    print(f"rank {me}: attempt {attempt} size {spmd.process_count()}", flush=True)
    if attempt == "0":
        raise RuntimeError("a bug on every rank")
    print(f"rank {me}: done", flush=True)
""")


# ------------------------------------------------------------------ the options

def _error(argv, tmp_path, capsys) -> str:
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    assert cli.main([*argv, str(script)]) == cli.USAGE_ERROR
    return capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_min_ranks_must_be_a_positive_integer(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["-n", "4", "--max-restarts", "1", "--min-ranks", value, "t.py"])
    assert e.value.code == cli.USAGE_ERROR
    err = capsys.readouterr().err
    assert "argument --min-ranks: expected a positive integer" in err and repr(value) in err, err


def test_min_ranks_more_than_n_is_an_error(tmp_path, capsys):
    err = _error(["-n", "4", "--max-restarts", "1", "--min-ranks", "5"], tmp_path, capsys)
    assert "--min-ranks 5 is more than -n 4" in err and "between 1 and 4" in err, err


def test_min_ranks_needs_max_restarts(tmp_path, capsys):
    err = _error(["-n", "4", "--min-ranks", "2"], tmp_path, capsys)
    assert "--min-ranks 2 needs --max-restarts N > 0 (got 0)" in err, err
    assert "add --max-restarts 1" in err, err


def test_spare_needs_min_ranks(tmp_path, capsys):
    err = _error(["-n", "2", "--hosts", "localhost:2", "--max-restarts", "1", "--spare", "b:2"],
                 tmp_path, capsys)
    assert "--spare is used by elastic restarts only; add --min-ranks M" in err, err


def test_spare_needs_hosts(tmp_path, capsys):
    err = _error(["-n", "2", "--max-restarts", "1", "--min-ranks", "1", "--spare", "b:2"],
                 tmp_path, capsys)
    assert "--spare takes a lost host's place, but the job names no hosts" in err, err


def test_spare_must_be_another_host(tmp_path, capsys):
    err = _error(["-n", "2", "--hosts", "a:1,b:1", "--max-restarts", "1", "--min-ranks", "1",
                  "--spare", "b:2"], tmp_path, capsys)
    assert "--spare names b, already one of the job's hosts" in err, err


def test_spare_must_be_readable(tmp_path, capsys):
    err = _error(["-n", "2", "--hosts", "a:2", "--max-restarts", "1", "--min-ranks", "1",
                  "--spare", "c:x"], tmp_path, capsys)
    assert "--spare" in err and "'x'" in err, err


# ------------------------------------------------------------------ the decision

def _loss(np, reports, killed, lost=None, faults=None):
    return elastic.lost_ranks(np, reports, faults or {}, killed, lost)


def test_what_counts_as_lost_ranks():
    ok = {"status": 0}
    # Killed by a signal, no Python error: lost.
    assert _loss(4, {0: ok, 1: ok, 2: ok}, {3: 9}) == elastic.Loss((3,), 9)
    # Several killed at once, as the summary says "one of them first, the others by
    # the job's cleanup": one died.
    tie = _loss(4, {}, {2: 9, 3: 9})
    assert (tie, tie.count) == (elastic.Loss((2, 3), 9, one_of=True), 1)
    # Every rank of one host killed (and only those): that host, all of them died.
    whole = elastic.lost_ranks(4, {}, {}, {2: 9, 3: 9}, None,
                               {0: "n0", 1: "n0", 2: "n1", 3: "n1"})
    assert (whole, whole.count) == (elastic.Loss((2, 3), 9), 2)
    # A host lost (spmd.launch.summary.lost_host): its ranks, though none was killed.
    assert _loss(4, {}, {}, ("node1", [2, 3], "silent")) == elastic.Loss((2, 3), "lost")
    # A Python error on any rank: the program's failure, not a lost rank.
    assert _loss(4, {0: {"status": 1}}, {3: 9}) is None
    # A fatal signal with a stack (faulthandler's dump): the program's crash.
    assert _loss(2, {0: ok}, {1: 11}, faults={1: "Fatal Python error: Segmentation fault"}) is None
    # mpiexec failing with no rank named: nothing to take away.
    assert _loss(2, {}, {}) is None


def test_without_hosts_the_lost_ranks_are_taken_away():
    nxt = elastic.next_attempt(elastic.Attempt(4, None, []), None, elastic.Loss((3,), 9), 2)
    assert (nxt.np, nxt.placement) == (3, None)
    assert nxt.why == "rank 3 killed by SIGKILL"


def test_one_of_several_killed_ranks_takes_one_rank_away():
    nxt = elastic.next_attempt(elastic.Attempt(4, None, []), None,
                               elastic.Loss((1, 2, 3), 9, one_of=True), 2)
    assert nxt.np == 3
    assert nxt.why == ("one of ranks 1, 2, 3 killed by SIGKILL (the others ended by the "
                       "job's cleanup)")
    # With hosts, which host died cannot be told: none of them is kept.
    placement = hosts.parse_hosts("a:2,b:2,c:2")
    nxt = elastic.next_attempt(elastic.Attempt(6, placement, []), hosts.assign(placement, 6),
                               elastic.Loss((1, 2), 9, one_of=True), 2)
    assert (nxt.np, nxt.placement) == (2, [("c", 2)])
    assert nxt.why == ("a, b lost (one of ranks 1, 2 killed by SIGKILL, the others ended by "
                       "the job's cleanup)")


def test_with_hosts_every_slot_of_a_lost_host_is_left_out():
    placement = hosts.parse_hosts("node0:2,node1:3,node2:2")
    rank_hosts = hosts.assign(placement, 6)  # node2 runs one rank of its two slots
    nxt = elastic.next_attempt(elastic.Attempt(6, placement, []), rank_hosts,
                               elastic.Loss((3,), 9), 1)
    assert (nxt.np, nxt.placement) == (3, [("node0", 2), ("node2", 2)])
    assert nxt.why == "node1 lost (rank 3 killed by SIGKILL)"
    # Never more ranks than before on the hosts left (node2 ran one).
    assert hosts.assign(nxt.placement, nxt.np) == ["node0", "node0", "node2"]


def test_a_spare_host_takes_a_lost_hosts_place_once():
    placement = hosts.parse_hosts("node0:2,node1:2")
    spare = elastic.parse_spare("small:1,node2:2,node3:4")
    first = elastic.next_attempt(elastic.Attempt(4, placement, spare), hosts.assign(placement, 4),
                                 elastic.Loss((2, 3), "lost"), 2)
    # small has fewer slots than node1: the first spare with enough takes its place.
    assert (first.np, first.placement) == (4, [("node0", 2), ("node2", 2)])
    assert first.spare == [("small", 1), ("node3", 4)]
    assert first.why == "node1 lost (ranks 2, 3 stopped answering); spare node2 took its place"
    second = elastic.next_attempt(first, hosts.assign(first.placement, 4),
                                  elastic.Loss((0, 1), 9), 2)
    assert (second.np, second.placement, second.spare) == (4, [("node3", 4), ("node2", 2)],
                                                           [("small", 1)])
    # node3 runs all 4 ranks now (block placement); losing it leaves node2, which ran
    # none: no rank to run on, whatever --min-ranks.
    assert hosts.assign(second.placement, 4) == ["node3"] * 4
    with pytest.raises(elastic.ElasticError, match=r"--min-ranks 1: only 0 of 4 ranks"):
        elastic.next_attempt(second, hosts.assign(second.placement, 4),
                             elastic.Loss((0,), 9), 1)


def test_too_few_survivors_name_the_numbers():
    placement = hosts.parse_hosts("node0:2,node1:2")
    with pytest.raises(elastic.ElasticError) as e:
        elastic.next_attempt(elastic.Attempt(4, placement, []), hosts.assign(placement, 4),
                             elastic.Loss((2, 3), 9), 3)
    assert str(e.value).startswith("--min-ranks 3: only 2 of 4 ranks are left after node1 "
                                   "lost (ranks 2, 3 killed by SIGKILL); not restarting"), e.value
    assert "Lower --min-ranks to at most 2" in str(e.value)


# ------------------------------------------------------------------ real jobs

def _sizes(out: str, attempt: int) -> list[int]:
    return [int(ln.rsplit(" ", 1)[1]) for ln in out.splitlines()
            if f": attempt {attempt} size " in ln]


@pytest.mark.timeout(240)
def test_a_killed_rank_restarts_on_the_survivors(tmp_path):
    job = Launch(_RANK3_DIES, 4, tmp_path, options=["--max-restarts", "1", "--min-ranks", "2"])
    status = job.wait(200)
    out = job.out
    assert status == 0, out
    first = _sizes(out, 0)  # (ranks killed by the job's end may not have printed)
    assert first and set(first) == {4}, out
    # Rank 3 killed; or, when mpiexec's cleanup ended others with the same SIGKILL at
    # the same moment (spmd.launch.job.Job.killed), one of them: one rank died.
    line = [ln for ln in out.splitlines() if ln.startswith("spmd-run: attempt 2 of 2 on ")]
    assert len(line) == 1, out
    if "one of" in line[0]:
        assert line[0].startswith("spmd-run: attempt 2 of 2 on 3 ranks: one of ranks "), out
        assert line[0].endswith(", 3 killed by SIGKILL (the others ended by the job's "
                                "cleanup)"), out
    else:
        assert line[0] == "spmd-run: attempt 2 of 2 on 3 ranks: rank 3 killed by SIGKILL", out
    assert _sizes(out, 1) == [3] * 3 and out.count(": done") == 3, out
    assert "restarting the job" not in out, out
    assert not still_there(reported(out)), out


@pytest.mark.timeout(240)
def test_too_few_survivors_end_the_run_with_the_failures_status(tmp_path):
    job = Launch(_RANK3_DIES, 4, tmp_path, options=["--max-restarts", "1", "--min-ranks", "4"])
    status = job.wait(200)
    out = job.out
    assert status == 128 + signal.SIGKILL, out
    assert "spmd-run: error: --min-ranks 4: only 3 of 4 ranks are left after " in out, out
    assert "not restarting. Lower --min-ranks to at most 3" in out, out
    assert _sizes(out, 1) == [] and "attempt 2 of 2" not in out, out
    assert not still_there(reported(out)), out


@pytest.mark.timeout(240)
def test_a_python_error_on_every_rank_restarts_at_the_same_size(tmp_path):
    job = Launch(_EVERY_RANK_RAISES, 4, tmp_path,
                 options=["--max-restarts", "1", "--min-ranks", "2"])
    status = job.wait(200)
    out = job.out
    assert status == 0, out
    assert "RuntimeError: a bug on every rank" in out, out
    assert ("spmd-run: attempt 2 of 2 on 4 ranks: the same size (the failure was not a lost "
            "rank)") in out, out
    assert _sizes(out, 1) == [4] * 4 and out.count(": done") == 4, out
