"""Before a program first runs across processes, its processes agree on it.

Every process hashes the program it is about to run, with the mesh it runs on
(axis names and sizes, and the device order); one small ``Allgather`` on the
control communicator (never the data one: see :mod:`spmd.collectives.mpi.control`)
compares the hashes.  A mismatch (ranks traced different programs, e.g. from
differently shaped inputs, rank-dependent Python control flow, or meshes that
list the devices in a different order) would otherwise hang in a collective or compute garbage; instead every process
raises :class:`ProgramMismatchError` naming the ranks that differ and the
first equation where their programs part.
"""

from __future__ import annotations

import hashlib

import numpy as np

from spmd.errors import ProgramMismatchError  # noqa: F401  (raised here; its home is errors)
from spmd.collectives import mpi
from spmd.collectives.mpi import control as mpi_control


def mesh_line(mesh) -> str:
    """The mesh as the processes must agree on it: axis sizes and device order.

    >>> mesh_line(spmd.make_mesh((2, 2), ("a", "b")))             # doctest: +SKIP
    'mesh: a=2 b=2 devices [0, 1, 2, 3]'
    """
    axes = " ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.axis_sizes))
    return f"mesh: {axes} devices {[d.id for d in mesh.devices.flat]}"


def agree(program, in_avals, in_specs, out_specs, mesh) -> None:
    """Raise on every process of ``mesh`` unless all are about to run the same per-device
    ``program`` on inputs of the same global types and specs."""
    ranks = tuple(sorted({d.process_index for d in mesh.devices.flat}))
    text = (f"{mesh_line(mesh)}\ninputs: {', '.join(map(str, in_avals))}\n"
            f"in_specs: {list(in_specs)}\nout_specs: {list(out_specs)}\n{program}")
    agree_text(text, ranks)


def agree_text(text: str, ranks: tuple) -> None:
    """Raise :class:`ProgramMismatchError` on every process of ``ranks`` unless all hold
    the same ``text`` (one line per step; the error names the first differing line).

    >>> agree_text("mesh: i=4 devices [0, 1, 2, 3]\nsin f32[2]", (0, 1))  # doctest: +SKIP
    """
    digest = np.frombuffer(hashlib.blake2b(text.encode(), digest_size=16).digest(), np.uint8)
    # Watched like any collective (the deadline, spmd-run's finished-rank check): a rank
    # that exits or skips the call is reported as leaving this one waiting in "the
    # first call of jit(step)" (agreeing on the program), not waited for forever.
    all_digests = mpi.allgather(digest, ranks, what=mpi_control.agreement_site(),
                                control=True)
    if all((row == all_digests[0]).all() for row in all_digests):
        return
    # The error path may pickle: gather the texts to say where they differ.
    texts = mpi_control.control(ranks).allgather(text)
    groups: dict = {}
    for r, t in zip(ranks, texts):
        groups.setdefault(t, []).append(r)
    (ref_text, ref_ranks), *others = sorted(groups.items(), key=lambda kv: kv[1][0])
    lines = []
    for other_text, other_ranks in others:
        a, b = ref_text.splitlines(), other_text.splitlines()
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        # (With ranks on several hosts, each group's hosts too.)
        lines.append(f"ranks {ref_ranks}{mpi_control.on_hosts(ref_ranks)} have: "
                     f"{a[i].strip() if i < len(a) else '<end>'}\n"
                     f"  ranks {other_ranks}{mpi_control.on_hosts(other_ranks)} have: "
                     f"{b[i].strip() if i < len(b) else '<end>'}")
    raise ProgramMismatchError(
        "the processes of this mesh traced different programs, so their collectives would "
        "not match (different input shapes or dtypes on different ranks, Python control "
        "flow that depends on the rank, or meshes whose devices or axis sizes differ). "
        "First difference:\n" + "\n".join(lines))
