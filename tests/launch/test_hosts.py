"""``spmd-run``'s hosts: parsing --hosts, hostfiles and Slurm's variables, the
commands built for each MPI, and the reports that name hosts (no job is run here:
tests/multinode runs them on emulated nodes)."""

from __future__ import annotations

import pytest

from spmd.launch import cli, hosts, multihost, summary


def _ns(*argv, environ=None):
    ns = cli.parse_args(list(argv) + ["train.py", "--lr", "1"])
    cli.resolve_hosts(ns, {} if environ is None else environ)
    return ns


def _command(ns, impl="mpich", launch_dir="/shared/job-1"):
    env = cli.build_env(ns, launch_dir, environ={})
    return cli.build_command(ns, "mpiexec", impl, env), env


# ------------------------------------------------------------------ --hosts

def test_hosts_become_hydra_hosts_and_open_mpi_host():
    ns = _ns("-n", "3", "--hosts", "a:2,b:2")
    assert ns.rank_hosts == ["a", "a", "b"] and ns.remote
    cmd, env = _command(ns)
    assert cmd[cmd.index("-hosts") + 1] == "a:2,b:2"
    assert cmd[cmd.index("-n") + 1] == "3" and cmd[-3:] == ["train.py", "--lr", "1"]
    cmd, _ = _command(ns, "openmpi")
    assert cmd[cmd.index("--host") + 1] == "a:2,b:2" and "--oversubscribe" not in cmd
    # Open MPI exports only what it is told to: the launch directory and the channel.
    exported = [cmd[i + 1] for i, w in enumerate(cmd) if w == "-x"]
    assert "SPMD_LAUNCH_DIR" in exported and "SPMD_LAUNCHER_ALIVE" in exported


def test_threads_per_rank_follow_the_ranks_per_host(monkeypatch):
    monkeypatch.setattr(cli, "usable_cores", lambda: 8)
    _, env = _command(_ns("-n", "4", "--hosts", "a:2,b:2"))
    assert env["OMP_NUM_THREADS"] == "4"
    _, env = _command(_ns("-n", "4"))
    assert env["OMP_NUM_THREADS"] == "2"


def test_mpiexec_args_pass_verbatim_even_when_they_start_with_a_dash():
    ns = _ns("-n", "2", "--hosts", "a:1,b:1", "--mpiexec-arg", "-launcher",
             "--mpiexec-arg", "ssh", "--mpiexec-arg=-iface", "--mpiexec-arg", "lo")
    cmd, _ = _command(ns)
    i = cmd.index("-launcher")
    assert cmd[i:i + 4] == ["-launcher", "ssh", "-iface", "lo"] and cmd.index("-n") > i + 3
    clean = multihost.cleanup_command(ns, "mpiexec", "mpich", "/shared/job-1")
    assert clean[clean.index("-hosts") + 1] == "a:1,b:1" and "-launcher" in clean
    assert clean[-3:] == ["-m", "spmd.launch.cleanup", "/shared/job-1"]


def test_one_host_that_is_this_machine_is_not_remote():
    ns = _ns("-n", "2", "--hosts", "localhost:2")
    assert ns.rank_hosts == ["localhost", "localhost"] and not ns.remote


@pytest.mark.parametrize("text, bad", [("a:0", "'0'"), ("a:x", "'x'"), ("a,,b", "''"),
                                       ("a b", "'a b'")])
def test_a_bad_host_list_names_the_text_and_the_fix(text, bad):
    with pytest.raises(cli.LaunchError) as e:
        _ns("-n", "2", "--hosts", text)
    msg = str(e.value)
    assert f"--hosts {text!r}" in msg and bad in msg and "HOST:SLOTS" in msg, msg


def test_more_ranks_than_slots_is_an_error_naming_both():
    with pytest.raises(cli.LaunchError) as e:
        _ns("-n", "5", "--hosts", "a:2,b:2")
    assert str(e.value).startswith("-n 5 ranks do not fit the 4 slots of --hosts 'a:2,b:2' "
                                   "(a:2,b:2); lower -n to at most 4"), str(e.value)


