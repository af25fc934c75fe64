"""``spmd-run`` across emulated nodes: ``--hosts``, ``--hostfile`` and Slurm's
allocation place the ranks, the job gives the one-node job's result, and every
node's ``/dev/shm`` is left empty.  Each job has a time limit."""

from __future__ import annotations

import json
import time

import pytest

from tests.multinode.launcher import DATA_PARALLEL, emulated, hosts_of, run

LIMIT_S = 120


def _result(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if "RESULT " in ln]
    assert len(lines) == 1, out[-3000:]
    return json.loads(lines[0].split("RESULT ", 1)[1])


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """The data-parallel job's result on 4 ranks of this machine."""
    where = tmp_path_factory.mktemp("one_node")
    (where / "dp.py").write_text(DATA_PARALLEL)
    status, out = run(None, ["-n", "4"], where / "dp.py", cwd=where, limit_s=LIMIT_S)
    assert status == 0, out[-3000:]
    return _result(out)


def _same(a: dict, b: dict) -> None:
    # Each rank's gradient is the same sum of 16 rows whatever the placement; only the
    # cross-rank sum may be ordered differently (float32).
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-5)
    assert a["w"] == pytest.approx(b["w"], rel=1e-4, abs=1e-5)


def test_hosts_place_the_ranks_and_give_the_one_node_result(make_nodes, tmp_path, one_node):
    nodes = make_nodes(2)
    (tmp_path / "dp.py").write_text(DATA_PARALLEL)
    status, out = run(nodes, ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes)],
                      tmp_path / "dp.py", cwd=tmp_path, limit_s=LIMIT_S)
    assert status == 0, out[-3000:]
    assert hosts_of(out) == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}, out[-3000:]
    _same(_result(out), one_node)
    # The launch directory was under the working directory, and is gone.
    assert not (tmp_path / ".spmd-run").exists()
    assert nodes.leftovers() == {}


def test_an_open_mpi_hostfile_places_the_ranks_on_three_nodes(make_nodes, tmp_path, one_node):
    nodes = make_nodes(3)
    (tmp_path / "dp.py").write_text(DATA_PARALLEL)
    (tmp_path / "hosts").write_text("# three machines\nnode0 slots=2\n\nnode1 slots=1  # small\n"
                                    "node2:1\n")
    status, out = run(nodes, ["-n", "4", "--hostfile", "hosts",
                              "--launch-dir", str(tmp_path / "shared"), *emulated(nodes)],
                      tmp_path / "dp.py", cwd=tmp_path, limit_s=LIMIT_S)
    assert status == 0, out[-3000:]
    assert hosts_of(out) == {0: "node0", 1: "node0", 2: "node1", 3: "node2"}, out[-3000:]
    _same(_result(out), one_node)
    assert list((tmp_path / "shared").iterdir()) == []
    assert nodes.leftovers() == {}


def test_inside_a_slurm_allocation_the_ranks_go_to_its_nodes(make_nodes, tmp_path, one_node):
    nodes = make_nodes(2)
    (tmp_path / "dp.py").write_text(DATA_PARALLEL)
    slurm = {"SLURM_JOB_NODELIST": "node[0-1]", "SLURM_TASKS_PER_NODE": "2(x2)",
             "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "4242"}
    status, out = run(nodes, ["-n", "4", *emulated(nodes)], tmp_path / "dp.py", cwd=tmp_path,
                      env=slurm, limit_s=LIMIT_S)
    assert status == 0, out[-3000:]
    assert hosts_of(out) == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}, out[-3000:]
    _same(_result(out), one_node)
    assert nodes.leftovers() == {}


def test_a_host_the_cleanup_pass_cannot_reach_is_reported(make_nodes, tmp_path, capsys):
    """The emulated launcher refuses a host it does not know, as ssh fails for a lost
    machine: spmd-run says that segments may be left there."""
    from spmd.launch import cli, multihost
    from tests.multinode.conftest import job_env

    nodes = make_nodes(2)
    ns = cli.parse_args(["-n", "2", "--hosts", "node0:1,nowhere:1", *emulated(nodes), "t.py"])
    cli.resolve_hosts(ns, {})
    mpiexec = cli.find_mpiexec()
    env = job_env(nodes.env())
    assert not multihost.clean_every_host(ns, mpiexec, "mpich", env, str(tmp_path))
    err = capsys.readouterr().err
    assert "spmd-run: the cleanup of the hosts' shared memory failed (mpiexec exit status " \
           in err and "segments may be left in /dev/shm there:" in err, err
    assert "unknown host 'nowhere'" in err, err
    # mpiexec gave up at 'nowhere' while node0's launch was in flight: node0's hydra
    # proxy starts after it, and with no ssh session to hang up (the emulated launcher
    # execs in place) would wait for its mpiexec for ever.  Kill it as it appears.
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 2.0:
        if nodes.kill_node(0):
            quiet_since = time.monotonic()
        time.sleep(0.1)
