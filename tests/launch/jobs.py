"""Helpers of the launcher tests that run small jobs under ``spmd-run`` and look at
what they leave in ``/dev/shm`` (test_cleanup.py, test_restarts.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from tests.mpi import PSUM_JOB, REPO_ROOT, mpiexec_or_skip

SHM = "/dev/shm"

# The job's start: a psum of 32 KiB per rank (spmd's shared window: from 16 KiB),
# then the ranks report what they map in /dev/shm.
HEADER = PSUM_JOB + textwrap.dedent("""
    import json
    x = np.ones(spmd.device_count() * 8192, np.float32)
    step(x)

    def segments():
        found = {}
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                    found[parts[5].strip()] = int(parts[4])
        return found

    print("SEGMENTS " + json.dumps(segments()), flush=True)
""")

def launch_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MV2_", "HYDRA_", "MPIR_", "SLURM_"))}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [
                   p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("SPMD_NUM_DEVICES", None)
    env.update(extra)
    return env


class Background:
    """``argv`` run in the background in ``cwd`` with ``env`` (its own session, so that
    a hung job's whole group can be killed), stdout and stderr collected together
    by a thread."""

    def __init__(self, argv: list[str], cwd, env: dict):
        self.lines: list[str] = []
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            argv, cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True, stdin=subprocess.DEVNULL,
            # A shell running the suite in the background may have ignored SIGINT, and
            # Python then never raises KeyboardInterrupt: a test's Ctrl-C would do nothing.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, count: int, timeout: float) -> bool:
        """Whether ``text`` was printed ``count`` times within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.out.count(text) >= count:
                return True
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        return self.out.count(text) >= count

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None after killing the job's group past ``timeout``."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self._reader.join(timeout=5)
            return None
        self._reader.join(timeout=5)
        return self.proc.returncode


class Launch(Background):
    """``python -m spmd.launch [options] -n N script`` in the background, its output
    collected by a thread."""

    def __init__(self, script: str | None, n: int, tmp_path, name: str = "job.py",
                 options=(), env=None, script_path=None, args=()):
        """``script``: source text, written to ``tmp_path / name``; or None and
        ``script_path``, a file to run, with ``args``."""
        mpiexec_or_skip()
        path = script_path
        if script is not None:
            path = tmp_path / name
            path.write_text(script)
        super().__init__([sys.executable, "-m", "spmd.launch", *options, "-n", str(n),
                          str(path), *map(str, args)], REPO_ROOT, launch_env(env or {}))


def reported(out: str) -> dict[str, int]:
    """The named (not deleted) /dev/shm files the ranks reported mapping: path -> inode."""
    found = {}
    for line in out.splitlines():
        if "SEGMENTS " in line:
            for path, ino in json.loads(line.split("SEGMENTS ", 1)[1]).items():
                if not path.endswith(" (deleted)"):
                    found[path] = ino
    return found


def still_there(files: dict[str, int]) -> list[str]:
    """Those of ``files`` that still exist as the same inode."""
    left = []
    for path, ino in files.items():
        try:
            if os.stat(path).st_ino == ino:
                left.append(path)
        except FileNotFoundError:
            pass
    return left


def listing() -> dict[str, int]:
    out = {}
    for name in os.listdir(SHM):
        try:
            out[name] = os.stat(os.path.join(SHM, name)).st_ino
        except OSError:
            pass
    return out


def used_inodes() -> set[int]:
    used = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith(SHM + "/"):
                        used.add(int(parts[4]))
        except OSError:
            pass
    return used


def new_unused(before: dict[str, int]) -> list[str]:
    """Files in /dev/shm now that were not there before and that no process maps
    (this job's leftovers, or another job's that ended meanwhile)."""
    used = used_inodes()
    return sorted(n for n, ino in listing().items() if before.get(n) != ino and ino not in used)
