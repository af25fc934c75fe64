"""``spmd-run``: launch a Python program on N MPI ranks and report failures clearly.

    spmd-run -n 4 examples/train_mlp.py --steps 100
    spmd-run -n 2 --local-devices 4 -m mypkg.train
    python -m spmd.launch -n 4 script.py

It finds an ``mpiexec``, starts ``python -m spmd.launch._rank <target>`` on every
rank with the environment ``spmd`` reads (``SPMD_LOCAL_DEVICES``,
``SPMD_PLATFORM``, thread counts), watches the job, and when a rank fails ends
the whole job and prints which rank failed, its exit status and the end of its
error.  Its own exit status is the failing rank's (124 after ``--timeout``,
130 after Ctrl-C).  See docs/launching.md.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from spmd.launch import _rank

PROG = "spmd-run"
# Exit statuses of the launcher itself.
USAGE_ERROR = 2
TIMED_OUT = 124
INTERRUPTED = 130
# How long a job may go on after a rank reported a failure before the
# launcher ends it itself (mpiexec normally does it at once).
FAILURE_GRACE_S = 5.0
# How long mpiexec gets to end its ranks after SIGTERM before SIGKILL.
TERM_GRACE_S = 3.0
# Lines of each failed rank's error shown in the summary.
ERROR_TAIL = 20

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
               "Exit status: the failing rank's, 124 after --timeout, 130 after Ctrl-C, "
               "2 for a launcher error. See docs/launching.md.")
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
                   help="end the job if it runs longer than this")
    p.add_argument("--mpiexec", metavar="PATH",
                   help="the mpiexec to use (default: $SPMD_MPIEXEC, the one next to this "
                        "Python, then mpiexec/mpirun on PATH, then the mpich wheel's)")
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The launcher's options, plus ``target`` (script or None) and ``args``."""
    parser = _parser()
    ours, rest = _split_argv(parser, argv)
    ns = parser.parse_args(ours)
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


