"""spmd.launch.nodes: which node each rank is on, real and simulated
(``SPMD_SIMULATE_NODES``), checked without MPI by setting the launcher's variables.

The multi-process side (the shared-memory window per simulated node) is
tests/mpi/test_mpi_nodes.py; the GPU side (node-local GPU numbering, the NCCL
check of node and bus id) tests/gpu/test_platform.py and test_nccl_processes.py.
"""

from __future__ import annotations

import socket

import pytest

from spmd.errors import ArgumentError
from spmd.launch import nodes, runtime

_LAUNCHER_VARS = (runtime._RANK_VARS + runtime._SIZE_VARS + nodes.LOCAL_RANK_VARS
                  + nodes.LOCAL_SIZE_VARS + (nodes.ENV,))


@pytest.fixture
def rank_env(monkeypatch):
    """``rank_env(rank, size, local_rank=None, local_size=None, k=None)``: this process
    looks like world rank ``rank`` of an MPI job (Hydra's variables)."""
    for name in _LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime, "_forced", {})
    # An earlier test may have started MPI in this process (a world of one): the
    # launcher's variables set here are the job this process pretends to be in.
    monkeypatch.setattr(nodes, "_mpi_started", lambda: False)

    def configure(rank, size, local_rank=None, local_size=None, k=None):
        monkeypatch.setenv("PMI_RANK", str(rank))
        monkeypatch.setenv("PMI_SIZE", str(size))
        for name, value in (("MPI_LOCALRANKID", local_rank), ("MPI_LOCALNRANKS", local_size),
                            (nodes.ENV, k)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))

    return configure


# ------------------------------------------------------------ the mapping

