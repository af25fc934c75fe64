"""The emulated nodes themselves: each node's ranks see its own host name and
/dev/shm, and MPI's segments of a job stay on their node."""

import json
import textwrap

from tests.multinode.conftest import python


def test_each_node_has_its_own_host_name_and_dev_shm(make_nodes, tmp_path):
    nodes = make_nodes(2)
    script = tmp_path / "where.py"
    script.write_text(textwrap.dedent("""
        import json, os, socket
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        comm.Barrier()
        rows = comm.gather((socket.gethostname(), local.Get_size(), sorted(os.listdir("/dev/shm"))))
        if comm.Get_rank() == 0:
            print("ROWS", json.dumps(rows), flush=True)
    """))
    out = python(nodes, 2, script)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout.split("ROWS", 1)[1])
    assert [r[:2] for r in rows] == [["node0", 2], ["node0", 2], ["node1", 2], ["node1", 2]]
    # Each node's MPICH segment is in that node's /dev/shm alone.
    assert rows[0][2] == rows[1][2] and rows[2][2] == rows[3][2] and rows[0][2] != rows[2][2]
    assert all(any(f.startswith("mpich_shm") for f in r[2]) for r in rows)
    assert nodes.leftovers() == {}
