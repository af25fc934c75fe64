"""``spmd-run`` across emulated nodes when things go wrong: a lost node is named with
its ranks and the job restarts and resumes to the uninterrupted result; the
collective deadline report and ProgramMismatchError name the ranks' hosts; every
node's ``/dev/shm`` is left empty whatever the end.  Each job has a time limit."""

from __future__ import annotations

import json
import re
import signal
import textwrap

from tests.multinode.launcher import REPO_ROOT, Run, emulated, run

LIMIT_S = 150
SCRIPT = REPO_ROOT / "examples" / "train_transformer.py"
# A small model, data-parallel over the 4 ranks (as tests/launch/test_restarts.py).
SMALL = ["--d-model", "32", "--heads", "4", "--layers", "2", "--context", "16", "--batch", "8",
         "--mesh", "data=4,model=1", "--sample", "0", "--steps", "16", "--save-every", "4",
         "--log-every", "1"]
# Exact restore: compiled loops off (test_restarts.py says why).
EXACT = {"SPMD_COMPILE_KERNELS": "0"}


def _final(stats) -> float:
    with open(f"{stats}.rank0.json") as f:
        return json.load(f)["final_loss"]


def test_losing_node1_restarts_and_resumes_to_the_same_result(make_nodes, tmp_path):
    nodes = make_nodes(2)
    hosts = ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes)]
    status, ref = run(nodes, hosts, SCRIPT, SMALL + ["--ckpt-dir", tmp_path / "ck_whole",
                                                      "--stats", tmp_path / "whole"],
                      cwd=tmp_path, env=EXACT, limit_s=LIMIT_S)
    assert status == 0, ref[-3000:]
    job = Run(nodes, hosts + ["--max-restarts", "1"], SCRIPT,
              SMALL + ["--ckpt-dir", tmp_path / "ck", "--stats", tmp_path / "lost"],
              cwd=tmp_path, env=EXACT)
    status = job.lose_node(nodes, 1, "] step 9 loss", 1, LIMIT_S)
    out = job.out
    assert status == 0, out[-5000:]
    lost = [ln for ln in out.splitlines() if "lost (" in ln]
    assert len(lost) == 1 and lost[0].startswith("spmd-run: node1 lost (ranks 2, 3): "
                                                 "it stopped answering"), out[-5000:]
    assert out.index("lost (") < out.index("(mpiexec's own messages:)"), out[-5000:]
    assert "BAD TERMINATION" not in out
    assert out.count("spmd-run: restarting the job (attempt 2 of 2)") == 1, out[-5000:]
    resumed = [ln for ln in out.splitlines() if "resumed from step" in ln]
    assert len(resumed) == 1 and resumed[0].split()[-1] in ("8", "4"), out[-5000:]
    assert _final(tmp_path / "lost") == _final(tmp_path / "whole"), out[-3000:]
    assert nodes.leftovers() == {}
    print(lost[0])


_DEADLINE = textwrap.dedent("""
    import time
    import numpy as np
    import spmd
    from spmd import P, lax

    mesh = spmd.make_mesh((spmd.device_count(),), ("i",))
    step = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                   out_specs=P()))
    x = np.ones(spmd.device_count() * 4, np.float32)
    step(x)
    if spmd.process_index() == 3:
        time.sleep(60)  # never arrives at the second psum
    step(x)
""")

_MISMATCH = textwrap.dedent("""
    import numpy as np
    import spmd
    from spmd import P, lax

    mesh = spmd.make_mesh((spmd.device_count(),), ("i",))
    step = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                   out_specs=P()))
    rows = 8 if spmd.process_index() < 2 else 12  # node1's ranks trace another shape
    step(np.ones(spmd.device_count() * rows, np.float32))
""")


def test_the_deadline_report_names_the_hosts(make_nodes, tmp_path):
    nodes = make_nodes(2)
    (tmp_path / "job.py").write_text(_DEADLINE)
    status, out = run(nodes, ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes)],
                      tmp_path / "job.py", cwd=tmp_path, env={"SPMD_COLLECTIVE_TIMEOUT": "4"},
                      limit_s=LIMIT_S)
    assert status == 1, out[-5000:]
    assert "ranks that never arrived: [3] (node1)" in out, out[-5000:]
    assert "rank 3 (node1): never arrived (its last collective over these ranks was #1)" \
        in out, out[-5000:]
    assert "reported a collective deadline" in out and "(node0)" in out, out[-5000:]
    assert nodes.leftovers() == {}


