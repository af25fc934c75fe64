"""The ranks' connections to spmd-run across hosts (spmd.launch.alive): the order in
which they close is the order in which the ranks' processes ended, and a rank whose
connection stays open after the job is on a machine that did not end it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from spmd.launch import alive
from tests.mpi import REPO_ROOT

# A rank: connect, say so, then hold the connection until killed (or for good).
_RANK = """
import sys, time
from spmd.launch import alive
conn = alive.connect(int(sys.argv[1]), sys.argv[2])
print("connected" if conn is not None else "none", flush=True)
time.sleep(60)
"""


def _rank(rank: int, token: str, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _RANK, str(rank), token], cwd=str(REPO_ROOT),
                            env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "connected"
    return proc


def test_the_order_of_ends_and_the_connections_left_open():
    watch = alive.Watch("127.0.0.1", "job-abc")
    env = {alive.ENV: watch.env_value()}
    ended, running = [], [True]
    thread = threading.Thread(target=watch.run, args=(lambda: running[0], ended.append))
    thread.start()
    ranks = [_rank(r, "job-abc", env) for r in range(3)]
    intruder = _rank(7, "another-job", env)  # a wrong token is never counted
    try:
        time.sleep(0.3)
        for r in (2, 0):
            ranks[r].kill()
            ranks[r].wait()
            time.sleep(0.2)
        intruder.kill()
        intruder.wait()
        running[0] = False  # mpiexec has exited; rank 1's machine "never ends"
        thread.join(timeout=alive.AFTER_EXIT_S + 5)
        assert not thread.is_alive()
        assert ended == [2, 0] and watch.open_at_end == [1]
    finally:
        for proc in ranks + [intruder]:
            proc.kill()
            proc.wait()


def test_no_channel_without_the_variable_or_a_listener():
    assert alive.connect(0, "t", environ={}) is None
    assert alive.connect(0, "t", environ={alive.ENV: "no-port"}) is None
    watch = alive.Watch("127.0.0.1", "t")
    port = watch.env_value()
    watch.server.close()  # nobody listens there any more
    assert alive.connect(0, "t", environ={alive.ENV: port}) is None


def test_the_launcher_address():
    assert alive.launcher_address(["-launcher", "ssh", "-iface", "lo"], {}) == "127.0.0.1"
    assert alive.launcher_address([], {"SPMD_LAUNCHER_ADDRESS": "10.0.0.5"}) == "10.0.0.5"
    assert alive.interface_address("no-such-interface") is None
