"""Hierarchical collectives on emulated nodes (:mod:`spmd.collectives.mpi.hier`).

Each test is one job: its ranks run many checks (``psum``, ``pmean``, ``pmax``,
``psum_scatter``, ``all_gather`` and a started sum; float32, float64, int32; sizes
below and above the threshold, lengths that do not divide) against numpy on the
global input, check that every member of a group holds the same bits, and report
which plan each group took.  Tolerances follow the summed magnitudes:
``|got - sum| <= 4 * n * eps * sum(|terms|)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from spmd.testing.emulated_nodes import EmulatedNodes
from tests.mpi import REPO_ROOT, mpiexec_or_skip
from tests.multinode.conftest import job_env, python

# Each job is given its mesh, the axis its collectives reduce over, and the sizes
# (elements per device block) to check.
_JOB = textwrap.dedent(r"""
    import functools, hashlib, json, sys, zlib
    import numpy as np
    from mpi4py import MPI
    import spmd
    spmd.config.update("enable_x64", True)  # float64 operands stay float64
    from spmd import P, lax
    from spmd.collectives import mpi
    from spmd.collectives.mpi import hier as mpi_hier

    cfg = json.loads(sys.argv[1])
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    shape, axes, over = tuple(cfg["mesh"]), tuple(cfg["axes"]), cfg["over"]
    mesh = spmd.make_mesh(shape, axes)
    devs = np.vectorize(lambda d: d.process_index)(mesh.devices)   # world rank per position
    ax = axes.index(over)
    coords = tuple(int(c[0]) for c in np.nonzero(devs == rank))
    group = tuple(int(r) for r in np.moveaxis(devs, ax, 0)[(slice(None),)
                  + coords[:ax] + coords[ax + 1:]])
    k, pos = len(group), group.index(rank)
    # The global input's row of each member (dim 0 is split over the mesh in its order).
    mine_rows = [int(np.flatnonzero(devs.ravel() == r)[0]) for r in group]
    spec = P(axes)                              # dim 0 split over every axis: a row each
    smap = functools.partial(spmd.shard_map, mesh=mesh, in_specs=spec, out_specs=spec)
    ops = {
        "psum": lambda b: lax.psum(b, over),
        "pmean": lambda b: lax.pmean(b, over),
        "pmax": lambda b: lax.pmax(b, over),
        "psum_scatter": lambda b: lax.psum_scatter(b, over, scatter_dimension=1, tiled=True),
        "all_gather": lambda b: lax.all_gather(b, over, axis=1, tiled=True),
    }
    fns = {name: spmd.jit(smap(f)) for name, f in ops.items()}
    checks, digests = 0, []

    def want_of(name, x):
        terms = x[mine_rows].astype(np.float64 if x.dtype.kind == "f" else np.int64)
        if name in ("psum", "pmean", "psum_scatter"):
            w, scale = terms.sum(0), np.abs(terms).sum(0)
            if name == "pmean":
                w, scale = w / k, scale / k
            if name == "psum_scatter":
                c = x.shape[1] // k
                w, scale = w[pos * c:(pos + 1) * c], scale[pos * c:(pos + 1) * c]
            return w, scale
        if name == "pmax":
            return terms.max(0), np.abs(terms).max(0)
        return np.concatenate(list(terms), 0), None                     # all_gather

    def check(name, dtype, m):
        global checks
        rng = np.random.default_rng(zlib.crc32(f"{name} {dtype} {m}".encode()))
        x = (rng.standard_normal((n, m)) * 100).astype(dtype) if np.dtype(dtype).kind == "f" \
            else rng.integers(-1000, 1000, (n, m)).astype(dtype)
        got = np.asarray(fns[name](x).addressable_data(0)).reshape(-1)
        want, scale = want_of(name, x)
        if np.dtype(dtype).kind == "f" and name != "all_gather":
            tol = 4 * k * np.finfo(dtype).eps * scale + np.finfo(dtype).tiny
            bad = np.abs(got.astype(np.float64) - want) > tol
            assert not bad.any(), (name, dtype, m, np.flatnonzero(bad)[:5])
        else:
            assert np.array_equal(got, want.astype(got.dtype)), (name, dtype, m)
        assert got.dtype == np.dtype(dtype), (name, got.dtype, dtype)
        if name != "psum_scatter":                 # the same result on every member
            digests.append(hashlib.sha1(got.tobytes()).hexdigest())
        checks += 1

    for m in cfg["sizes"]:
        for dtype in ("float32", "float64", "int32"):
            for name in ("psum", "pmean", "pmax", "all_gather"):
                if name == "pmean" and dtype == "int32":
                    continue
                if name == "pmax" and dtype == "float64":
                    continue
                check(name, dtype, m)
            check("psum_scatter", dtype, m - m % k)
    for m in cfg.get("big", []):               # past a shared-memory slot / the split size
        check("psum", "float32", m)

    # A started sum (the overlap pass's iallreduce), as the backend runs it.
    x = np.arange(cfg["sizes"][-1], dtype=np.float32) * (pos + 1)
    got = mpi.iallreduce(x, group, "sum").wait()
    assert np.array_equal(got, x / (pos + 1) * (k * (k + 1) // 2)), "started sum"
    digests.append(hashlib.sha1(got.tobytes()).hexdigest())
    checks += 1

    # A sum through the hierarchy while a ppermute over a cross-node group of the same
    # ranks is in flight: the step between two nodes exchanges on a communicator of its
    # own, so neither takes the other's message.
    plan = mpi_hier.plan_of(group)
    if plan is not None:
        m_nodes, node = plan.nodes, plan.node
        y = np.full(1000, rank, np.float32)
        ex = mpi.isendrecv(y, plan.cross_ranks, dst=(node + 1) % m_nodes,
                           src=(node - 1) % m_nodes)
        z = np.arange(cfg["sizes"][-1], dtype=np.float32) * (pos + 1)
        got = mpi.allreduce(z, group, "sum")
        assert np.array_equal(got, z / (pos + 1) * (k * (k + 1) // 2)), "sum beside a ppermute"
        came = plan.cross_ranks[(node - 1) % m_nodes]
        assert np.array_equal(ex.wait(), np.full(1000, came, np.float32)), "ppermute beside a sum"
        checks += 1

    # A data-parallel gradient: the overlap pass starts its all-reduces (buckets of at
    # most 128 KiB here, so that each weight's gradient is one) and waits where used.
    if cfg.get("grad"):
        import spmd.numpy as snp
        spmd.config.update("overlap_bucket_bytes", 128 * 1024)
        r = np.random.default_rng(0)
        w1, w2 = [(r.standard_normal(s) * 0.1).astype(np.float32) for s in ((64, 256), (256, 128))]
        xs = r.standard_normal((n * 8, 64)).astype(np.float32)

        def loss(ws, xb):
            return snp.sum(snp.tanh(snp.tanh(xb @ ws[0]) @ ws[1]) ** 2)

        step = spmd.jit(spmd.shard_map(lambda ws, xb: spmd.grad(loss)(ws, xb), mesh=mesh,
                                       in_specs=(P(), spec), out_specs=P()))
        before = mpi_hier.plan_of(group).calls["started"]
        g1, g2 = [np.asarray(g) for g in step([w1, w2], xs)]
        assert mpi_hier.plan_of(group).calls["started"] == before + 2, "overlapped buckets"
        x64, v1, v2 = xs.astype(np.float64), w1.astype(np.float64), w2.astype(np.float64)
        h = np.tanh(x64 @ v1); z = np.tanh(h @ v2); dz = 2 * z * (1 - z * z)
        want2, want1 = h.T @ dz, x64.T @ ((dz @ v2.T) * (1 - h * h))
        for got, want, terms in ((g1, want1, np.abs(x64).T @ np.abs(dz @ v2.T)),
                                 (g2, want2, np.abs(h).T @ np.abs(dz))):
            assert (np.abs(got - want) <= 1e-4 * terms + 1e-6).all(), "gradient"
        digests += [hashlib.sha1(g1.tobytes()).hexdigest(), hashlib.sha1(g2.tobytes()).hexdigest()]
        checks += 1

    # Every member of a group holds the same bits (groups exchange over their own ranks).
    sub = comm.Split(color=min(group), key=pos)
    same = all(d == digests for d in sub.allgather(digests))
    plan = mpi_hier.plan_of(group)
    mine = {"rank": rank, "group": list(group), "checks": checks, "same_bits": same,
            "plan": None if plan is None else
            {"nodes": plan.nodes, "per_node": plan.per_node, "calls": plan.calls,
             "fused": None if plan.fused is None else plan.fused[1]}}
    every = comm.gather(mine)
    if rank == 0:
        print("RESULT", json.dumps(every), flush=True)
""")

# Per device block, in elements: below the threshold (64 KiB) for every dtype, above
# it with a length no node size divides, and above it for psum_scatter's rows.
SIZES = [24, 30_001]


def _run(make_nodes, tmp_path, slots, cfg, limit_s=120):
    nodes = make_nodes(len(slots))
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    out = python(nodes, slots, script, json.dumps(cfg), limit_s=limit_s)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    every = json.loads(out.stdout.split("RESULT", 1)[1])
    assert all(r["same_bits"] for r in every), every
    assert all(r["checks"] >= 10 * len(cfg["sizes"]) for r in every), every
    assert nodes.leftovers() == {}
    return every


def _assert_hierarchical(every, nodes, per_node):
    for r in every:
        plan = r["plan"]
        assert plan is not None, r
        assert (plan["nodes"], plan["per_node"]) == (nodes, per_node), r
        # Every kind took the plan (above the threshold), the started sum included.
        assert all(plan["calls"][kind] > 0 for kind in plan["calls"]), r
        # Sums went through each node's shared window (node reduce-scatter, the step
        # across nodes and the node all-gather in one exchange).
        assert plan["fused"] is True, r


def test_two_nodes_of_two_whole_mesh(make_nodes, tmp_path):
    cfg = {"mesh": [4], "axes": ["i"], "over": "i", "sizes": SIZES,
           "big": [700_001, 1_200_000], "grad": True}
    _assert_hierarchical(_run(make_nodes, tmp_path, [2, 2], cfg), 2, 2)


def test_three_nodes_of_two(make_nodes, tmp_path):
    cfg = {"mesh": [6], "axes": ["i"], "over": "i", "sizes": SIZES}
    _assert_hierarchical(_run(make_nodes, tmp_path, [2, 2, 2], cfg), 3, 2)


def test_sub_axis_of_a_2d_mesh_on_two_nodes_of_four(make_nodes, tmp_path):
    # Mesh (4, 2): the groups along "a" are ranks {0, 2, 4, 6} and {1, 3, 5, 7}, two
    # on each node; along "b" they are pairs on one node (flat, through its memory).
    cfg = {"mesh": [4, 2], "axes": ["a", "b"], "over": "a", "sizes": SIZES}
    every = _run(make_nodes, tmp_path, [4, 4], cfg, limit_s=180)
    assert sorted({tuple(r["group"]) for r in every}) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    _assert_hierarchical(every, 2, 2)


def test_one_rank_per_node_and_uneven_nodes_stay_flat(make_nodes, tmp_path):
    cfg = {"mesh": [3], "axes": ["i"], "over": "i", "sizes": SIZES}
    for slots in ([1, 1, 1], [2, 1]):
        every = _run(make_nodes, tmp_path, slots, cfg)
        assert all(r["plan"] is None for r in every), (slots, every)


def test_simulated_nodes_take_the_hierarchy_too(tmp_path):
    """``SPMD_SIMULATE_NODES=2`` on one machine (the suite's ``[2nodes]`` runs): the
    ranks of each simulated node share real memory, and the hierarchy is taken."""
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    cfg = {"mesh": [4], "axes": ["i"], "over": "i", "sizes": SIZES}
    cmd = [str(mpiexec_or_skip()), "-iface", "lo", "-n", "4", sys.executable, str(script),
           json.dumps(cfg)]
    # (MPI's traffic stays on the loopback: the nodes' variables less the launcher's.)
    net = {k: v for k, v in EmulatedNodes.env().items() if k.startswith("FI_")}
    out = subprocess.run(cmd, env={**job_env({"SPMD_SIMULATE_NODES": "2"}), **net},
                         capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT),
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    every = json.loads(out.stdout.split("RESULT", 1)[1])
    assert all(r["same_bits"] for r in every), every
    _assert_hierarchical(every, 2, 2)
