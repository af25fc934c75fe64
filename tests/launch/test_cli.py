"""The ``spmd-run`` launcher, its per-rank wrapper and ``spmd.distributed``.

Single-process pytest: every multi-process job runs as a subprocess with a
``timeout=``, so a hang fails the test.  Tests that need MPI skip (with the
reason) when this interpreter's environment has no mpiexec or no mpi4py;
``make venv`` installs both.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import spmd
from spmd.errors import ArgumentError
from spmd.launch import cli, runtime
from spmd.mesh.devices import reset_for_tests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Limit for one launcher run; the jobs themselves take seconds.
JOB_TIMEOUT = 120


def _mpiexec():
    try:
        return cli.find_mpiexec()
    except cli.LaunchError:
        return None


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpiexec and mpi4py in this Python's environment (make venv, or "
           "pip install mpich mpi4py)")


def _env(**extra):
    """This environment without any launcher's rank variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MV2_", "SLURM_", "HYDRA_"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def spmd_run(*args, cwd, env=None, timeout=JOB_TIMEOUT):
    """``python -m spmd.launch args...``; returns (CompletedProcess, seconds)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "spmd.launch", *map(str, args)], cwd=cwd,
                          env=env or _env(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - start


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def _prefix(rank):
    impl = cli.mpi_implementation(MPIEXEC) if MPIEXEC else "unknown"
    return {"mpich": f"[{rank}] ", "openmpi": f"[1,{rank}]<stdout>: "}.get(impl)


# ------------------------------------------------------------------ jobs that run

HELLO = """
    import sys
    import spmd
    print(f"hello from {spmd.process_index()} of {spmd.process_count()} "
          f"local={spmd.local_device_count()} total={spmd.device_count()} argv={sys.argv[1:]}")
