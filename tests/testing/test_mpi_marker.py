"""@pytest.mark.spmd(processes=N): a user's test file, run with a plain pytest (an inner
run in a subprocess, pytester), gets each marked test run on N MPI ranks from a pool
of rank workers, with one outcome per test: passed; failed naming the rank and its
assertion; failed naming first the rank that never reached the collective another
waits in, and where it is (within the test's timeout), the next test still running;
and in place under an outer mpiexec (pytest-mpi's style)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.testing import usage_error

pytest_plugins = ["pytester"]

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pytestmark = pytest.mark.skipif(
    shutil.which("mpiexec") is None and not os.path.exists(MPIEXEC),
    reason="needs MPI (mpi4py and the mpich wheel: pip install spmd[mpi])")

USER_TESTS = '''
import time
import numpy as np
import pytest
import spmd
from spmd import lax, P


def _psum_program():
    mesh = spmd.make_mesh((2,), ("i",))
    f = spmd.jit(spmd.shard_map(lambda x: lax.psum(x, "i"), mesh=mesh, in_specs=P("i"),
                                out_specs=P()))
    x = spmd.make_array_from_process_local_data(
        spmd.NamedSharding(mesh, P("i")),
        np.full((1,), spmd.process_index() + 1.0, np.float32))
    return f, x


@pytest.mark.spmd(processes=2)
def test_passes_on_two_ranks():
    f, x = _psum_program()
    assert float(np.asarray(f(x))[0]) == 3.0


@pytest.mark.spmd(processes=2)
def test_rank_one_fails():
    assert spmd.process_index() == 0, "only rank 0 may pass"


@pytest.mark.spmd(processes=2, timeout=10)
def test_rank_one_hangs_in_a_collective():
    f, x = _psum_program()
    f(x)
    if spmd.process_index() == 1:
        f(x)  # alone: rank 0 has returned


@pytest.mark.spmd(processes=2)
@pytest.mark.parametrize("n", [1, 3])
def test_after_the_hang_with_fixtures(n, tmp_path):
    assert spmd.process_count() == 2 and tmp_path.is_dir() and n in (1, 3)


def test_a_simulated_mesh(spmd_mesh):
    assert spmd_mesh((2, 2), ("i", "j")).devices.size == 4


@pytest.mark.spmd(processes=2, timeout=5)
def test_rank_one_sleeps_while_rank_zero_waits():
    f, x = _psum_program()
    f(x)
    if spmd.process_index() == 1:
        time.sleep(60)
    f(x)
'''


def test_marked_tests_from_a_plain_pytest(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf")
    out = result.stdout.str()
    result.assert_outcomes(passed=4, failed=3)
    assert "rank 1 failed (in call):" in out
    assert "AssertionError: only rank 0 may pass" in out
    assert "rank 0 failed" not in out
    # A hang's report leads (its first line, under the test's header) with the rank
    # that never came, and where it is: rank 0 returned from the test while rank 1
    # waits in a second psum ...
    assert "_\nrank 0 never reached the collective rank 1 waits in (psum at test_user.py:34 in " \
        "test_rank_one_hangs_in_a_collective); rank 0 finished the test (it passed)\n" in out
    assert "rank 1 hung: it did not finish within 10 s, waiting in psum over ranks [0, 1], " \
        "collective #2 there; where it waited:" in out
    assert "spmd/collectives/mpi" in out  # its stack: it waits in the collective
    assert "test_user.py\", line 34 in test_rank_one_hangs_in_a_collective" in out
    # ... and rank 0 waits in psum while rank 1 sleeps.
    assert "_\nrank 1 never reached the collective rank 0 waits in (psum at test_user.py:53 in " \
        "test_rank_one_sleeps_while_rank_zero_waits); rank 1 is at test_user.py:52 in " \
        "test_rank_one_sleeps_while_rank_zero_waits: `time.sleep(60)`\n\nrank 1 hung: it " \
        "did not finish within 5 s; where it waited:" in out
    # The summary's line too (cut to the terminal's width).
    assert "FAILED test_user.py::test_rank_one_sleeps_while_rank_zero_waits - rank 1 ne" in out


def test_exitfirst_stops_after_a_failing_rank(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-x")
    result.assert_outcomes(passed=1, failed=1)


def test_bad_marker_arguments_are_named(pytester):
    out = usage_error(pytester, '''
import pytest

@pytest.mark.spmd(processes=0)
def test_zero():
    pass
''')
    assert "@pytest.mark.spmd(processes=0): processes must be a number >= 1" in out


def test_a_bad_env_is_named(pytester):
    out = usage_error(pytester, '''
import pytest

@pytest.mark.spmd(env={"SPMD_SIMULATE_NODES": 2})
def test_env():
    pass
''')
    assert "@pytest.mark.spmd(env={'SPMD_SIMULATE_NODES': 2}): env must map environment " \
        "variable names to string values" in out


def test_env_reaches_the_ranks_and_keys_the_pool(pytester):
    pytester.makepyfile(test_user='''
import os
import pytest
import spmd

@pytest.mark.spmd(processes=2, env={"SPMD_TEST_COLOUR": "red"})
def test_red():
    assert os.environ["SPMD_TEST_COLOUR"] == "red"
    print("pid", os.getpid())

@pytest.mark.spmd(processes=2, env={"SPMD_TEST_COLOUR": "blue"})
def test_blue():
    assert os.environ["SPMD_TEST_COLOUR"] == "blue"

@pytest.mark.mpi  # pytest-mpi's marker too: the ranks run it (they say --with-mpi)
@pytest.mark.spmd(processes=2)
def test_none():
    assert "SPMD_TEST_COLOUR" not in os.environ
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_pytest_timeouts_limit_leaves_the_wait_to_the_marker(pytester):
    # --timeout=1 (pytest-timeout) in this process would interrupt the wait for the
    # ranks; the marker's timeout is the test's limit instead.
    pytester.makepyfile(test_user='''
import time
import pytest

@pytest.mark.spmd(processes=2, timeout=60)
def test_slower_than_the_outer_limit():
    time.sleep(2)
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--timeout=1")
    result.assert_outcomes(passed=1)


def test_in_place_under_an_outer_mpiexec(pytester):
    pytester.makepyfile(test_user='''
import pytest
import spmd

@pytest.mark.spmd(processes=2)
def test_two():
    assert spmd.process_count() == 2

@pytest.mark.spmd(processes=4)
def test_four():
    pass

@pytest.mark.spmd(processes=2, env={"SPMD_TEST_COLOUR": "red"})
def test_red():
    pass
''')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("SPMD_NUM_DEVICES", None)
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", "--with-mpi", "-rs", "test_user.py"],
                          cwd=pytester.path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 2 skipped" in done.stdout
    assert "@pytest.mark.spmd(processes=4) in an MPI job of 2 ranks" in done.stdout
    assert "@pytest.mark.spmd(env=...) needs {'SPMD_TEST_COLOUR': 'red'} in the environment; " \
        "this MPI job started without it" in done.stdout


def test_marked_tests_between_plain_ones_keep_pytests_setup_state(pytester):
    # A plain test of package a (a module fixture), a marked one, then a plain test of
    # package b: the fixture is torn down once, where pytest would, and b's test sets up.
    pytester.makepyfile(**{"a/__init__.py": "", "b/__init__.py": "", "a/test_a.py": '''
import pytest

@pytest.fixture(scope="module")
def resource():
    yield 1
    print("TORN DOWN")

def test_plain(resource):
    assert resource == 1

@pytest.mark.spmd(processes=2)
def test_marked():
    pass
''', "b/test_b.py": '''
def test_after():
    pass
'''})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=3)
    assert result.stdout.str().count("TORN DOWN") == 1


def test_a_failing_finalizer_before_a_marked_test_is_reported(pytester):
    pytester.makepyfile(**{"a/__init__.py": "", "b/__init__.py": "", "a/test_a.py": '''
import pytest

@pytest.fixture(scope="module")
def resource():
    yield 1
    raise RuntimeError("the finalizer broke")

def test_plain(resource):
    pass

@pytest.mark.spmd(processes=2)
def test_marked():
    pass
''', "b/test_b.py": "def test_after():\n    pass\n"})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    assert "ERROR at teardown of test_marked" in result.stdout.str()
    assert "RuntimeError: the finalizer broke" in result.stdout.str()


def test_last_failed_reruns_only_the_failing_marked_test(pytester):
    pytester.makepyfile(test_user='''
import os
import pytest
import spmd

@pytest.mark.spmd(processes=2)
def test_ok():
    pass

@pytest.mark.spmd(processes=2)
def test_rank_one_fails():
    assert spmd.process_index() == 0
''')
    first = pytester.runpytest_subprocess()
    first.assert_outcomes(passed=1, failed=1)
    again = pytester.runpytest_subprocess("--lf")
    again.assert_outcomes(failed=1)  # and test_ok not run again


def test_a_rank_that_dies_is_named_and_the_next_test_runs(pytester):
    pytester.makepyfile(test_user='''
import os
import pytest
import spmd

@pytest.mark.spmd(processes=2, timeout=30)
def test_rank_one_exits():
    if spmd.process_index() == 1:
        os._exit(3)

@pytest.mark.spmd(processes=2)
def test_next():
    assert spmd.process_count() == 2
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "rank 1 died: its process ended before it answered" in out


def test_a_pool_that_cannot_start_is_an_error_saying_why(pytester, monkeypatch):
    monkeypatch.setenv("SPMD_MPIEXEC", "/nonexistent/mpiexec")
    pytester.makepyfile(test_user='''
import pytest

@pytest.mark.spmd(processes=2)
def test_x():
    pass
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "a pool of 2 ranks of 1 device(s) did not start: its launcher ended with exit " \
        "status 2" in out
    assert "SPMD_MPIEXEC '/nonexistent/mpiexec': no such executable" in out
