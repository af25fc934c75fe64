"""``spmd-run`` leaves no shared-memory segment behind, whatever ends the job
(spmd.launch.cleanup, Job.cleanup).

Each test launches a small job whose ranks run a psum large enough to go through
spmd's own shared window, then print the ``/dev/shm`` files they map (MPICH's
``mpich_shm_*`` segment of the job, the windows) and fail in one way.  After
``spmd-run`` has returned, none of those files may be left.  The check is on the
files this job's ranks had mapped (same path, same inode), not on the whole
directory: other jobs (other tests, other users) create and remove segments
meanwhile (``new_unused`` shows what else appeared, in the failure message).

Jobs run under ``python -m spmd.launch`` with a time limit (their process group
is killed past it); runs of 3 ranks on a 2-core machine take 5-15 s each.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.launch.jobs import (HEADER, SHM, Launch, new_unused, listing,  # noqa: E402
                               reported, still_there)

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM) or not sys.platform.startswith("linux"),
                                reason="needs Linux's /dev/shm")

_FAILURES = {
    # a rank killed by a signal that cannot be caught
    "sigkill": ({}, [], textwrap.dedent("""
        if me == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        step(x)
    """), 137),
    # a collective deadline: the watchdog ends the job with MPI_Abort
    "deadline": ({"SPMD_COLLECTIVE_TIMEOUT": "3"}, [], textwrap.dedent("""
        if me == 1:
            time.sleep(60)
        step(x)
    """), 1),
    # an exception on one rank
    "exception": ({}, [], textwrap.dedent("""
        if me == 1:
            raise ValueError("boom")
        step(x)
    """), 1),
    # an early exit: rank 1 finishes while the others wait for it (stranded)
    "early-exit": ({"SPMD_COLLECTIVE_TIMEOUT": ""}, [], textwrap.dedent("""
        if me == 1:
            sys.exit(0)
        step(x)
    """), 1),
    # the launcher's --timeout
    "timeout": ({}, ["--timeout", "8"], textwrap.dedent("""
        time.sleep(60)
    """), 124),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", list(_FAILURES))
def test_a_failed_job_leaves_no_shared_memory(tmp_path, kind):
    env, options, failure, expected = _FAILURES[kind]
    before = listing()
    job = Launch(HEADER + failure, 3, tmp_path, options=options, env=env)
    status = job.wait(120)
    out = job.out
    assert status is not None, f"the job hung:\n{out}"
    assert status == expected, out
    segments = reported(out)
    # With MPICH: the job's mpich_shm_* segment, the file that used to be left behind.
    assert segments, f"the ranks reported no shared-memory file:\n{out}"
    left = still_there(segments)
    assert not left, (f"left in {SHM} after a job ended by {kind}: {left} (new files no "
                      f"process uses: {new_unused(before)})\n{out}")


# A file a rank makes in /dev/shm well after the start (after its first psum), maps,
# and still holds when it dies with SIGKILL a moment later: no rank record names it,
# so only the launcher's read of the ranks' mappings, which a new file in /dev/shm
# sets off, can (its slow periodic read, every SEGMENT_SCAN_S = 5 s, comes too late).
_MID_RUN = HEADER + textwrap.dedent("""
    import mmap
    if me == 1:
        time.sleep(0.5)
        path = f"/dev/shm/spmd-test-mid-run-{os.getpid()}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, 1 << 16)
        held = mmap.mmap(fd, 1 << 16)
        os.close(fd)
        print("SEGMENTS " + json.dumps({path: os.stat(path).st_ino}), flush=True)
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    step(x)
""")


@pytest.mark.timeout(150)
def test_a_file_made_mid_run_and_left_by_a_killed_rank_is_removed(tmp_path):
    from spmd.launch import job

    assert job.SEGMENT_SCAN_S >= 3  # (else the periodic read alone would find it)
    job_ = Launch(_MID_RUN, 2, tmp_path)
    status = job_.wait(120)
    out = job_.out
    assert status == 137, out
    made = {p: i for p, i in reported(out).items() if "spmd-test-mid-run-" in p}
    assert len(made) == 1, out
    assert not still_there(made), f"left in {SHM}: {made}\n{out}"


@pytest.mark.timeout(150)
def test_a_job_that_succeeds_leaves_nothing_either(tmp_path):
    job = Launch(HEADER + "step(x)\n", 2, tmp_path)
    status = job.wait(120)
    assert status == 0, job.out
    assert not still_there(reported(job.out)), job.out


_LONG = HEADER + textwrap.dedent("""
    flag = sys.argv[0] + ".stop"
    while True:  # until the test creates the flag; the ranks agree on it with a psum
        seen = np.full(spmd.device_count(), float(os.path.exists(flag)), np.float32)
        if float(np.asarray(step(seen))[0]) > 0:
            break
        time.sleep(0.2)
    print(f"rank {me}: long job done", flush=True)