@pytest.mark.parametrize("size,k,want", [
    (4, 2, [[0, 1], [2, 3]]),
    (4, 1, [[0, 1, 2, 3]]),
    (4, 4, [[0], [1], [2], [3]]),
    (5, 2, [[0, 1, 2], [3, 4]]),          # uneven: the first n % K nodes get one more
    (7, 3, [[0, 1, 2], [3, 4], [5, 6]]),
    (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
])
def test_contiguous_blocks(size, k, want):
    assert [list(b) for b in nodes.blocks(size, k)] == want
    assert [nodes.node_of(r, size, k) for r in range(size)] == [
        i for i, b in enumerate(want) for _ in b]


def test_every_split_covers_the_ranks_once():
    for size in range(1, 40):
        for k in range(1, size + 1):
            got = nodes.blocks(size, k)
            assert [r for b in got for r in b] == list(range(size))
            assert max(map(len, got)) - min(map(len, got)) <= 1
            assert all(r in got[nodes.node_of(r, size, k)] for r in range(size))


@pytest.mark.parametrize("raw,why", [
    ("0", "cannot be split into 0 nodes"), ("-1", "cannot be split into -1 nodes"),
    ("5", "a job of 4 ranks cannot be split into 5 nodes"), ("two", "is not a whole number"),
    ("1.5", "is not a whole number"),
])
def test_bad_values_name_the_variable_the_value_and_the_fix(raw, why):
    with pytest.raises(ArgumentError) as e:
        nodes.parse(raw, 4)
    msg = str(e.value)
    assert f"SPMD_SIMULATE_NODES={raw!r}" in msg and why in msg
    assert "from 1 to the job's 4 ranks" in msg and "unset it" in msg


def test_unset_and_blank_mean_the_real_nodes():
    assert nodes.parse(None, 4) is None and nodes.parse("", 4) is None
    assert nodes.parse(" 2 ", 4) == 2


# ------------------------------------------------------------ this process

def test_a_rank_sees_its_simulated_node(rank_env):
    rank_env(2, 4, local_rank=2, local_size=4, k=2)
    assert nodes.world_rank_size() == (2, 4)
    assert nodes.simulated() == 2 and nodes.node_index() == 1
    assert nodes.node_ranks() == range(2, 4)
    assert nodes.node_name() == f"{socket.gethostname()}/node1"
    assert nodes.local_rank_size() == (0, 2)  # its index on the simulated node


def test_without_the_setting_the_launcher_says(rank_env):
    rank_env(2, 4, local_rank=2, local_size=4)
    assert nodes.simulated() is None and nodes.node_index() == 0
    assert nodes.node_ranks() == range(4)
    assert nodes.node_name() == socket.gethostname()
    assert nodes.local_rank_size() == (2, 4)


def test_simulated_nodes_split_a_real_node_further(rank_env):
    # 8 ranks on 2 real nodes of 4 (ranks 0-3, 4-7) and 2 simulated nodes: the same.
    rank_env(5, 8, local_rank=1, local_size=4, k=2)
    assert nodes.local_rank_size() == (1, 4)
    # One simulated node: the real nodes stay (a simulated node never spans two).
    rank_env(5, 8, local_rank=1, local_size=4, k=1)
    assert nodes.local_rank_size() == (1, 4)
    # 4 simulated nodes of 2 inside each real node of 4.
    rank_env(5, 8, local_rank=1, local_size=4, k=4)
    assert nodes.local_rank_size() == (1, 2)
    rank_env(6, 8, local_rank=2, local_size=4, k=4)
    assert nodes.local_rank_size() == (0, 2)
    # Simulated blocks that cut across real nodes (3 of 8: 0-2, 3-5, 6-7): rank 4 of
    # real node 1 (4-7) is on simulated node 1 (3-5): together ranks 4, 5.
    rank_env(4, 8, local_rank=0, local_size=4, k=3)
    assert nodes.local_rank_size() == (0, 2)
    rank_env(3, 8, local_rank=3, local_size=4, k=3)
    assert nodes.local_rank_size() == (0, 1)


def test_a_bad_value_raises_on_every_rank_alike(rank_env):
    messages = set()
    for r in range(4):
        rank_env(r, 4, local_rank=r, local_size=4, k=9)
        with pytest.raises(ArgumentError, match="SPMD_SIMULATE_NODES='9'") as e:
            nodes.simulated()
        messages.add(str(e.value))
        assert nodes.reading() == ("error", str(e.value))  # for the members' exchange
    assert len(messages) == 1


def test_one_process_is_one_node(rank_env, monkeypatch):
    monkeypatch.setenv(nodes.ENV, "2")  # not an MPI job: the setting is not read
    assert nodes.world_rank_size() == (0, 1)
    assert nodes.simulated() is None and nodes.local_rank_size() == (0, None)
    assert nodes.node_name() == socket.gethostname()


def test_members_that_read_different_settings_are_named():
    assert nodes.check_agreed([("ok", None)] * 3, (0, 1, 2)) is None
    assert nodes.check_agreed([("ok", 2)] * 4, (0, 1, 2, 3)) == 2
    with pytest.raises(ArgumentError) as e:
        nodes.check_agreed([("ok", 2), ("ok", None), ("ok", 2), ("ok", 2)], (0, 1, 2, 3))
    msg = str(e.value)
    assert "ranks [0, 2, 3]: SPMD_SIMULATE_NODES=2" in msg
    assert "ranks [1]: SPMD_SIMULATE_NODES unset" in msg
    assert "Give every rank the same SPMD_SIMULATE_NODES" in msg
    # Every member invalid alike is an error too, with the reason.
    bad = ("error", "SPMD_SIMULATE_NODES='x' is not a whole number; ...")
    with pytest.raises(ArgumentError, match=r"ranks \[4, 6\]: SPMD_SIMULATE_NODES='x' is not"):
        nodes.check_agreed([bad, bad], (4, 6))


# ------------------------------------------------------------ before launch

def test_ranks_per_node_for_the_launcher():
    assert nodes.ranks_per_node(4, {}) == 4
    assert nodes.ranks_per_node(9, {"SLURM_JOB_NUM_NODES": "2"}) == 5
    assert nodes.ranks_per_node(8, {"SLURM_NNODES": "4"}) == 2
    # The cores are the real node's: the threads ignore simulated nodes ...
    assert nodes.ranks_per_node(4, {nodes.ENV: "2"}) == 4
    # ... the GPUs are numbered per simulated node.
    assert nodes.ranks_per_node(4, {nodes.ENV: "2"}, simulate=True) == 2
    assert nodes.ranks_per_node(5, {nodes.ENV: "2"}, simulate=True) == 3
    assert nodes.ranks_per_node(8, {nodes.ENV: "2", "SLURM_JOB_NUM_NODES": "4"},
                                simulate=True) == 2
    # An invalid value is the ranks' error to raise (they name it): counted as unset.
    assert nodes.ranks_per_node(4, {nodes.ENV: "9"}, simulate=True) == 4


def test_spmd_run_gpu_check_counts_simulated_nodes(monkeypatch):
    """``spmd-run --platform gpu`` refuses more ranks per node than GPUs (NCCL): with
    simulated nodes the count is per simulated node, as the ranks number their GPUs."""
    from spmd.launch import cli

    monkeypatch.setattr(cli, "_cupy_gpu_count", lambda: (True, 2, ""))
    ns = cli.parse_args(["-n", "4", "--platform", "gpu", "x.py"])
    with pytest.raises(cli.LaunchError, match="4 ranks on this node but only 2 GPU"):
        cli.check_gpu(ns, environ={})
    cli.check_gpu(ns, environ={nodes.ENV: "2"})  # 2 ranks per simulated node: accepted
