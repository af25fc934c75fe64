"""``spmd-run``: launch a Python program on N MPI ranks and report failures clearly.

    spmd-run -n 4 examples/train_mlp.py --steps 100
    spmd-run -n 2 --local-devices 4 -m mypkg.train
    python -m spmd.launch -n 4 script.py

It finds an ``mpiexec``, starts ``python -m spmd.launch._rank <target>`` on every
rank with the environment ``spmd`` reads (``SPMD_LOCAL_DEVICES``,
``SPMD_PLATFORM``, thread counts), watches the job, and when a rank fails ends
the whole job and prints which rank failed, its exit status and the end of its
error.  Its own exit status is the failing rank's (124 after ``--timeout``,
130 after Ctrl-C).  After every job it removes the shared-memory segments the
job's ranks left (:mod:`spmd.launch.cleanup`).  With ``--max-restarts N`` a job
whose ranks failed is started again, up to N times (:func:`run`).  With ``--trace
PATH`` (or ``--trace-summary``, ``--trace-plot PNG``) every rank records its timeline
and, after the job however it ended, the launcher merges, summarises and draws it
(:mod:`spmd.launch.timeline.launcher`).

    spmd-run -n 8 --hosts node0:4,node1:4 --mpiexec-arg -launcher --mpiexec-arg ssh train.py

places the ranks on other hosts (``--hosts``, ``--hostfile``, or Slurm's
allocation: :func:`resolve_hosts`); the launch directory is then on a shared
filesystem (:func:`spmd.launch.multihost.make_launch_dir`) and every host cleans its own
/dev/shm after each attempt (:func:`spmd.launch.multihost.clean_every_host`).  See docs/launching.md.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from spmd.launch import _rank, alive, elastic, hosts, memory_tier, multihost, nodes
from spmd.launch.job import FAILURE_GRACE_S, TERM_GRACE_S, Job, _Terminated  # noqa: F401
from spmd.launch.timeline import launcher as timeline
from spmd.launch.summary import (PROG, failure_summary, format_ranks,  # noqa: F401
                                 lost_host, stranded_summary, timeout_summary)

# Exit statuses of the launcher itself.
USAGE_ERROR = 2
TIMED_OUT = 124
INTERRUPTED = 130
# Exit status when ranks that finished left others waiting in a collective.
STRANDED = 1

INSTALL_MPI = ("install one into this environment with `pip install mpich mpi4py` "
               "(or use a system MPI: e.g. `apt-get install mpich`, then `pip install mpi4py`), "
               "or name one with --mpiexec PATH or SPMD_MPIEXEC=PATH")
INSTALL_CUPY = ("install CuPy for your CUDA version: `pip install cupy-cuda12x` (CUDA 12) "
                "or `pip install cupy-cuda13x` (CUDA 13)")


class LaunchError(Exception):
    """A problem found before the job starts; the launcher exits with USAGE_ERROR."""


# ------------------------------------------------------------------ arguments

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} -n N [options] (script.py | -m module) [args...]",
        description="Run a Python program on N MPI ranks (one spmd process each).",
        epilog="Everything after the script (or -m module) is passed to it. "
               "Exit status: the failing rank's (the last attempt's with --max-restarts), "
               "124 after --timeout, 130 after Ctrl-C, 2 for a launcher error. "
               "See docs/launching.md.")
    p.add_argument("-n", "--np", dest="np", metavar="N", required=True,
                   type=_positive(int, "a positive integer"), help="number of ranks (processes)")
    p.add_argument("--local-devices", metavar="K", type=_positive(int, "a positive integer"),
                   help="devices per rank (sets SPMD_LOCAL_DEVICES; default 1)")
    p.add_argument("--platform", choices=("cpu", "gpu"),
                   help="device platform (sets SPMD_PLATFORM; default cpu)")
    p.add_argument("--prefix", action=argparse.BooleanOptionalAction, default=True,
                   help="prefix each output line with its rank (default: on)")
    p.add_argument("--timeout", metavar="SECONDS",
                   type=_positive(float, "a positive number of seconds"),
                   help="end the job if it runs longer than this (all attempts together "
                        "with --max-restarts; not restarted)")
    p.add_argument("--max-restarts", metavar="N", type=_non_negative_int, default=0,
                   help="start the whole job again after its ranks fail, up to N times "
                        "(sets SPMD_RESTART_ATTEMPT and SPMD_MAX_RESTARTS; default 0)")
    p.add_argument("--min-ranks", metavar="M", type=_positive(int, "a positive integer"),
                   help="with --max-restarts: after ranks die (killed, or their host lost), "
                        "restart on the survivors while at least M remain (docs/launching.md)")
    p.add_argument("--spare", metavar="HOST:SLOTS,...",
                   help="with --min-ranks: hosts that take a lost host's place before the "
                        "job shrinks")
    p.add_argument("--mpiexec", metavar="PATH",
                   help="the mpiexec to use (default: $SPMD_MPIEXEC, the one next to this "
                        "Python, then mpiexec/mpirun on PATH, then the mpich wheel's)")
    p.add_argument("--hosts", metavar="HOST:SLOTS,...",
                   help="run the ranks on these hosts, SLOTS ranks each, filled in order "
                        "(MPICH's form; HOST alone is one slot)")
    p.add_argument("--hostfile", metavar="FILE",
                   help="the hosts, one a line: HOST, HOST:SLOTS (MPICH) or HOST slots=SLOTS "
                        "(Open MPI); # starts a comment")
    p.add_argument("--mpiexec-arg", metavar="ARG", action="append", default=[],
                   dest="mpiexec_args",
                   help="pass ARG to mpiexec as it is (repeatable, in order), e.g. "
                        "--mpiexec-arg -launcher --mpiexec-arg ssh")
    p.add_argument("--launch-dir", metavar="DIR",
                   help="where the ranks write their results and records; with hosts other "
                        "than this one it must be on a filesystem every host mounts at the "
                        "same path (default: .spmd-run/ in the working directory; on one "
                        "host: a temporary directory)")
    timeline.add_arguments(p)
    p.add_argument("-m", dest="module", metavar="MODULE",
                   help="run a module as `python -m MODULE` would")
    return p


def _positive(kind, what: str):
    """An argparse ``type=`` accepting positive ``kind`` values only."""
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return convert


def _non_negative_int(text: str) -> int:
    """``--max-restarts``: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer (the number of restarts after a failure; 0 "
            f"never restarts), got {text!r}")
    return value