def test_a_program_mismatch_names_the_hosts(make_nodes, tmp_path):
    nodes = make_nodes(2)
    (tmp_path / "job.py").write_text(_MISMATCH)
    status, out = run(nodes, ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes)],
                      tmp_path / "job.py", cwd=tmp_path, limit_s=LIMIT_S)
    assert status == 1, out[-5000:]
    assert "ProgramMismatchError" in out, out[-5000:]
    assert "ranks [0, 1] (node0) have: " in out and "ranks [2, 3] (node1) have: " in out, \
        out[-5000:]
    # Which ranks the summary counts as failed depends on which wrote its error before
    # the job was ended (5 s after the first failure: a loaded machine may end a rank
    # first); every one it names is named with its host.
    summary = re.search(r"spmd-run: ranks (.*) of 4 failed; rank ", out)
    assert summary and "(node0)" in summary[1] and "(node1)" in summary[1], out[-5000:]
    assert nodes.leftovers() == {}


_SLEEPS = textwrap.dedent("""
    import time
    import numpy as np
    import spmd
    from spmd import P, lax

    mesh = spmd.make_mesh((spmd.device_count(),), ("i",))
    step = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                                   out_specs=P()))
    step(np.ones(spmd.device_count() * 8192, np.float32))  # (spmd's window: 32 KiB a rank)
    print("STARTED", flush=True)
    time.sleep(120)
""")


def test_a_timeout_and_ctrl_c_across_hosts_leave_every_node_clean(make_nodes, tmp_path):
    nodes = make_nodes(2)
    (tmp_path / "job.py").write_text(_SLEEPS)
    hosts = ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes)]
    job = Run(nodes, hosts + ["--timeout", "15"], tmp_path / "job.py", cwd=tmp_path)
    status = job.wait(LIMIT_S)
    out = job.out
    assert status == 124, out[-3000:]
    assert "spmd-run: the job did not finish within --timeout 15s and was ended\n" \
           "ranks 0-1 (node0), 2-3 (node1) of 4 still running on other hosts than " \
           "spmd-run's" in out, out[-3000:]
    assert "BAD TERMINATION" not in out and "YOU CAN IGNORE" not in out, out[-3000:]
    assert nodes.leftovers() == {}
    # Ctrl-C (SIGINT to the launcher alone, as a terminal sends it to its group).
    job = Run(nodes, hosts, tmp_path / "job.py", cwd=tmp_path)
    assert job.wait_for("STARTED", 4, LIMIT_S), job.out[-3000:]
    job.proc.send_signal(signal.SIGINT)
    status = job.wait(LIMIT_S)
    assert status == 130 and "spmd-run: interrupted; ending the job" in job.out, job.out[-3000:]
    assert "BAD TERMINATION" not in job.out, job.out[-3000:]
    assert nodes.leftovers() == {}


def test_a_rank_killed_on_node1_is_named_with_its_host(make_nodes, tmp_path):
    """Not a lost host: node1's MPI proxy reports its rank's end (MPICH's box names
    the pid and host, which the ranks' start records map to a rank)."""
    nodes = make_nodes(2)
    (tmp_path / "job.py").write_text(_SLEEPS.replace(
        'print("STARTED", flush=True)',
        'import os, signal\nif spmd.process_index() == 2:\n    os.kill(os.getpid(), signal.SIGKILL)'))
    status, out = run(nodes, ["-n", "4", "--hosts", "node0:2,node1:2", *emulated(nodes)],
                      tmp_path / "job.py", cwd=tmp_path, limit_s=LIMIT_S)
    assert status == 137, out[-3000:]
    assert out.startswith("spmd-run: rank 2 (node1) of 4 was killed by SIGKILL (no Python "
                          "error"), out[-3000:]
    assert "lost" not in out and "BAD TERMINATION" not in out, out[-3000:]
    assert nodes.leftovers() == {}

