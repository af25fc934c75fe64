"""``spmd-run --trace`` across two emulated nodes (:mod:`spmd.testing.emulated_nodes`):
each rank's process is named with its own node's host name.  Skipped, saying why,
where namespaces cannot be made (the multi-node tests' rule)."""

from __future__ import annotations

import json

import pytest

from spmd.testing.emulated_nodes import EmulatedNodes, unavailable
from tests.multinode.launcher import DATA_PARALLEL, emulated, run

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=str(unavailable()))


@pytest.mark.timeout(300)
def test_a_trace_across_two_nodes_names_each_ranks_host(tmp_path):
    nodes = EmulatedNodes(tmp_path / "nodes", 2)
    try:
        (tmp_path / "dp.py").write_text(DATA_PARALLEL)
        path = tmp_path / "trace.json"
        status, out = run(nodes, ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes),
                                  "--trace", path], tmp_path / "dp.py", cwd=tmp_path,
                          limit_s=200)
        assert status == 0, out[-3000:]
        trace = json.loads(path.read_text())
        names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
        assert names == {0: "rank 0 (node0)", 1: "rank 1 (node0)", 2: "rank 2 (node1)",
                         3: "rank 3 (node1)"}, names
        assert "spmd timeline: 4 ranks" in out, out[-3000:]
        assert nodes.leftovers() == {}
    finally:
        for k in range(nodes.count):
            nodes.kill_node(k)
