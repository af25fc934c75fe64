"""Several machines emulated on one: nodes for multi-node tests.

A multi-node job differs from a one-node job in three ways that matter to
``spmd``: the ranks of different nodes have different host names, they do not
share ``/dev/shm`` (so no shared-memory segment, MPICH's or spmd's, spans two
nodes), and their traffic goes through the network stack.  An emulated node has
all three:

- its processes run in their own UTS, mount and IPC namespaces (``unshare``),
  with the host name ``node<k>``;
- its ``/dev/shm`` is a directory of its own (``<root>/node<k>/shm``, bind-mounted
  over ``/dev/shm``), which outlives the job as a real node's does, so a test can
  look at what a job left on each node;
- MPICH's hydra starts one proxy per node through its ``ssh`` launcher, whose
  ``-launcher-exec`` is a script here that enters the namespaces instead of
  logging in; node ``k``'s address is ``127.0.0.<k + 2>`` and MPI's traffic
  between nodes goes over the loopback interface (``FI_TCP_IFACE=lo``), never
  another address of the machine.

Making namespaces needs root (CI runs as root); :func:`unavailable` says why not
where they cannot be made, and the tests skip with that reason.

>>> nodes = EmulatedNodes(tmp_path, 2)                          # doctest: +SKIP
>>> subprocess.run(["mpiexec", *nodes.mpiexec_args(2), "-n", "4", "hostname"],
...                env={**os.environ, **nodes.env()})           # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["EmulatedNodes", "unavailable", "address", "hostname"]

# Node k answers at 127.0.0.(FIRST_OCTET + k): 127.0.0.1 stays the machine's own.
FIRST_OCTET = 2

# The ssh stand-in.  hydra runs it as ``<script> -x HOST COMMAND...``; it maps the
# host (an address 127.0.0.N or a name nodeK) to the node and runs the command in
# fresh UTS, mount and IPC namespaces with the node's host name and /dev/shm.
# ``--fork`` makes the command a child of unshare, so it is PID 1 of nothing:
# signals reach it as usual.
_SCRIPT = r"""#!/bin/sh
# Written by spmd.testing.emulated_nodes: hydra's "ssh" into an emulated node.
[ "$1" = "-x" ] && shift
host=$1; shift
case "$host" in
  127.0.0.*) k=$(( ${host##*.} - FIRST )) ;;
  node*) k=${host#node} ;;
  *) echo "emulated nodes: unknown host '$host' (expected 127.0.0.N or nodeK)" >&2; exit 255 ;;
esac
dir="ROOT/node$k"
mkdir -p "$dir/shm"
exec unshare --uts --mount --ipc --fork -- sh -c '
  hostname "node$1" && mount --bind "$2/shm" /dev/shm &&
  shift 2 && exec sh -c "$*"' sh "$k" "$dir" "$@"
"""


def address(k: int) -> str:
    """Node ``k``'s address on the loopback.

    >>> address(1)
    '127.0.0.3'
    """
    return f"127.0.0.{FIRST_OCTET + k}"


def hostname(k: int) -> str:
    """Node ``k``'s host name, as its processes see it (``socket.gethostname()``).

    >>> hostname(1)
    'node1'
    """
    return f"node{k}"


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why emulated nodes cannot be made here, or None when they can.

    >>> unavailable() is None or isinstance(unavailable(), str)
    True
    """
    if not os.path.isdir("/proc/self/ns") or shutil.which("unshare") is None:
        return "emulated nodes need Linux namespaces and util-linux's `unshare`"
    if os.geteuid() != 0:
        return ("emulated nodes need root to make UTS, mount and IPC namespaces "
                "(CI runs as root); run the suite as root to include the multi-node tests")
    probe = subprocess.run(
        ["unshare", "--uts", "--mount", "--ipc", "--fork", "--", "sh", "-c",
         "hostname spmd-probe && mount -t tmpfs tmpfs /dev/shm"],
        capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"`unshare` cannot make a node's namespaces here: {probe.stderr.strip()[-300:]}"
    return None


def _shm_root(pid: str) -> str:
    """The directory mounted on ``/dev/shm`` for process ``pid`` (its root within the
    mounted filesystem); "-" when none is bound there."""
    with open(f"/proc/{pid}/mountinfo") as f:
        # Fields: id, parent, device, root within its filesystem, mount point, ...
        roots = [line.split()[3] for line in f if line.split()[4:5] == ["/dev/shm"]]
    return roots[-1] if roots and roots[-1] != "/" else "-"


class EmulatedNodes:
    """``count`` emulated nodes whose state (each node's ``/dev/shm``, its
    namespace's identity, the launcher script) lives under ``root``."""

    def __init__(self, root, count: int):
        if count < 1:
            raise ValueError(f"count={count}: emulate at least one node")
        self.root = Path(root)
        self.count = count
        self.root.mkdir(parents=True, exist_ok=True)
        for k in range(count):
            self.shm_dir(k).mkdir(parents=True, exist_ok=True)
        self.script = self.root / "enter-node"
        self.script.write_text(_SCRIPT.replace("ROOT", str(self.root))
                               .replace("FIRST", str(FIRST_OCTET)))
        self.script.chmod(0o755)

    def shm_dir(self, k: int) -> Path:
        """Node ``k``'s ``/dev/shm``, as seen from outside the node."""
        return self.root / hostname(k) / "shm"

    def hosts(self, slots) -> str:
        """``-hosts`` text: ``slots`` ranks on every node (an int) or on each
        (a sequence).

        >>> EmulatedNodes("/tmp/x", 2).hosts(2)                  # doctest: +SKIP
        '127.0.0.2:2,127.0.0.3:2'
        """
        per = [slots] * self.count if isinstance(slots, int) else list(slots)
        return ",".join(f"{address(k)}:{n}" for k, n in enumerate(per))

    def launcher_args(self) -> list[str]:
        """hydra's options that start each node's proxy in the node's namespaces
        and keep its control traffic on the loopback."""
        return ["-launcher", "ssh", "-launcher-exec", str(self.script), "-iface", "lo"]

    def mpiexec_args(self, slots) -> list[str]:
        """``-hosts`` plus :meth:`launcher_args`: all plain ``mpiexec`` needs."""
        return ["-hosts", self.hosts(slots), *self.launcher_args()]

    @staticmethod
    def env() -> dict[str, str]:
        """Variables the launch needs: hydra must not start a proxy for an address
        of this machine by a plain fork (which would skip the namespaces), and MPI's
        traffic between nodes stays on the loopback."""
        return {"HYDRA_LAUNCHER_AUTOFORK": "0", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo"}

    def leftovers(self) -> dict[str, list[str]]:
        """``{node name: files}`` for every node whose ``/dev/shm`` is not empty."""
        return {hostname(k): sorted(os.listdir(self.shm_dir(k)))
                for k in range(self.count) if os.listdir(self.shm_dir(k))}

    def pids(self, k: int) -> list[int]:
        """The processes running in node ``k`` now, of any of its launches: those whose
        ``/dev/shm`` is the node's own directory (a path under this object's root, so
        never another test's node).  Not by the last launch's UTS namespace alone: a
        proxy of an earlier launch (an attempt whose mpiexec was killed; hydra's ssh
        launcher puts it in a session of its own) is the node's too, and the kernel
        reuses a namespace's number once its processes have ended."""
        own = str(self.shm_dir(k))
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if own.endswith(_shm_root(entry)):
                        found.append(int(entry))
                except OSError:
                    continue
        return found

    def kill_node(self, k: int, sig: int = signal.SIGKILL) -> list[int]:
        """Every process of node ``k`` gets ``sig``, as when the machine is lost:
        its ranks and its hydra proxy alike.  Returns their pids."""
        victims = self.pids(k)
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return victims

    def wait_gone(self, k: int, timeout_s: float = 10.0) -> bool:
        """Whether node ``k`` has no process left within ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while self.pids(k):
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True