def _ranks_per_node(n: int, environ) -> int:
    # Inside a multi-node Slurm allocation Hydra spreads the ranks over the
    # nodes; otherwise they all run here.
    nodes = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or ""
    nodes = int(nodes) if nodes.isdigit() and int(nodes) > 0 else 1
    return -(-n // nodes)


def build_env(ns: argparse.Namespace, launch_dir: str, environ=None) -> dict[str, str]:
    """The ranks' environment: ours plus what spmd and the BLAS libraries read."""
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
    threads = str(max(1, usable_cores() // _ranks_per_node(ns.np, env)))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, threads)
    env["PYTHONUNBUFFERED"] = "1"
    env["SPMD_LAUNCH_DIR"] = launch_dir
    return env


# Variables Open MPI must be told to export to remote nodes (Hydra exports all).
_EXPORTED = ("SPMD_LOCAL_DEVICES", "SPMD_NUM_DEVICES", "SPMD_PLATFORM", "SPMD_GPU_BACKEND", "OMP_NUM_THREADS",
             "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED", "SPMD_LAUNCH_DIR")


def build_command(ns: argparse.Namespace, mpiexec: str, impl: str,
                  env: dict[str, str]) -> list[str]:
    cmd = [mpiexec]
    if impl == "mpich" and ns.prefix:
        cmd.append("-prepend-rank")
    if impl == "openmpi":
        if ns.prefix:
            cmd.append("--tag-output")
        if hasattr(os, "geteuid") and os.geteuid() == 0 and "OMPI_ALLOW_RUN_AS_ROOT" not in env:
            cmd.append("--allow-run-as-root")
        if ns.np > usable_cores():
            cmd.append("--oversubscribe")
        for name in _EXPORTED:
            if name in env:
                cmd += ["-x", name]
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
    per_node = _ranks_per_node(ns.np, environ)
    if per_node > count and environ.get("SPMD_GPU_BACKEND", "").lower() != "mpi":
        raise LaunchError(
            f"--platform gpu: {per_node} ranks on this node but only {count} GPU(s); NCCL cannot "
            f"put two ranks on one GPU. Launch at most {count} rank(s) per node, or set "
            "SPMD_GPU_BACKEND=mpi to share GPUs and stage collectives through host memory")


# ------------------------------------------------------------------ the job

class _Terminated(Exception):
    """The launcher itself received SIGTERM or SIGHUP."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Job:
    """One ``mpiexec`` run and the per-rank files its ranks write."""

    def __init__(self, cmd: list[str], env: dict[str, str], np: int, launch_dir: str):
        self.cmd, self.env, self.np, self.dir = cmd, env, np, launch_dir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # Its own session: Ctrl-C reaches only the launcher, which then ends
        # the job in order, and the job's processes can be killed as a group.
        self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True,
                                     preexec_fn=_die_with_parent)

    def reports(self) -> dict[int, dict]:
        """Rank -> the result its wrapper recorded (ranks still running have none)."""
        return _rank.read_reports(self.dir)

    def pids(self) -> dict[int, int]:
        """Rank -> pid, for ranks that started on this host."""
        host = socket.gethostname()
        out = {}
        for r in range(self.np):
            info = _rank.read_pid_file(self.dir, r)
            if info and info.get("host") == host and _is_our_rank(info.get("pid"), self.dir):
                out[r] = info["pid"]
        return out

    def wait(self, timeout: float | None) -> tuple[str, int | None]:
        """Watch the job: ("done", rc), ("failed", None), or ("timeout", None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failure_seen = None
        while True:
            try:
                return "done", self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if failure_seen is None and any(rep["status"] != 0
                                            for rep in self.reports().values()):
                failure_seen = now
            if failure_seen is not None and now - failure_seen > FAILURE_GRACE_S:
                return "failed", None  # a rank failed but mpiexec did not end the job
            if deadline is not None and now > deadline:
                return "timeout", None

    def stacks(self, pids: dict[int, int]) -> dict[int, str]:
        """Ask the running ranks for their Python stacks (faulthandler on SIGUSR1)."""
        if not pids or not hasattr(signal, "SIGUSR1"):
            return {}
        for pid in pids.values():
            _signal(pid, signal.SIGUSR1)
        time.sleep(0.5)
        return {r: _rank.read_text(self.dir, r, "stack") for r in pids}

    def end(self) -> int:
        """End every process of the job; return mpiexec's exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            ranks = self.pids()
            try:
                self.proc.send_signal(signal.SIGTERM)  # mpiexec ends its ranks
                self.proc.wait(timeout=TERM_GRACE_S)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):  # or a second Ctrl-C
                _signal(-self.proc.pid, signal.SIGKILL)  # its process group
            finally:
                # Hydra puts each rank in a session of its own: make sure.
                for pid in ranks.values():
                    _signal(pid, signal.SIGKILL)
            self.proc.wait()
        return self.proc.returncode


def _is_our_rank(pid, launch_dir: str) -> bool:
    """``pid`` is alive and is a rank of this job (not a recycled pid)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"SPMD_LAUNCH_DIR={launch_dir}".encode() in f.read().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here (macOS) or not readable: trust the pid if it is alive
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _signal(pid: int, sig) -> None:
    """``os.kill`` that ignores processes already gone (a negative pid is a group)."""
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the launcher dies (Linux), so a
    killed ``spmd-run`` does not leave its job running in a session of its own."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        except (OSError, AttributeError):
            pass


# ------------------------------------------------------------------ summary

def format_ranks(ranks) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)


def _plural(ranks) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)


def _tail(text: str, n: int = ERROR_TAIL) -> str:
    lines = text.rstrip("\n").splitlines()
    if len(lines) > n:
        lines = ["..."] + lines[-n:]
    return "\n".join("    " + ln for ln in lines)


def _ends(text: str, n: int) -> str:
    """The first and last ``n`` lines (a stack's innermost and outermost frames)."""
    lines = text.rstrip("\n").splitlines()
    if len(lines) > 2 * n:
        lines = lines[:n] + ["..."] + lines[-n:]
    return "\n".join("    " + ln for ln in lines)


def failure_summary(np: int, reports: dict[int, dict], rc: int | None,
                    faults: dict[int, str]) -> tuple[str, int]:
    """(the message, the launcher's exit status) for a job that did not succeed."""
    failed = {r: rep for r, rep in reports.items() if rep.get("status", 1) != 0}
    silent = [r for r in range(np) if r not in reports]
    crashed = {r: _without_launcher(faults[r]) for r in silent if faults.get(r, "").strip()}
    lines = []
    if failed:
        first = min(failed, key=lambda r: (failed[r].get("time", 0), r))
        status = int(failed[first]["status"])
        # Ranks failing the same way are shown once.
        groups: dict[tuple, list[int]] = {}
        for r, rep in sorted(failed.items()):
            groups.setdefault((rep["status"], rep.get("kind"), rep.get("error", "")), []).append(r)
        if len(failed) == 1:
            lines.append(f"{PROG}: rank {first} of {np} failed with exit status {status}; "
                         "the job was ended")
        else:
            lines.append(f"{PROG}: {_plural(sorted(failed))} of {np} failed; rank {first} "
                         f"first, with exit status {status}; the job was ended")
        for (st, kind, error), ranks in groups.items():
            what = {"exception": "raised an exception", "exit": f"called sys.exit({st})",
                    "interrupt": "was interrupted (KeyboardInterrupt)"}.get(kind, "failed")
            lines.append(f"--- {_plural(ranks)}: {what}, exit status {st}")
            if error.strip():
                lines.append(_tail(error))
    else:
        status = rc if rc else 1
        if crashed:
            lines.append(f"{PROG}: {_plural(sorted(crashed))} of {np} died on a fatal signal; "
                         f"the job was ended (mpiexec exit status {rc})")
        else:
            lines.append(f"{PROG}: the job failed: mpiexec exited with status {rc} and no rank "
                         "reported an error from Python")
    for r, text in sorted(crashed.items()):
        lines.append(f"--- rank {r}: died on a fatal signal")
        lines.append(_tail(text))
    others = [r for r in silent if r not in crashed]
    if others:
        lines.append(f"({_plural(others)}: no result; ended with the job, killed by a signal "
                     "(e.g. out of memory), or stopped by MPI_Abort)")
    return "\n".join(lines), status


def timeout_summary(np: int, timeout: float, reports: dict[int, dict],
                    pids: dict[int, int], stacks: dict[int, str]) -> str:
    lines = [f"{PROG}: the job did not finish within --timeout {timeout:g}s and was ended"]
    running = [r for r in range(np) if r not in reports]
    if pids:
        still = [r for r in running if r in pids]
        unknown = [r for r in running if r not in pids]
        if still:
            lines.append(f"{_plural(still)} of {np} still running")
        if unknown:
            lines.append(f"({_plural(unknown)} not started here or on another host)")
        finished = [r for r in reports if reports[r].get("status") == 0]
        if finished:
            verb = "was" if len(finished) == 1 else "were"
            lines.append(f"({_plural(finished)} finished the script and {verb} waiting in "
                         "MPI_Finalize for the others)")
        # Ranks stuck at the same place are shown once.
        groups: dict[str, list[int]] = {}
        for r in still:
            where = _current_thread(stacks.get(r, ""))
            if where:
                groups.setdefault(where, []).append(r)
        for where, ranks in groups.items():
            lines.append(f"--- {_plural(ranks)} at (most recent call first):")
            lines.append(_ends(where, 6))
    else:
        lines.append("(cannot tell which ranks were still running)")
    return "\n".join(lines)


def _without_launcher(dump: str) -> str:
    """A faulthandler dump less the launcher's frames and the extension list."""
    keep = [ln for ln in dump.splitlines()
            if "<frozen runpy>" not in ln and "spmd/launch/_rank.py" not in ln
            and not ln.startswith("Extension modules:")]
    return "\n".join(keep).strip()


def _current_thread(dump: str) -> str:
    """The current thread's frames from a faulthandler dump (the last one written)."""
    blocks = dump.split("Current thread")
    if len(blocks) < 2:
        return dump.strip()
    frames = []
    for line in blocks[-1].split("\n\n")[0].splitlines()[1:]:
        line = line.strip()
        if "<frozen runpy>" in line or "runpy.py" in line:
            break  # the launcher's own frames follow
        if line:
            frames.append(line)
    return "\n".join(frames)


# ------------------------------------------------------------------ main

def run(ns: argparse.Namespace) -> int:
    if ns.target is not None and not os.path.isfile(ns.target):
        raise LaunchError(f"script {ns.target!r} not found (working directory {os.getcwd()})")
    if ns.platform == "gpu":
        check_gpu(ns)
    mpiexec = find_mpiexec(ns.mpiexec)
    impl = mpi_implementation(mpiexec)
    if impl == "unknown" and ns.prefix:
        print(f"{PROG}: cannot tell which MPI {mpiexec} is; output lines are not prefixed "
              "with their rank", file=sys.stderr)
    launch_dir = tempfile.mkdtemp(prefix="spmd-run-")
    try:
        env = build_env(ns, launch_dir)
        job = Job(build_command(ns, mpiexec, impl, env), env, ns.np, launch_dir)
        return _supervise(job, ns)
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)


def _supervise(job: Job, ns: argparse.Namespace) -> int:
    # SIGTERM (a cancelled batch job) and SIGHUP (a closed terminal) end the
    # job as Ctrl-C does.
    previous = {sig: signal.signal(sig, _raise_terminated)
                for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig is not None}
    try:
        try:
            job.start()
            outcome, rc = job.wait(ns.timeout)
        except KeyboardInterrupt:
            print(f"\n{PROG}: interrupted; ending the job", file=sys.stderr)
            job.end()
            return INTERRUPTED
        except _Terminated as e:
            print(f"{PROG}: received {signal.Signals(e.signum).name}; ending the job",
                  file=sys.stderr)
            job.end()
            return 128 + e.signum
        if outcome == "timeout":
            pids = job.pids()
            reports = job.reports()
            # Only ranks still in the script have the stack-dump handler.
            stacks = job.stacks({r: p for r, p in pids.items() if r not in reports})
            job.end()
            print(timeout_summary(ns.np, ns.timeout, reports, pids, stacks), file=sys.stderr)
            return TIMED_OUT
        if outcome == "failed":
            rc = job.end()
        reports = job.reports()
        if rc == 0 and all(rep.get("status") == 0 for rep in reports.values()):
            return 0
        if rc is not None and rc < 0:
            rc = 128 - rc  # mpiexec itself died on a signal
        faults = {r: _rank.read_text(job.dir, r, "fault") for r in range(ns.np)}
        message, status = failure_summary(ns.np, reports, rc, faults)
        print(message, file=sys.stderr)
        return status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_terminated(signum, frame):
    raise _Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    """The ``spmd-run`` console script; returns the exit status."""
    ns = parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return run(ns)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