def test_hosts_and_hostfile_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["-n", "2", "--hosts", "a", "--hostfile", "f", "t.py"])
    assert "--hosts 'a' and --hostfile 'f' both name the hosts; give one" in \
        capsys.readouterr().err


# ------------------------------------------------------------------ hostfiles

def test_a_hostfile_in_either_form_with_comments(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\n\nnode0 slots=2 max_slots=4\nnode1:3   # big\nnode2\n"
                    "node0 slots=1\n")
    assert hosts.read_hostfile(str(path)) == [("node0", 3), ("node1", 3), ("node2", 1)]
    ns = _ns("-n", "6", "--hostfile", str(path))
    cmd, _ = _command(ns, launch_dir=str(tmp_path))
    written = cmd[cmd.index("-f") + 1]
    assert open(written).read() == "node0:3\nnode1:3\nnode2:1\n"
    cmd, _ = _command(ns, "openmpi", launch_dir=str(tmp_path))
    assert open(cmd[cmd.index("--hostfile") + 1]).read() == \
        "node0 slots=3\nnode1 slots=3\nnode2 slots=1\n"


@pytest.mark.parametrize("line, bad", [("node1 slot=2", "'slot=2'"), ("node1:two", "'two'"),
                                       ("node1 slots=0", "'0'"), ("[bad", "'[bad'")])
def test_a_bad_hostfile_line_names_the_file_the_line_and_the_fix(tmp_path, line, bad):
    path = tmp_path / "hosts"
    path.write_text(f"node0:2\n# fine\n{line}\n")
    with pytest.raises(cli.LaunchError) as e:
        _ns("-n", "2", "--hostfile", str(path))
    msg = str(e.value)
    assert f"--hostfile {str(path)!r}, line 3 ({line!r})" in msg and bad in msg, msg
    assert "`HOST slots=SLOTS` (Open MPI)" in msg, msg


def test_a_missing_or_empty_hostfile_is_an_error(tmp_path):
    with pytest.raises(cli.LaunchError, match="cannot read it .* one a line"):
        _ns("-n", "2", "--hostfile", str(tmp_path / "none"))
    (tmp_path / "empty").write_text("# nothing\n\n")
    with pytest.raises(cli.LaunchError, match="lists no host"):
        _ns("-n", "2", "--hostfile", str(tmp_path / "empty"))


# ------------------------------------------------------------------ Slurm

@pytest.mark.parametrize("text, names", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a,b", ["a", "b"]), ("c[8-10]", ["c8", "c9", "c10"]),
    ("r[1-2]n[1,3]", ["r1n1", "r1n3", "r2n1", "r2n3"])])
def test_slurm_node_lists_expand(text, names):
    assert hosts.expand_nodelist(text) == names


def test_slurm_tasks_per_node():
    assert hosts.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(hosts.HostsError, match=r"SLURM_TASKS_PER_NODE='2\(x\)': cannot read"):
        hosts.tasks_per_node("2(x)")


def test_inside_slurm_the_allocation_places_the_ranks():
    slurm = {"SLURM_JOB_NODELIST": "n[1-2],gpu5", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    ns = _ns("-n", "5", environ=slurm)
    assert ns.placement == [("n1", 2), ("n2", 2), ("gpu5", 1)]
    cmd, _ = _command(ns)
    assert cmd[cmd.index("-hosts") + 1] == "n1:2,n2:2,gpu5:1"
    with pytest.raises(cli.LaunchError, match="-n 6 ranks do not fit the 5 slots of the Slurm "
                                              "allocation"):
        _ns("-n", "6", environ=slurm)
    # --hosts wins over the allocation.
    assert _ns("-n", "2", "--hosts", "x:2", environ=slurm).placement == [("x", 2)]


def test_a_bad_slurm_node_list_names_the_variable():
    with pytest.raises(cli.LaunchError, match=r"SLURM_JOB_NODELIST='n\[1-'.*unbalanced"):
        _ns("-n", "2", environ={"SLURM_JOB_NODELIST": "n[1-", "SLURM_TASKS_PER_NODE": "1"})
    with pytest.raises(cli.LaunchError, match="names 2 nodes but SLURM_TASKS_PER_NODE='1' "
                                              "gives 1 counts"):
        _ns("-n", "1", environ={"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1"})


# ------------------------------------------------------------------ reports

HOSTS = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}