""")


@pytest.mark.timeout(240)
def test_a_failed_job_leaves_another_jobs_segments_alone(tmp_path):
    other = Launch(_LONG, 2, tmp_path, name="long.py")
    try:
        assert other.wait_for("SEGMENTS ", 2, 120), f"the long job did not start:\n{other.out}"
        theirs = reported(other.out)
        assert theirs, other.out
        failing = Launch(HEADER + _FAILURES["sigkill"][2], 3, tmp_path, name="failing.py")
        status = failing.wait(120)
        assert status == 137, failing.out
        ours = reported(failing.out)
        assert ours and not set(ours) & set(theirs), (ours, theirs)
        assert not still_there(ours), failing.out
        # The other job's segment survives, and the job goes on and completes.
        assert sorted(still_there(theirs)) == sorted(theirs), (theirs, other.out)
        (tmp_path / "long.py.stop").write_text("")
        status = other.wait(120)
        assert status == 0, other.out
        assert other.out.count("long job done") == 2, other.out
        assert not still_there(theirs), other.out
    finally:
        if other.proc.poll() is None:
            os.killpg(other.proc.pid, signal.SIGKILL)


# ------------------------------------------------------------ the pieces

def test_only_the_jobs_unused_files_are_removed(tmp_path):
    """spmd.launch.cleanup.Segments on a directory of its own: a file that was there
    before the job, one that someone still has open, one whose name now names another
    file, and one left by the job (only that one goes)."""
    from spmd.launch.cleanup import Segments, mapped_files

    d = str(tmp_path)
    (tmp_path / "older").write_text("there before the job")
    seg = Segments(d)
    for name in ("older", "held", "replaced", "left"):
        (tmp_path / name).write_text(name)
    held = open(tmp_path / "held")
    try:
        # What a rank of the job had open: all four (this process stands in for it).
        files = [open(tmp_path / n) for n in ("older", "replaced", "left")]
        seen = mapped_files("self", d)
        for f in files:
            f.close()
        assert sorted(os.path.basename(p) for p in seen) == ["held", "left", "older",
                                                             "replaced"]
        seg.add(seen)
        # Made while the job's file exists (so with another inode), then put in its place.
        (tmp_path / "new").write_text("another job's file of the same name")
        os.replace(tmp_path / "new", tmp_path / "replaced")
        assert sorted(seg.remove()) == [os.path.join(d, "left")]
        assert sorted(os.listdir(d)) == ["held", "older", "replaced"]
    finally:
        held.close()
    # Once nobody has it open, the job's file goes too.
    assert seg.remove() == [os.path.join(d, "held")]


def test_the_ranks_records_count_for_their_host_only(tmp_path):
    from spmd.launch.cleanup import Segments

    shm = tmp_path / "shm"
    shm.mkdir()
    seg = Segments(str(shm))
    (shm / "a").write_text("")
    (shm / "b").write_text("")
    launch = tmp_path / "launch"
    launch.mkdir()

    def key(name):
        st = os.stat(shm / name)
        return [st.st_dev, st.st_ino]

    (launch / "rank0.shm").write_text(json.dumps(
        {"rank": 0, "host": "here", "files": {str(shm / "a"): key("a")}}))
    (launch / "rank1.shm").write_text(json.dumps(
        {"rank": 1, "host": "elsewhere", "files": {str(shm / "b"): key("b")}}))
    seg.add_records(str(launch), "here")
    assert seg.remove() == [str(shm / "a")]
    assert os.listdir(shm) == ["b"]