def _split_argv(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(launcher options, [script, args...]): the target starts at the first
    non-option word, after ``-m MODULE``, or after ``--``."""
    takes_value = {s for a in parser._actions if a.nargs != 0 and a.option_strings
                   for s in a.option_strings}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv[:i], argv[i + 1:]
        if tok == "-m":
            return argv[:i + 2], argv[i + 2:]
        if tok.startswith("-m") and not tok.startswith("--"):
            return argv[:i + 1], argv[i + 1:]  # -mmodule
        if not tok.startswith("-") or tok == "-":
            return argv[:i], argv[i:]
        i += 2 if tok in takes_value else 1
    return argv, []


def _join_mpiexec_args(argv: list[str]) -> list[str]:
    """``--mpiexec-arg -launcher`` -> ``--mpiexec-arg=-launcher``: argparse would take a
    value that starts with ``-`` for an option of its own."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--mpiexec-arg" and i + 1 < len(argv):
            out.append(f"--mpiexec-arg={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The launcher's options, plus ``target`` (script or None) and ``args``."""
    parser = _parser()
    ours, rest = _split_argv(parser, argv)
    ns = parser.parse_args(_join_mpiexec_args(ours))
    if ns.hosts is not None and ns.hostfile is not None:
        parser.error(f"--hosts {ns.hosts!r} and --hostfile {ns.hostfile!r} both name the "
                     "hosts; give one of them")
    ns.placement, ns.rank_hosts, ns.remote = None, None, False  # (resolve_hosts)
    timeline.apply_defaults(ns)
    if ns.module is not None:
        ns.target, ns.args = None, rest
    elif rest:
        ns.target, ns.args = rest[0], rest[1:]
    else:
        parser.error("missing the program to run: give a script (spmd-run -n 4 train.py) "
                     "or a module (spmd-run -n 4 -m package.module)")
    return ns


# ------------------------------------------------------------------ mpiexec

def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _wheel_mpiexec() -> str | None:
    """The ``mpiexec`` that PyPI's mpich wheel installed, if it is installed."""
    try:
        files = importlib.metadata.distribution("mpich").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "mpiexec" and f.parent.name == "bin":
            path = str(f.locate())
            if _executable(path):
                return os.path.normpath(path)
    return None


def find_mpiexec(explicit: str | None = None, environ=None,
                 executable: str | None = None) -> str:
    """The mpiexec to use, in the order documented on ``--mpiexec``.

    Raises LaunchError saying how to install one when there is none.
    """
    environ = os.environ if environ is None else environ
    for source, path in (("--mpiexec", explicit), ("SPMD_MPIEXEC", environ.get("SPMD_MPIEXEC"))):
        if path:
            found = path if os.sep in path else shutil.which(path, path=environ.get("PATH", ""))
            if found and _executable(found):
                return found
            raise LaunchError(f"{source} {path!r}: no such executable; {INSTALL_MPI}")
    # Not resolved through symlinks: a venv's python links to the system one.
    bindir = os.path.dirname(executable or sys.executable)
    names = ("mpiexec", "mpirun")
    candidates = ([os.path.join(bindir, name) for name in names]
                  + [shutil.which(name, path=environ.get("PATH", "")) for name in names]
                  + [_wheel_mpiexec()])
    for path in candidates:
        if path and _executable(path):
            return path
    raise LaunchError(f"no mpiexec found (looked next to {executable or sys.executable}, "
                      f"on PATH, and for the mpich wheel); {INSTALL_MPI}")


@functools.lru_cache(maxsize=None)
def mpi_implementation(mpiexec: str) -> str:
    """``"mpich"`` (Hydra: MPICH, Intel MPI, MVAPICH), ``"openmpi"`` or ``"unknown"``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=20, stdin=subprocess.DEVNULL)
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "Open MPI" in text or "OpenRTE" in text or "open-mpi" in text.lower():
        return "openmpi"
    if "HYDRA" in text or "Hydra" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return "mpich"
    return "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ranks_per_node(n: int, environ, simulate: bool = False,
                    rank_hosts: list[str] | None = None) -> int:
    # With the hosts known (rank_hosts: each rank's host), the most ranks one host
    # runs; else one answer for every node-aware choice: spmd.launch.nodes (Slurm's
    # node count; with simulate, SPMD_SIMULATE_NODES too).
    if rank_hosts:
        return max(len(r) for r in hosts.ranks_per_host(rank_hosts).values())
    return nodes.ranks_per_node(n, environ, simulate)


def resolve_hosts(ns: argparse.Namespace, environ=None) -> None:
    """Set ``ns.placement`` (the hosts and their slots, or None: every rank on this
    machine), ``ns.rank_hosts`` (each rank's host) and ``ns.remote`` (whether a host
    other than this one runs ranks), from --hosts, --hostfile or Slurm's allocation.
    LaunchError naming the input and the fix when it cannot be read or -n does not fit.

    >>> ns = parse_args(["-n", "3", "--hosts", "a:2,b:2", "t.py"]); resolve_hosts(ns, {})
    >>> ns.rank_hosts, ns.remote
    (['a', 'a', 'b'], True)
    """
    environ = os.environ if environ is None else environ
    try:
        if ns.hosts is not None:
            placement, source = hosts.parse_hosts(ns.hosts), f"--hosts {ns.hosts!r}"
        elif ns.hostfile is not None:
            placement, source = hosts.read_hostfile(ns.hostfile), f"--hostfile {ns.hostfile!r}"
        else:
            placement, source = hosts.slurm_placement(environ), "the Slurm allocation"
        if placement is not None:
            hosts.check_fits(placement, ns.np, source)
    except hosts.HostsError as e:
        raise LaunchError(str(e)) from None
    ns.placement = placement
    ns.rank_hosts = None if placement is None else hosts.assign(placement, ns.np)
    ns.remote = bool(ns.rank_hosts) and not all(hosts.is_local(h) for h in ns.rank_hosts)


def build_env(ns: argparse.Namespace, launch_dir: str, environ=None,
              attempt: int = 0) -> dict[str, str]:
    """The ranks' environment: ours plus what spmd and the BLAS libraries read, and
    which attempt of the job this is (``attempt``: 0 first)."""
    env = dict(os.environ if environ is None else environ)
    if ns.local_devices is not None:
        env["SPMD_LOCAL_DEVICES"] = str(ns.local_devices)
    if ns.platform is not None:
        env["SPMD_PLATFORM"] = ns.platform
    if ns.np == 1:
        # A job of one rank is not detected as MPI (size 1): it reads
        # SPMD_NUM_DEVICES, which must then mean the rank's devices.
        env["SPMD_NUM_DEVICES"] = env.get("SPMD_LOCAL_DEVICES", "1")
    # The ranks share the cores: with each BLAS/OpenMP pool as wide as the
    # machine, N ranks oversubscribe it (4 ranks on 2 cores ran 10x slower).
    # (Across hosts: this machine's cores stand for every host's.)
    per_host = _ranks_per_node(ns.np, env, rank_hosts=getattr(ns, "rank_hosts", None))
    threads = str(max(1, usable_cores() // per_host))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, threads)
    # OpenBLAS's threads then sleep soon after a call instead of spinning on the
    # cores spmd's threaded kernels use (spmd/config.py says why).
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", "12")
    env["PYTHONUNBUFFERED"] = "1"
    env["SPMD_LAUNCH_DIR"] = launch_dir
    if getattr(ns, "remote", False):
        # Where the ranks connect to the launcher: set by Job.start when it listens;
        # named here so that Open MPI exports it (-x) to the other hosts.
        env[alive.ENV] = ""
    # As torchrun's TORCHELASTIC_RESTART_COUNT / TORCHELASTIC_MAX_RESTARTS.
    env["SPMD_RESTART_ATTEMPT"] = str(attempt)
    env["SPMD_MAX_RESTARTS"] = str(getattr(ns, "max_restarts", 0) or 0)
    # One id for the whole run, its restarts included: the in-memory checkpoints'
    # directory (spmd.launch.memory_tier), found again by the next attempt.
    env[memory_tier.JOB_ENV] = getattr(ns, "job_id", None) or memory_tier.new_job_id()
    timeline.rank_env(ns, launch_dir, env)
    return env


# Variables Open MPI must be told to export to remote nodes (Hydra exports all).
_EXPORTED = ("SPMD_LOCAL_DEVICES", "SPMD_NUM_DEVICES", "SPMD_PLATFORM", "SPMD_GPU_BACKEND", "OMP_NUM_THREADS",
             "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT",
             "PYTHONUNBUFFERED", "SPMD_LAUNCH_DIR", "SPMD_LAUNCHER_ALIVE",
             "SPMD_RESTART_ATTEMPT", "SPMD_MAX_RESTARTS", memory_tier.JOB_ENV) + timeline.RANK_VARS


def build_command(ns: argparse.Namespace, mpiexec: str, impl: str,
                  env: dict[str, str]) -> list[str]:
    cmd = [mpiexec]
    if impl == "mpich" and ns.prefix:
        cmd.append("-prepend-rank")
    if impl == "mpich":
        cmd.append("-print-all-exitcodes")  # names a rank killed by a signal
    if impl == "openmpi":
        if ns.prefix:
            cmd.append("--tag-output")
        if hasattr(os, "geteuid") and os.geteuid() == 0 and "OMPI_ALLOW_RUN_AS_ROOT" not in env:
            cmd.append("--allow-run-as-root")
        if ns.np > usable_cores() and not getattr(ns, "placement", None):
            cmd.append("--oversubscribe")
        for name in _EXPORTED:
            if name in env:
                cmd += ["-x", name]
    cmd += hosts.host_args(ns, impl, env.get("SPMD_LAUNCH_DIR", "."))
    cmd += list(getattr(ns, "mpiexec_args", None) or [])
    cmd += ["-n", str(ns.np), sys.executable, "-m", "spmd.launch._rank"]
    cmd += ["-m", ns.module] if ns.module is not None else [ns.target]
    return cmd + list(ns.args)


# ------------------------------------------------------------------ GPU check

def _cupy_gpu_count() -> tuple[bool, int, str]:
    """(CuPy installed, GPUs it sees, why none when it sees none)."""
    if importlib.util.find_spec("cupy") is None:
        return False, 0, ""
    try:
        import cupy

        return True, int(cupy.cuda.runtime.getDeviceCount()), ""
    except Exception as e:  # noqa: BLE001 - a missing driver raises CUDA's own types
        return True, 0, f"{type(e).__name__}: {e}"


def check_gpu(ns: argparse.Namespace, environ=None) -> None:
    """Raise LaunchError when ``--platform gpu`` cannot work on this machine."""
    environ = os.environ if environ is None else environ
    installed, count, why = _cupy_gpu_count()
    if not installed:
        raise LaunchError(f"--platform gpu needs CuPy, which is not installed; {INSTALL_CUPY}")
    if count == 0:
        detail = f" ({why})" if why else ""
        raise LaunchError(f"--platform gpu: CuPy is installed but sees no GPU{detail}; check the "
                          "NVIDIA driver (`nvidia-smi`) and that CuPy matches the CUDA version, "
                          f"or run on CPU (--platform cpu)")
    # GPUs are per (simulated) node; with hosts given, per host.
    per_node = _ranks_per_node(ns.np, environ, simulate=True,
                               rank_hosts=getattr(ns, "rank_hosts", None))
    if per_node > count and environ.get("SPMD_GPU_BACKEND", "").lower() != "mpi":
        raise LaunchError(
            f"--platform gpu: {per_node} ranks on this node but only {count} GPU(s); NCCL cannot "
            f"put two ranks on one GPU. Launch at most {count} rank(s) per node, or set "
            "SPMD_GPU_BACKEND=mpi to share GPUs and stage collectives through host memory")


# ------------------------------------------------------------------ main

def run(ns: argparse.Namespace) -> int:
    """Check the machine, then run the job, again after a failure of its ranks while
    ``--max-restarts`` allows; return the last attempt's exit status.

    Not restarted: a job that succeeded, ran past ``--timeout`` (a limit on the
    whole run) or was interrupted (Ctrl-C, SIGTERM, SIGHUP).  Every attempt gets
    a fresh launch directory, and its leftover shared memory is removed before
    the next one starts."""
    if ns.target is not None and not os.path.isfile(ns.target):
        raise LaunchError(f"script {ns.target!r} not found (working directory {os.getcwd()})")
    timeline.check(ns)
    resolve_hosts(ns)
    ns.spare_hosts = elastic.parse_spare(ns.spare)
    elastic.check_options(ns.np, ns.min_ranks, ns.max_restarts, ns.spare_hosts, ns.placement)
    if ns.platform == "gpu":
        check_gpu(ns)
    mpiexec = find_mpiexec(ns.mpiexec)
    impl = mpi_implementation(mpiexec)
    if impl == "unknown" and ns.prefix:
        print(f"{PROG}: cannot tell which MPI {mpiexec} is; output lines are not prefixed "
              "with their rank", file=sys.stderr)
    attempts = ns.max_restarts + 1
    deadline = None if ns.timeout is None else time.monotonic() + ns.timeout
    # SIGTERM (a cancelled batch job) and SIGHUP (a closed terminal) end the
    # job as Ctrl-C does, also between two attempts.
    previous = {sig: signal.signal(sig, _raise_terminated)
                for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig is not None}
    ns.job_id, used = memory_tier.new_job_id(), []  # (used: every attempt's hosts)
    try:
        for attempt in range(attempts):
            used += ns.rank_hosts or []
            status, restartable, loss = _attempt(ns, mpiexec, impl, attempt, deadline)
            if status == 0 or not restartable or attempt + 1 == attempts:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                print(f"{PROG}: not restarting the job: --timeout {ns.timeout:g}s has passed",
                      file=sys.stderr)
                return status
            if ns.min_ranks is None:
                print(f"{PROG}: restarting the job (attempt {attempt + 2} of {attempts})",
                      file=sys.stderr, flush=True)
            elif not _resize(ns, loss, f"attempt {attempt + 2} of {attempts}"):
                return status
        return status
    except KeyboardInterrupt:  # between two attempts (during one, _supervise has it)
        print(f"\n{PROG}: interrupted; not restarting the job", file=sys.stderr)
        return INTERRUPTED
    except _Terminated as e:
        print(f"{PROG}: received {signal.Signals(e.signum).name}; not restarting the job",
              file=sys.stderr)
        return 128 + e.signum
    finally:
        try:  # (however the job ended: its in-memory checkpoints are of no more use)
            multihost.remove_memory_tier(ns, mpiexec, impl, dict(os.environ), used)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _resize(ns: argparse.Namespace, loss: elastic.Loss | None, which: str) -> bool:
    """``--min-ranks``: set the next attempt's size and hosts in ``ns`` after ``loss``
    (None: the failure was not a lost rank, the size stays) and say so; False, with
    the error printed, when fewer than --min-ranks ranks are left."""
    current = elastic.Attempt(ns.np, ns.placement, ns.spare_hosts)
    try:
        nxt = current if loss is None else elastic.next_attempt(current, ns.rank_hosts, loss,
                                                                ns.min_ranks)
    except elastic.ElasticError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return False
    ns.np, ns.placement, ns.spare_hosts = nxt.np, nxt.placement, nxt.spare
    ns.rank_hosts = None if nxt.placement is None else hosts.assign(nxt.placement, nxt.np)
    ns.remote = bool(ns.rank_hosts) and not all(hosts.is_local(h) for h in ns.rank_hosts)
    where = "" if not ns.rank_hosts else " (" + ",".join(
        f"{h}:{len(rs)}" for h, rs in hosts.ranks_per_host(ns.rank_hosts).items()) + ")"
    why = nxt.why or "the same size (the failure was not a lost rank)"
    print(f"{PROG}: {which} on {ns.np} ranks{where}: {why}", file=sys.stderr, flush=True)
    return True


def _attempt(ns: argparse.Namespace, mpiexec: str, impl: str, attempt: int,
             deadline: float | None) -> tuple[int, bool, elastic.Loss | None]:
    """One run of the job: (exit status, whether a restart may follow, the ranks it
    lost: :func:`spmd.launch.elastic.lost_ranks`)."""
    launch_dir = multihost.make_launch_dir(ns)
    job = None
    try:
        env = build_env(ns, launch_dir, attempt=attempt)
        address = alive.launcher_address(ns.mpiexec_args, env) if ns.remote else None
        job = Job(build_command(ns, mpiexec, impl, env), env, ns.np, launch_dir,
                  rank_hosts=ns.rank_hosts, alive_address=address)
        outcome = _supervise(job, ns, deadline)
        timeline.finish(ns, launch_dir, attempt)  # (after the job's summary, if any)
        return outcome
    finally:
        ns.tier_used = getattr(ns, "tier_used", False) or memory_tier.used(launch_dir)
        try:
            if job is not None:
                job.cleanup()
                if ns.remote:
                    multihost.clean_every_host(ns, mpiexec, impl, env, launch_dir)
        finally:
            multihost.remove_launch_dir(launch_dir)


def _supervise(job: Job, ns: argparse.Namespace,
               deadline: float | None = None) -> tuple[int, bool, elastic.Loss | None]:
    """Start and watch ``job``, end it when needed and print why it failed; return
    (exit status, whether the failure is one that ``--max-restarts`` restarts, the
    ranks it lost when it failed because ranks died)."""
    try:
        job.start()
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        outcome, rc = job.wait(remaining)
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; ending the job", file=sys.stderr)
        job.end()
        return INTERRUPTED, False, None
    except _Terminated as e:
        print(f"{PROG}: received {signal.Signals(e.signum).name}; ending the job",
              file=sys.stderr)
        job.end()
        return 128 + e.signum, False, None
    if outcome == "timeout":
        pids = job.pids()
        reports = job.reports()
        # Only ranks still in the script have the stack-dump handler.
        stacks = job.stacks({r: p for r, p in pids.items() if r not in reports})
        job.end()
        print(timeout_summary(ns.np, ns.timeout, reports, pids, stacks, job.hosts()),
              file=sys.stderr)
        return TIMED_OUT, False, None
    if outcome == "stranded":
        finished, waits = rc
        job.end()
        print(stranded_summary(ns.np, finished, waits, job.hosts()), file=sys.stderr)
        return STRANDED, True, None
    if outcome == "failed":
        rc = job.end()
    reports = job.reports()
    if rc == 0 and all(rep.get("status") == 0 for rep in reports.values()):
        return 0, False, None
    if rc is not None and rc < 0:
        rc = 128 - rc  # mpiexec itself died on a signal
    faults = {r: _rank.read_text(job.dir, r, "fault") for r in range(ns.np)}
    killed, hosts = job.killed(), job.hosts()
    # (A box or exit codes from mpiexec: its proxies reported; no host was lost.)
    said = job.banner.get("codes") or job.held
    lost = lost_host(ns.np, reports, said, [r for _, r in job.exits], hosts,
                     job.connected_at_end())
    message, status = failure_summary(ns.np, reports, rc, faults, killed, hosts, lost)
    print(message, file=sys.stderr)
    hydra = job.mpiexec_messages()
    if hydra and not killed:  # (a rank's banner says no more than the summary)
        print(hydra, file=sys.stderr)
    return status, True, elastic.lost_ranks(ns.np, reports, faults, killed, lost, hosts)


def _raise_terminated(signum, frame):
    raise _Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    """The ``spmd-run`` console script; returns the exit status."""
    ns = parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return run(ns)
    except (LaunchError, hosts.HostsError, elastic.ElasticError,
            timeline.TraceOptionError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