def test_a_lost_host_is_named_with_its_ranks():
    lost = summary.lost_host(4, {}, None, [3, 2, 0, 1], HOSTS)
    assert lost == ("node1", [2, 3], "ended")
    text, status = summary.failure_summary(4, {}, 255, {}, {}, HOSTS, lost)
    assert text.startswith("spmd-run: node1 lost (ranks 2, 3): it stopped answering"), text
    assert "(ranks 0-1 (node0): no result" in text and status == 255, text
    # A rank of node0 that crashed on the lost connection comes after.
    text, _ = summary.failure_summary(4, {}, 255, {1: "Fatal Python error: Aborted\n"}, {},
                                      HOSTS, lost)
    assert text.startswith("spmd-run: node1 lost (ranks 2, 3): it stopped answering"), text
    assert "--- rank 1 (node0): died on a fatal signal after node1 was lost" in text, text
    # mpiexec reported exit codes: not a lost connection.
    assert summary.lost_host(4, {}, [0, 0, 9, 9], [3], HOSTS) is None
    # A machine gone: its ranks alone stayed connected to the launcher.
    lost = summary.lost_host(4, {}, None, [0, 1], HOSTS, [2, 3])
    assert lost == ("node1", [2, 3], "silent")
    text, _ = summary.failure_summary(4, {}, 255, {}, {}, HOSTS, lost)
    assert text.startswith("spmd-run: node1 lost (ranks 2, 3): it stopped answering (its "
                           "ranks' connections to spmd-run stayed open after mpiexec lost the "
                           "host's MPI proxy and exited with status 255: the machine is down "
                           "or cut from the network); the job was ended"), text
    # One host: nothing to name.
    assert summary.lost_host(4, {}, None, [3], {r: "vm" for r in range(4)}) is None


def test_a_host_whose_ranks_were_all_killed_is_named():
    text, status = summary.failure_summary(4, {}, 9, {}, {2: 9, 3: 9}, HOSTS)
    assert text.startswith("spmd-run: node1 lost (ranks 2, 3): killed by SIGKILL"), text
    assert status == 137
    text, _ = summary.failure_summary(4, {}, 9, {}, {2: 9}, HOSTS)
    assert text.startswith("spmd-run: rank 2 (node1) of 4 was killed by SIGKILL"), text


def test_single_host_messages_stay_as_they_were():
    text, _ = summary.failure_summary(4, {}, 9, {}, {2: 9}, {r: "vm" for r in range(4)})
    assert text.startswith("spmd-run: rank 2 of 4 was killed by SIGKILL"), text
    assert "(vm)" not in text


def test_a_rank_that_cannot_reach_the_launch_directory_says_so(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    (tmp_path / "hello.py").write_text("print('hello')\n")
    env = {**os.environ, "PMI_RANK": "2", "SPMD_LAUNCH_DIR": str(tmp_path / "not-shared")}
    from tests.mpi import REPO_ROOT

    out = subprocess.run([sys.executable, "-m", "spmd.launch._rank", str(tmp_path / "hello.py")],
                         env=env, capture_output=True, text=True, timeout=60, cwd=str(REPO_ROOT))
    assert out.returncode == 0 and out.stdout == "hello\n", out.stderr
    assert out.stderr == (
        f"spmd-run: rank 2 on {socket.gethostname()}: the launch directory "
        f"{tmp_path / 'not-shared'} does not exist on this host, so spmd-run cannot read this "
        "rank's result or clean up after it; give --launch-dir a directory that every host "
        "mounts at the same path\n")
