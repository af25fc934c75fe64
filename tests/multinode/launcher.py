"""Helpers of the launcher's multi-node tests: ``spmd-run`` started on emulated nodes,
in the background, its output collected, with a time limit."""

from __future__ import annotations

import sys
import textwrap

from spmd.testing.emulated_nodes import EmulatedNodes
from tests.launch.jobs import Background
from tests.multinode.conftest import job_env
from tests.mpi import REPO_ROOT, mpiexec_or_skip

# A data-parallel least-squares fit: the batch split over the ranks, the gradient
# averaged across them; each rank prints its host, rank 0 the losses and a checksum.
DATA_PARALLEL = textwrap.dedent('''
    import functools, json, socket, sys
    import numpy as np
    import spmd
    import spmd.numpy as snp
    from spmd import P, lax

    mesh = spmd.make_mesh((spmd.device_count(),), ("data",))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 32)).astype(np.float32)
    y = x @ rng.normal(size=(32, 8)).astype(np.float32)

    def loss(w, xb, yb):
        return lax.pmean(snp.mean((xb @ w - yb) ** 2), "data")

    @spmd.jit
    @functools.partial(spmd.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                       out_specs=(P(), P()))
    def step(w, xb, yb):
        value, grad = spmd.value_and_grad(loss)(w, xb, yb)
        return value, w - 0.05 * grad

    w = np.zeros((32, 8), np.float32)
    losses = []
    for _ in range(8):
        value, w = step(w, x, y)
        losses.append(float(np.asarray(value)))
    print(f"HOST {spmd.process_index()} {socket.gethostname()}", flush=True)
    if spmd.process_index() == 0:
        print("RESULT " + json.dumps({"losses": losses, "w": float(np.asarray(w).sum())}),
              flush=True)
''')


def emulated(nodes: EmulatedNodes) -> list[str]:
    """``--mpiexec-arg`` options that start each node's proxy in its namespaces."""
    out = []
    for arg in nodes.launcher_args():
        out += ["--mpiexec-arg", arg]
    return out


class Run(Background):
    """``python -m spmd.launch OPTIONS TARGET ARGS`` in the background, in ``cwd``,
    on ``nodes`` (their variables set), its output (stdout and stderr) collected."""

    def __init__(self, nodes: EmulatedNodes | None, options, target, args=(), *, cwd,
                 env=None):
        mpiexec_or_skip()
        full = job_env({**(nodes.env() if nodes else {}), **(env or {})})
        super().__init__([sys.executable, "-m", "spmd.launch", *options, str(target),
                          *map(str, args)], cwd, full)

    def lose_node(self, nodes: EmulatedNodes, k: int, marker: str, count: int,
                  limit_s: float) -> int | None:
        """Once ``marker`` has been printed ``count`` times, kill node ``k`` (every
        process in it) and wait for the job's end: its exit status, or None past
        ``limit_s``.  The job never outlives the call."""
        try:
            assert self.wait_for(marker, count, limit_s), self.out[-3000:]
            assert nodes.kill_node(k), f"node{k} had no process"
            return self.wait(limit_s)
        finally:
            if self.proc.poll() is None:
                self.wait(0)


def run(nodes, options, target, args=(), *, cwd, env=None, limit_s=120) -> tuple:
    """(exit status or None past ``limit_s``, output) of one ``spmd-run``."""
    job = Run(nodes, options, target, args, cwd=cwd, env=env)
    status = job.wait(limit_s)
    return status, job.out


def hosts_of(out: str) -> dict[int, str]:
    """Rank -> host, as the job's ranks printed them (``HOST <rank> <host>``)."""
    found = {}
    for line in out.splitlines():
        if "HOST " in line:
            rank, host = line.split("HOST ", 1)[1].split()[:2]
            found[int(rank)] = host
    return found


__all__ = ["DATA_PARALLEL", "REPO_ROOT", "Run", "emulated", "hosts_of", "run"]
