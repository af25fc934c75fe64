"""``spmd-run --min-ranks`` across emulated nodes: node1 lost mid-run, the next
attempt runs on node0's ranks alone, or on a spare node in node1's place
(``--spare``); every node's ``/dev/shm`` is left empty.  Each job has a time limit."""

from __future__ import annotations

import textwrap

from tests.multinode.launcher import Run, emulated

LIMIT_S = 150

# Every rank says its attempt, size and host; attempt 0 runs until a node is lost.
_JOB = textwrap.dedent("""
    import os, socket, time
    import numpy as np
    import spmd
    from spmd import P, lax

    attempt = os.environ["SPMD_RESTART_ATTEMPT"]
    me, size = spmd.process_index(), spmd.process_count()
    mesh = spmd.make_mesh((spmd.device_count(),), ("i",))
    step = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                   out_specs=P()))
    x = np.ones(spmd.device_count() * 8192, np.float32)
    total = float(np.asarray(step(x))[0])
    print(f"SIZE {attempt} {me} {size} {socket.gethostname()} {total:g}", flush=True)
    while attempt == "0":
        step(x)
        time.sleep(0.05)
    print(f"DONE {me}", flush=True)
""")


def _sizes(out: str, attempt: int) -> dict[int, tuple[int, str, float]]:
    """Rank -> (size, host, psum) as attempt ``attempt``'s ranks printed them."""
    found = {}
    for line in out.splitlines():
        if f"SIZE {attempt} " in line:
            rank, size, host, total = line.split("SIZE ", 1)[1].split()[1:5]
            found[int(rank)] = (int(size), host, float(total))
    return found


def _lose_node1(nodes, options, tmp_path) -> tuple[int | None, str]:
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    job = Run(nodes, ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes),
                      "--max-restarts", "1", *options], script, cwd=tmp_path)
    status = job.lose_node(nodes, 1, "SIZE 0 ", 4, LIMIT_S)
    return status, job.out


def test_losing_node1_restarts_on_node0s_ranks(make_nodes, tmp_path):
    nodes = make_nodes(2)
    status, out = _lose_node1(nodes, ["--min-ranks", "2"], tmp_path)
    assert status == 0, out[-5000:]
    assert {r: s[:2] for r, s in _sizes(out, 0).items()} == {
        0: (4, "node0"), 1: (4, "node0"), 2: (4, "node1"), 3: (4, "node1")}, out[-5000:]
    line = [ln for ln in out.splitlines() if ln.startswith("spmd-run: attempt 2 of 2 ")]
    assert len(line) == 1, out[-5000:]
    assert line[0].startswith("spmd-run: attempt 2 of 2 on 2 ranks (node0:2): node1 lost "
                              "(ranks 2, 3 "), out[-5000:]
    assert _sizes(out, 1) == {0: (2, "node0", 2.0), 1: (2, "node0", 2.0)}, out[-5000:]
    assert out.count("DONE ") == 2 and "restarting the job" not in out, out[-5000:]
    assert nodes.leftovers() == {}


def test_a_spare_node_takes_node1s_place(make_nodes, tmp_path):
    nodes = make_nodes(3)
    status, out = _lose_node1(nodes, ["--min-ranks", "2", "--spare", "node2:2"], tmp_path)
    assert status == 0, out[-5000:]
    line = [ln for ln in out.splitlines() if ln.startswith("spmd-run: attempt 2 of 2 ")]
    assert len(line) == 1, out[-5000:]
    assert line[0].startswith("spmd-run: attempt 2 of 2 on 4 ranks (node0:2,node2:2): node1 "
                              "lost (ranks 2, 3 "), out[-5000:]
    assert line[0].endswith("; spare node2 took its place"), out[-5000:]
    assert _sizes(out, 1) == {0: (4, "node0", 4.0), 1: (4, "node0", 4.0),
                              2: (4, "node2", 4.0), 3: (4, "node2", 4.0)}, out[-5000:]
    assert out.count("DONE ") == 4, out[-5000:]
    assert nodes.leftovers() == {}


def test_too_few_ranks_after_node1_is_lost(make_nodes, tmp_path):
    nodes = make_nodes(2)
    status, out = _lose_node1(nodes, ["--min-ranks", "3"], tmp_path)
    assert status not in (0, None), out[-5000:]
    assert ("spmd-run: error: --min-ranks 3: only 2 of 4 ranks are left after node1 lost "
            "(ranks 2, 3 ") in out, out[-5000:]
    assert "SIZE 1 " not in out and "attempt 2 of 2" not in out, out[-5000:]
    assert nodes.leftovers() == {}
