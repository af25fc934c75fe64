"""What ``spmd-run`` does when ranks run on hosts other than its own: the launch
directory on a filesystem every host shares, and the cleanup pass that has every
host remove its own leftover shared memory (the launcher cannot see another
machine's ``/dev/shm``).

>>> cleanup_command(ns, "mpiexec", "mpich", "/work/.spmd-run/job-x")   # doctest: +SKIP
['mpiexec', '-hosts', 'node0:1,node1:1', '-n', '2', '/venv/bin/python', '-m',
 'spmd.launch.cleanup', '/work/.spmd-run/job-x']
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from spmd.launch import memory_tier
from spmd.launch.hosts import HostsError, host_args, is_local as _is_local
from spmd.launch.summary import PROG

# The launch directory's parent when hosts other than this one run ranks.
SHARED_LAUNCH_DIR = ".spmd-run"
# How long the cleanup pass on every host may take (a host that does not answer
# would hold it until then).
CLEANUP_PASS_S = 30.0


def make_launch_dir(ns: argparse.Namespace) -> str:
    """A fresh launch directory for one attempt: under --launch-dir when given; with
    hosts other than this one under ``.spmd-run/`` of the working directory (the
    ranks on other hosts must reach it: it must be on a filesystem every host mounts
    at the same path); else a temporary directory of this machine.

    >>> make_launch_dir(ns)                                       # doctest: +SKIP
    '/home/me/run/.spmd-run/job-k1q2'
    """
    parent = ns.launch_dir
    if parent is None and ns.remote:
        parent = os.path.join(os.getcwd(), SHARED_LAUNCH_DIR)
    if parent is None:
        return tempfile.mkdtemp(prefix="spmd-run-")
    parent = os.path.abspath(parent)
    try:
        os.makedirs(parent, exist_ok=True)
        return tempfile.mkdtemp(prefix="job-", dir=parent)
    except OSError as e:
        raise HostsError(f"--launch-dir {parent!r}: cannot make the job's directory there "
                          f"({e.strerror}); give a writable directory that every host "
                          "mounts at the same path") from None


def remove_launch_dir(launch_dir: str) -> None:
    """Remove the attempt's directory, and ``.spmd-run/`` too once it is empty.

    >>> remove_launch_dir("/home/me/run/.spmd-run/job-k1q2")      # doctest: +SKIP
    """
    shutil.rmtree(launch_dir, ignore_errors=True)
    parent = os.path.dirname(launch_dir)
    if os.path.basename(parent) == SHARED_LAUNCH_DIR:
        try:
            os.rmdir(parent)  # (fails while another job's directory is there: kept)
        except OSError:
            pass


def cleanup_command(ns: argparse.Namespace, mpiexec: str, impl: str, launch_dir: str,
                    hosts: list[str] | None = None, what: list[str] | None = None) -> list[str]:
    """One process on every host of the job (or of ``hosts``), each removing its own
    node's leftovers: the segments (:func:`spmd.launch.cleanup.main`), or ``what``
    (other arguments of that pass), started as the job was."""
    used = list(dict.fromkeys(ns.rank_hosts if hosts is None else hosts))
    cmd = [mpiexec]
    if impl == "openmpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += host_args(ns, impl, launch_dir, placement=[(h, 1) for h in used])
    cmd += list(ns.mpiexec_args or [])
    return cmd + ["-n", str(len(used)), sys.executable, "-m", "spmd.launch.cleanup",
                  *(what or [launch_dir])]


def clean_every_host(ns: argparse.Namespace, mpiexec: str, impl: str, env: dict,
                     launch_dir: str, hosts: list[str] | None = None,
                     what: list[str] | None = None, name: str = "shared memory",
                     left: str = "segments") -> bool:
    """Run the cleanup pass on every host (a node cleans its own /dev/shm: the
    launcher cannot see it); whether it completed.  Says so when it did not.

    >>> clean_every_host(ns, "mpiexec", "mpich", env, launch_dir)  # doctest: +SKIP
    True
    """
    cmd = cleanup_command(ns, mpiexec, impl, launch_dir, hosts, what)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=CLEANUP_PASS_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and what it started here
        proc.communicate()
        print(f"{PROG}: the cleanup of the hosts' {name} did not finish within "
              f"{CLEANUP_PASS_S:g}s (a host does not answer?); {left} may be left in "
              "/dev/shm there", file=sys.stderr)
        return False
    except BaseException:  # Ctrl-C or SIGTERM meanwhile: leave nothing running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-5:])
        print(f"{PROG}: the cleanup of the hosts' {name} failed (mpiexec exit status "
              f"{proc.returncode}); {left} may be left in /dev/shm there:\n{tail}",
              file=sys.stderr)
        return False
    return True


def remove_memory_tier(ns: argparse.Namespace, mpiexec: str, impl: str, env: dict,
                       used: list[str]) -> None:
    """Once the job has ended: remove its in-memory checkpoints
    (:mod:`spmd.launch.memory_tier`) on every host it used.  The last attempt's
    hosts first, in one pass; then, each alone, hosts only earlier attempts used (a
    lost host may not answer: it must not keep the others' memory from being freed).

    >>> remove_memory_tier(ns, "mpiexec", "mpich", env, ["node0", "node1"])  # doctest: +SKIP
    """
    if all(_is_local(h) for h in used):
        memory_tier.remove(ns.job_id)  # every rank ran here
        return
    if not getattr(ns, "tier_used", False):
        return  # (no rank kept a step in memory: no pass over the hosts)
    last = list(dict.fromkeys(ns.rank_hosts or []))
    passes = [last] + [[h] for h in dict.fromkeys(used) if h not in last]
    launch_dir = make_launch_dir(ns)
    try:
        for hosts in passes:
            if hosts:
                clean_every_host(ns, mpiexec, impl, env, launch_dir, hosts,
                                 ["--memory-tier", ns.job_id], "in-memory checkpoints",
                                 "they")
    finally:
        remove_launch_dir(launch_dir)
