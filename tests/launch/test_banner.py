"""MPICH's BAD TERMINATION box is held back from the job's output (spmd-run's own
summary says what it says), and nothing else is: a program's own rules of '='
pass through."""

from __future__ import annotations

import io
import subprocess

from spmd.launch.job import Job

RULE = b"=" * 83 + b"\n"
BOX = [b"\n", RULE, b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n",
       b"=   PID 4242 RUNNING AT node1\n", b"=   KILLED BY SIGNAL: 9 (Killed)\n",
       b"=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES\n", RULE]


class _Fake:
    """Just what Job._copy_stdout reads: mpiexec's stdout."""

    def __init__(self, lines):
        self.stdout = io.BytesIO(b"".join(lines))


def _copy(lines, capfd):
    job = Job(["mpiexec"], {}, 4, "/nonexistent")
    job.proc = _Fake(lines)  # (no process: the copy loop reads the bytes given)
    job._copy_stdout()
    return job, capfd.readouterr().out


def test_the_box_is_held_and_read(capfd):
    end = (b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n"
           b"This typically refers to a problem with your application.\n"
           b"Please see the FAQ page for debugging suggestions\n")
    job, out = _copy([b"[0] step 1\n", *BOX, end, b"[1] after\n"], capfd)
    assert out == "[0] step 1\n[1] after\n"
    assert b"".join(job.held) == b"".join(BOX) + end and len(job.held) == len(BOX) + 3
    assert job.banner["signal"] == 9


def test_a_programs_own_rules_pass_through(capfd):
    lines = [b"\n", RULE, b"results\n", RULE, b"\n", b"\n", RULE, b"\n", RULE, RULE]
    job, out = _copy(lines, capfd)
    assert out == b"".join(lines).decode() and job.held == []


def test_exit_codes_of_several_hosts_are_read_and_not_shown(capfd):
    job, out = _copy([b"[mpiexec@vm] Exit codes: [node0] 0,0\n", b"[node1] 9,0\n",
                      b"[2] tail\n"], capfd)
    assert out == "[2] tail\n" and job.banner["codes"] == [0, 0, 9, 0]


def test_mpiexec_own_messages_are_shortened(capfd):
    job = Job(["mpiexec"], {}, 4, "/nonexistent")
    job.proc = subprocess.Popen(
        ["sh", "-c", "echo '[mpiexec@vm] main (/src/mpiexec.c:270): process manager error' >&2;"
                     "echo '[2] a rank says' >&2"], stderr=subprocess.PIPE)
    job._copy_stderr()
    job.proc.wait()
    assert capfd.readouterr().err == "[2] a rank says\n"
    assert job.mpiexec_messages() == ("(mpiexec's own messages:)\n"
                                      "    [mpiexec@vm] main: process manager error")


def test_the_box_names_the_killed_process_and_its_host(capfd, tmp_path):
    """Across hosts Hydra may abort before its exit codes: the box's pid and host
    name the rank (its start record), its exit code the signal."""
    box = [b"\n", RULE, b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n",
           b"=   PID 11363 RUNNING AT node1\n", b"=   EXIT CODE: 9\n", RULE]
    (tmp_path / "rank2.pid").write_text('{"pid": 11363, "host": "node1"}')
    (tmp_path / "rank3.pid").write_text('{"pid": 11363, "host": "node0"}')
    job = Job(["mpiexec"], {}, 4, str(tmp_path))
    job.proc = _Fake(box)
    job._copy_stdout()
    assert capfd.readouterr().out == ""
    assert (job.banner["pid"], job.banner["host"], job.banner["exit"]) == (11363, "node1", 9)
    assert job.killed() == {2: 9}
    (tmp_path / "rank2.json").write_text('{"rank": 2, "status": 1}')  # it had a Python error
    assert job.killed() == {}