"""


@needs_mpi
def test_hello_two_ranks_with_prefixes(tmp_path):
    script = write(tmp_path, "hello.py", HELLO)
    proc, _ = spmd_run("-n", 2, "--local-devices", 2, script, "a", "--flag", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for r in range(2):
        text = f"hello from {r} of 2 local=2 total=4 argv=['a', '--flag']"
        prefix = _prefix(r)
        if prefix is None:
            assert text in proc.stdout
        else:
            assert prefix + text in lines, proc.stdout


@needs_mpi
def test_one_rank_owns_its_local_devices(tmp_path):
    script = write(tmp_path, "hello.py", HELLO)
    proc, _ = spmd_run("-n", 1, "--no-prefix", "--local-devices", 3, script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hello from 0 of 1 local=3 total=3 argv=[]"
    proc, _ = spmd_run("-n", 1, "--no-prefix", script, cwd=tmp_path)
    assert proc.stdout.strip() == "hello from 0 of 1 local=1 total=1 argv=[]"


@needs_mpi
def test_no_prefix_and_module_target(tmp_path):
    write(tmp_path, "hello_mod.py", HELLO)
    proc, _ = spmd_run("-n", 2, "--no-prefix", "-m", "hello_mod", "x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [
        f"hello from {r} of 2 local=1 total=2 argv=['x']" for r in range(2)]


@needs_mpi
def test_environment_of_the_ranks(tmp_path):
    script = write(tmp_path, "env.py", """
        import os, json, spmd
        if spmd.process_index() == 0:
            keys = ["SPMD_PLATFORM", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED"]
            print("ENV", json.dumps({k: os.environ.get(k) for k in keys}))
    """)
    proc, _ = spmd_run("-n", 2, "--no-prefix", "--platform", "cpu", script, cwd=tmp_path,
                       env=_env(MKL_NUM_THREADS="7"))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.split("ENV ", 1)[1])
    assert seen["SPMD_PLATFORM"] == "cpu" and seen["PYTHONUNBUFFERED"] == "1"
    assert seen["MKL_NUM_THREADS"] == "7"  # the user's value is kept
    assert int(seen["OMP_NUM_THREADS"]) == max(1, cli.usable_cores() // 2)


# ------------------------------------------------------------------ jobs that fail

@needs_mpi
def test_exception_on_one_rank_ends_the_job(tmp_path):
    script = write(tmp_path, "boom.py", """
        import time
        import spmd
        from mpi4py import MPI
        if spmd.process_index() == 1:
            time.sleep(0.5)  # the others are inside the allreduce by now
            raise ValueError("boom")
        MPI.COMM_WORLD.allreduce(1)
        print("unreachable")
    """)
    proc, elapsed = spmd_run("-n", 3, script, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 60
    summary = proc.stderr[proc.stderr.index("spmd-run:"):]
    assert "rank 1 of 3 failed with exit status 1" in summary
    assert "ValueError: boom" in summary and "raised an exception" in summary
    assert "unreachable" not in proc.stdout
    # The traceback shows the script's frames, not the launcher's.
    assert "_rank.py" not in summary and "runpy" not in summary


@needs_mpi
def test_sys_exit_status_passes_through(tmp_path):
    script = write(tmp_path, "exit3.py", """
        import sys
        import spmd
        from mpi4py import MPI
        if spmd.process_index() == 1:
            sys.exit(3)
        MPI.COMM_WORLD.barrier()
    """)
    proc, elapsed = spmd_run("-n", 2, script, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert elapsed < 60
    assert "rank 1 of 2 failed with exit status 3" in proc.stderr
    assert "sys.exit(3)" in proc.stderr


@needs_mpi
def test_a_rank_dying_on_a_signal_is_named(tmp_path):
    script = write(tmp_path, "segv.py", """
        import ctypes
        import spmd
        from mpi4py import MPI
        def crash():
            ctypes.string_at(0)  # segmentation fault
        if spmd.process_index() == 1:
            crash()
        MPI.COMM_WORLD.barrier()
    """)
    proc, elapsed = spmd_run("-n", 2, script, cwd=tmp_path)
    assert proc.returncode != 0
    assert elapsed < 60
    summary = proc.stderr[proc.stderr.index("spmd-run:"):]
    assert "rank 1 of 2 died on a fatal signal" in summary
    assert "in crash" in summary and "_rank.py" not in summary


@needs_mpi
def test_every_rank_failing_the_same_way_is_shown_once(tmp_path):
    script = write(tmp_path, "all.py", """
        raise RuntimeError("same everywhere")
    """)
    proc, _ = spmd_run("-n", 2, script, cwd=tmp_path)
    assert proc.returncode == 1
    summary = proc.stderr[proc.stderr.index("spmd-run:"):]
    # Either both reported before the job ended (one group), or one did.
    assert summary.count("RuntimeError: same everywhere") == 1


@needs_mpi
def test_timeout_names_the_running_ranks(tmp_path):
    script = write(tmp_path, "sleepy.py", """
        import time
        import spmd
        spmd.process_index()
        def wait_forever():
            time.sleep(1000)
        wait_forever()
    """)
    proc, elapsed = spmd_run("-n", 2, "--timeout", 8, script, cwd=tmp_path)
    assert proc.returncode == cli.TIMED_OUT
    assert elapsed < 60
    assert "did not finish within --timeout 8s" in proc.stderr
    assert "ranks 0-1 of 2 still running" in proc.stderr
    assert "wait_forever" in proc.stderr  # where they were


@needs_mpi
def test_ctrl_c_ends_the_job(tmp_path):
    script = write(tmp_path, "ready.py", """
        import os, time
        import spmd
        print("ready", os.getpid(), flush=True)
        time.sleep(1000)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spmd.launch", "-n", "2", "--no-prefix", str(script)],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
        # A shell running us in the background may have ignored SIGINT.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        pids = []
        deadline = time.monotonic() + JOB_TIMEOUT
        while len(pids) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("ready"):
                pids.append(int(line.split()[1]))
            elif not line:
                break
        assert len(pids) == 2, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == cli.INTERRUPTED
    assert "interrupted; ending the job" in err
    time.sleep(0.5)
    for pid in pids:
        assert not _alive(pid), f"rank process {pid} survived Ctrl-C"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


FAKE_MPIEXEC = """\
#!{python}
# Stands in for an mpiexec that does not end the job when a rank fails: it
# writes rank 1's failure report, then hangs.
import json, os, sys, time
if "--version" in sys.argv:
    print("HYDRA build details: (fake)")
    sys.exit(0)
d = os.environ["SPMD_LAUNCH_DIR"]
with open(os.path.join(d, "rank1.json"), "w") as f:
    json.dump({{"rank": 1, "status": 7, "kind": "exception",
               "error": "Traceback...\\nKeyError: 'fake'\\n", "time": time.time()}}, f)
time.sleep(1000)
"""


def test_watchdog_ends_a_job_that_outlives_a_failed_rank(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text(FAKE_MPIEXEC.format(python=sys.executable))
    fake.chmod(0o755)
    script = write(tmp_path, "noop.py", "pass\n")
    proc, elapsed = spmd_run("-n", 2, "--mpiexec", fake, script, cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr
    assert elapsed < cli.FAILURE_GRACE_S + 30
    assert "rank 1 of 2 failed with exit status 7" in proc.stderr
    assert "KeyError: 'fake'" in proc.stderr


# ------------------------------------------------------------------ launcher errors

def test_missing_mpiexec_path_is_a_clear_error(tmp_path):
    script = write(tmp_path, "noop.py", "pass\n")
    proc, _ = spmd_run("-n", 2, "--mpiexec", tmp_path / "no" / "mpiexec", script, cwd=tmp_path)
    assert proc.returncode == 2
    assert "no such executable" in proc.stderr and "pip install mpich mpi4py" in proc.stderr
    proc, _ = spmd_run("-n", 2, script, cwd=tmp_path,
                       env=_env(SPMD_MPIEXEC=str(tmp_path / "nope")))
    assert proc.returncode == 2 and "SPMD_MPIEXEC" in proc.stderr


def test_no_mpiexec_anywhere(tmp_path, monkeypatch, capsys):
    # Nothing next to the interpreter, nothing on PATH, no mpich wheel.
    monkeypatch.setattr(cli, "_wheel_mpiexec", lambda: None)
    with pytest.raises(cli.LaunchError, match="pip install mpich mpi4py"):
        cli.find_mpiexec(environ={"PATH": ""}, executable=str(tmp_path / "python"))
    monkeypatch.setattr(cli.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("SPMD_MPIEXEC", raising=False)
    script = write(tmp_path, "noop.py", "pass\n")
    assert cli.main(["-n", "2", str(script)]) == 2
    assert "no mpiexec found" in capsys.readouterr().err


def test_mpiexec_search_order(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("mpiexec", "python"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    other = tmp_path / "other"
    other.mkdir()
    (other / "mpirun").write_text("#!/bin/sh\n")
    (other / "mpirun").chmod(0o755)
    monkeypatch.setattr(cli, "_wheel_mpiexec", lambda: None)
    py = str(bindir / "python")
    assert cli.find_mpiexec(environ={"PATH": str(other)}, executable=py) == str(bindir / "mpiexec")
    assert cli.find_mpiexec(environ={"PATH": str(other)},
                            executable=str(other / "python")) == str(other / "mpirun")
    env = {"PATH": "", "SPMD_MPIEXEC": str(other / "mpirun")}
    assert cli.find_mpiexec(environ=env, executable=py) == str(other / "mpirun")
    assert cli.find_mpiexec(str(bindir / "mpiexec"), environ=env, executable=py) == \
        str(bindir / "mpiexec")


@needs_mpi
def test_empty_path_still_finds_the_environments_mpiexec(tmp_path):
    if os.path.dirname(MPIEXEC) != os.path.dirname(sys.executable):
        pytest.skip("mpiexec is not next to this Python (a system MPI)")
    script = write(tmp_path, "hello.py", HELLO)
    proc, _ = spmd_run("-n", 2, "--no-prefix", script, cwd=tmp_path, env=_env(PATH=""))
    assert proc.returncode == 0, proc.stderr
    assert "hello from 1 of 2" in proc.stdout


def test_platform_gpu_without_cupy_or_gpu(tmp_path):
    installed, count, _ = cli._cupy_gpu_count()
    if installed and count > 0:
        pytest.skip("this machine has CuPy and a GPU")
    script = write(tmp_path, "noop.py", "pass\n")
    proc, _ = spmd_run("-n", 1, "--platform", "gpu", script, cwd=tmp_path)
    assert proc.returncode == 2
    if not installed:
        assert "needs CuPy" in proc.stderr and "cupy-cuda12x" in proc.stderr
    else:
        assert "sees no GPU" in proc.stderr


def test_gpu_checks(monkeypatch):
    ns = cli.parse_args(["-n", "4", "--platform", "gpu", "x.py"])
    monkeypatch.setattr(cli, "_cupy_gpu_count", lambda: (False, 0, ""))
    with pytest.raises(cli.LaunchError, match="cupy-cuda13x"):
        cli.check_gpu(ns, environ={})
    monkeypatch.setattr(cli, "_cupy_gpu_count", lambda: (True, 0, "CUDARuntimeError: no driver"))
    with pytest.raises(cli.LaunchError, match="sees no GPU.*no driver"):
        cli.check_gpu(ns, environ={})
    monkeypatch.setattr(cli, "_cupy_gpu_count", lambda: (True, 2, ""))
    with pytest.raises(cli.LaunchError, match="4 ranks on this node but only 2 GPU.*"
                                              "SPMD_GPU_BACKEND=mpi"):
        cli.check_gpu(ns, environ={})
    cli.check_gpu(ns, environ={"SPMD_GPU_BACKEND": "mpi"})  # host-staged: GPUs shared
    cli.check_gpu(ns, environ={"SLURM_JOB_NUM_NODES": "2"})  # 2 ranks per node


@pytest.mark.parametrize("argv, message", [
    (["-n", "2"], "missing the program to run"),
    (["hello.py"], "required: -n"),
    (["-n", "0", "hello.py"], "expected a positive integer, got '0'"),
    (["-n", "two", "hello.py"], "expected a positive integer, got 'two'"),
    (["-n", "2", "--timeout", "0", "hello.py"], "positive number of seconds"),
    (["-n", "2", "--platform", "tpu", "hello.py"], "invalid choice"),
    (["-n", "2", "--local-devices", "-1", "hello.py"], "expected a positive integer"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_script(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["-n", "2", "nothere.py"]) == 2
    assert "script 'nothere.py' not found" in capsys.readouterr().err


def test_the_target_takes_every_word_after_it():
    ns = cli.parse_args(["-n4", "--timeout", "5", "train.py", "-n", "9", "--timeout", "x"])
    assert (ns.np, ns.timeout, ns.target, ns.args) == (4, 5.0, "train.py",
                                                       ["-n", "9", "--timeout", "x"])
    ns = cli.parse_args(["--np=2", "--no-prefix", "-m", "pkg.mod", "--help"])
    assert (ns.np, ns.prefix, ns.module, ns.target, ns.args) == (2, False, "pkg.mod", None,
                                                                 ["--help"])
    ns = cli.parse_args(["-n", "2", "--", "-odd.py", "a"])
    assert (ns.target, ns.args) == ("-odd.py", ["a"])


def test_thread_variables_follow_the_core_count(monkeypatch):
    monkeypatch.setattr(cli, "usable_cores", lambda: 8)
    env = cli.build_env(cli.parse_args(["-n", "16", "x.py"]), "/tmp/d", environ={})
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"
    env = cli.build_env(cli.parse_args(["-n", "2", "--local-devices", "3", "x.py"]), "/tmp/d",
                        environ={"OPENBLAS_NUM_THREADS": "2"})
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"
    assert env["OPENBLAS_NUM_THREADS"] == "2"
    assert env["SPMD_LOCAL_DEVICES"] == "3" and "SPMD_PLATFORM" not in env
    # OpenBLAS's threads sleep soon after a call (spmd's kernels use the cores), unless
    # the user says otherwise.
    assert env["OPENBLAS_THREAD_TIMEOUT"] == "12"
    env = cli.build_env(cli.parse_args(["-n", "2", "x.py"]), "/tmp/d",
                        environ={"OPENBLAS_THREAD_TIMEOUT": "28"})
    assert env["OPENBLAS_THREAD_TIMEOUT"] == "28"


def test_rank_prefix_flag_by_implementation():
    ns = cli.parse_args(["-n", "2", "x.py", "a"])
    cmd = cli.build_command(ns, "/x/mpiexec", "mpich", {})
    assert cmd[:2] == ["/x/mpiexec", "-prepend-rank"]
    assert cmd[-7:] == ["-n", "2", sys.executable, "-m", "spmd.launch._rank", "x.py", "a"]
    assert "--tag-output" in cli.build_command(ns, "mpirun", "openmpi", {})
    ns = cli.parse_args(["-n", "2", "--no-prefix", "-m", "pkg", "a"])
    cmd = cli.build_command(ns, "mpiexec", "mpich", {})
    assert "-prepend-rank" not in cmd and cmd[-3:] == ["-m", "pkg", "a"]


def test_format_ranks():
    assert cli.format_ranks([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert cli.format_ranks([3]) == "3"


# ------------------------------------------------------------------ the rank wrapper alone

def _rank(tmp_path, source, *args, env=None):
    script = write(tmp_path, "target.py", source)
    return subprocess.run([sys.executable, "-m", "spmd.launch._rank", str(script), *args],
                          cwd=tmp_path, env=env or _env(), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT, stdin=subprocess.DEVNULL)


def test_rank_wrapper_runs_the_script_like_python(tmp_path):
    proc = _rank(tmp_path, """
        import os, sys
        print(sys.argv, __name__, os.path.dirname(os.path.abspath(__file__)) == sys.path[0])
    """, "a", "b")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"[{str(tmp_path / 'target.py')!r}, 'a', 'b'] __main__ True"


def test_rank_wrapper_failure_report(tmp_path):
    launch_dir = tmp_path / "launch"
    launch_dir.mkdir()
    proc = _rank(tmp_path, """
        def f():
            raise KeyError("nope")
        f()
    """, env=_env(SPMD_LAUNCH_DIR=str(launch_dir), PMI_RANK="3"))
    assert proc.returncode == 1
    assert "KeyError: 'nope'" in proc.stderr and "runpy" not in proc.stderr
    report = json.loads((launch_dir / "rank3.json").read_text())
    assert report["status"] == 1 and report["kind"] == "exception"
    assert "KeyError: 'nope'" in report["error"] and "in f" in report["error"]
    assert json.loads((launch_dir / "rank3.pid").read_text())["pid"] > 0


@pytest.mark.parametrize("code, status, err", [
    ("None", 0, ""), ("0", 0, ""), ("4", 4, ""), ("'bad input'", 1, "bad input")])
def test_rank_wrapper_sys_exit(tmp_path, code, status, err):
    proc = _rank(tmp_path, f"import sys\nsys.exit({code})\n")
    assert proc.returncode == status
    assert err in proc.stderr


# ------------------------------------------------------------------ spmd.distributed

@pytest.fixture
def fresh_runtime(monkeypatch):
    monkeypatch.setattr(runtime, "_forced", {})
    reset_for_tests()
    yield
    monkeypatch.undo()
    reset_for_tests()


def test_distributed_initialize_local(fresh_runtime):
    spmd.distributed.initialize(backend="local", local_devices=3, platform="cpu")
    assert spmd.device_count() == 3 and spmd.process_count() == 1
    assert {d.platform for d in spmd.devices()} == {"cpu"}


@pytest.mark.parametrize("kwargs, message", [
    (dict(backend="nccl"), "backend='nccl'"),
    (dict(local_devices=0), "local_devices=0"),
    (dict(local_devices=2.0), "local_devices=2.0"),
    (dict(platform="tpu"), "platform='tpu'"),
])
def test_distributed_initialize_errors(fresh_runtime, kwargs, message):
    with pytest.raises(ArgumentError, match=re.escape(message)):
        spmd.distributed.initialize(**kwargs)


@needs_mpi
def test_distributed_initialize_mpi_in_one_process(tmp_path):
    code = ("import spmd; spmd.distributed.initialize(backend='mpi', local_devices=2); "
            "print(spmd.process_index(), spmd.process_count(), spmd.device_count())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=JOB_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1", "2"]
