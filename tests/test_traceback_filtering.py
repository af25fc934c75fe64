"""Issue 58, "the first hour of a JAX user": a user's error under ``spmd.jit``,
``shard_map``, ``grad`` and ``vmap`` shows the user's frames, not spmd's, with JAX's
setting and modes to show them (spmd/shard/call/tracebacks.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback

import numpy as np
import pytest

import spmd
import spmd.numpy as snp
from spmd import P, lax
from spmd.collectives.primitives import CollectiveAxisError
from spmd.errors import ArgumentError, ShapeError
from spmd.shard.call import tracebacks
from spmd.shard.maps.shard_map import ShardMapError

SPMD_DIR = os.path.dirname(os.path.abspath(spmd.__file__)) + os.sep
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def mode():
    """Set the filtering mode for one test; restored after it."""
    old = spmd.config.traceback_filtering
    yield lambda m: spmd.config.update("jax_traceback_filtering", m)
    spmd.config.update("traceback_filtering", old)


def _frames(e: BaseException):
    """``(file, function)`` of each frame of ``e``'s traceback, outermost first."""
    return [(os.path.abspath(f.filename), f.name) for f in traceback.extract_tb(e.__traceback__)]


def _spmd_frames(e):
    return [f for f in _frames(e) if f[0].startswith(SPMD_DIR) or f[0].startswith("<spmd:")]


def _user_functions(e):
    return [name for file, name in _frames(e) if file == os.path.abspath(__file__)]


def _raise(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


# ------------------------------------------------------------- the user's frames

def _matmul_body(x, y):
    return x @ y


def test_shape_error_under_jit_shows_the_call_and_the_users_line_only():
    e = _raise(spmd.jit(_matmul_body), np.ones((2, 3)), np.ones((2, 3)))
    assert type(e) is ShapeError and "do not align" in str(e)
    assert _spmd_frames(e) == []
    assert _user_functions(e) == ["_raise", "_matmul_body"]
    assert traceback.extract_tb(e.__traceback__)[-1].line == "return x @ y"
    assert e.__notes__ == [tracebacks.NOTE]


def test_off_shows_spmds_frames_and_the_same_exception(mode):
    filtered = _raise(spmd.jit(_matmul_body), np.ones((2, 3)), np.ones((2, 3)))
    mode("off")
    whole = _raise(spmd.jit(_matmul_body), np.ones((2, 3)), np.ones((2, 3)))
    assert type(whole) is type(filtered) and str(whole) == str(filtered)
    assert len(_spmd_frames(whole)) > 5  # the jit's call path, tracing, matmul's check
    assert _user_functions(whole) == ["_raise", "_matmul_body"]
    assert not hasattr(whole, "__notes__")


def _bad_axis_body(x):
    return lax.psum(x, "nope")


def test_bad_psum_axis_under_shard_map():
    mesh = spmd.make_mesh((4,), ("i",))
    f = spmd.shard_map(_bad_axis_body, mesh=mesh, in_specs=P("i"), out_specs=P())
    e = _raise(f, np.arange(8.0, dtype=np.float32))
    assert isinstance(e, CollectiveAxisError) and "'nope'" in str(e)
    assert _spmd_frames(e) == []
    assert _user_functions(e) == ["_raise", "_bad_axis_body"]


def _helper(x):
    raise TypeError("the user's own TypeError")


def _loss(w):
    return (_helper(w) ** 2).sum()


def test_users_type_error_under_jit_of_grad():
    e = _raise(spmd.jit(spmd.grad(_loss)), np.ones(3, np.float32))
    assert type(e) is TypeError and str(e) == "the user's own TypeError"
    assert _spmd_frames(e) == []
    assert _user_functions(e) == ["_raise", "_loss", "_helper"]
    assert e.__notes__ == [tracebacks.NOTE]


W = np.ones(3, np.float32)


@pytest.mark.parametrize("transform", [
    lambda: spmd.grad(_loss)(W), lambda: spmd.value_and_grad(_loss)(W),
    lambda: spmd.vjp(_loss, W), lambda: spmd.jvp(_loss, (W,), (W,)),
    lambda: spmd.linearize(_loss, W), lambda: spmd.jacfwd(_loss)(W),
    lambda: spmd.jacrev(_loss)(W), lambda: spmd.hessian(_loss)(W),
    lambda: spmd.vmap(_loss)(np.ones((2, 3), np.float32))],
    ids=["grad", "value_and_grad", "vjp", "jvp", "linearize", "jacfwd", "jacrev", "hessian",
         "vmap"])
def test_the_transformations_alone_are_boundaries_too(transform):
    e = _raise(transform)
    assert type(e) is TypeError and _spmd_frames(e) == []
    assert _user_functions(e) == ["_raise", "<lambda>", "_loss", "_helper"]
    assert e.__notes__ == [tracebacks.NOTE]


def test_nested_jit_shard_map_jit_filters_once():
    mesh = spmd.make_mesh((4,), ("i",))
    inner = spmd.jit(_matmul_body)

    def body(x):
        return inner(x, x)

    outer = spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    e = _raise(outer, np.ones((8, 3), np.float32))
    assert type(e) is ShapeError
    assert _spmd_frames(e) == []
    assert _user_functions(e) == ["_raise", "body", "_matmul_body"]
    assert e.__notes__ == [tracebacks.NOTE]  # one note, not one per boundary


def test_an_error_caught_and_raised_again_through_another_jit_gets_one_note():
    e = _raise(spmd.jit(_matmul_body), np.ones((2, 3)), np.ones((2, 3)))

    def again(x):
        raise e

    e2 = _raise(spmd.jit(again), np.ones(2))
    assert e2 is e and e.__notes__ == [tracebacks.NOTE]
    assert _spmd_frames(e) == []


def test_lower_and_trace_are_boundaries():
    j = spmd.jit(_matmul_body)
    for stage in (j.lower, j.trace, spmd.make_jaxpr(_matmul_body)):
        e = _raise(stage, np.ones((2, 3)), np.ones((2, 3)))
        assert _spmd_frames(e) == [] and _user_functions(e) == ["_raise", "_matmul_body"]


# ------------------------------------------------- an error of spmd's own checks

def test_spmds_own_error_keeps_the_frame_that_raised():
    """No user frame below the boundary: the traceback ends where spmd raised, not at
    the user's call alone."""
    mesh = spmd.make_mesh((4,), ("i",))
    f = spmd.shard_map(lambda x: x, mesh=mesh, in_specs=P("nope"), out_specs=P())
    e = _raise(f, np.ones(8, np.float32))
    assert type(e) is ShardMapError and "nope" in str(e)
    frames = _frames(e)
    assert [name for _, name in frames[:1]] == ["_raise"]
    assert len(frames) == 2 and frames[1][0].startswith(SPMD_DIR)
    with open(frames[1][0]) as src:  # the frame is the raise statement's
        line = src.read().splitlines()[traceback.extract_tb(e.__traceback__)[1].lineno - 1]
    assert "raise" in line or "Error(" in line


# ------------------------------------------------------------------- the modes

def test_remove_frames_attaches_the_whole_traceback_as_the_cause(mode):
    mode("remove_frames")

    def chained(x):
        try:
            {}["k"]
        except KeyError as k:
            raise ValueError("the user's") from k

    e = _raise(spmd.jit(chained), np.ones(2))
    assert type(e) is ValueError and str(e) == "the user's"
    assert _spmd_frames(e) == [] and not hasattr(e, "__notes__")
    whole = e.__cause__
    assert isinstance(whole, tracebacks.UnfilteredStackTrace)
    assert "ValueError: the user's" in str(whole) and len(_spmd_frames(whole)) > 5
    assert isinstance(whole.__cause__, KeyError)  # the user's own cause, kept
    printed = "".join(traceback.format_exception(e))
    assert "KeyError" in printed and printed.count("ValueError: the user's") == 2


def test_tracebackhide_keeps_the_traceback_and_marks_spmds_frames(mode):
    mode("tracebackhide")
    e = _raise(spmd.jit(_matmul_body), np.ones((2, 3)), np.ones((2, 3)))
    tb, hidden, shown = e.__traceback__, [], []
    while tb is not None:
        name = tb.tb_frame.f_code.co_name
        (hidden if tb.tb_frame.f_locals.get("__tracebackhide__") else shown).append(name)
        tb = tb.tb_next
    assert shown == ["_raise", "_matmul_body"]
    assert len(hidden) > 5 and not hasattr(e, "__notes__")


def test_config_takes_jax_and_spmd_names_and_rejects_other_modes(mode):
    assert spmd.config.read("jax_traceback_filtering") == "auto"
    mode("quiet_remove_frames")
    assert spmd.config.traceback_filtering == "quiet_remove_frames"
    spmd.config.update("traceback_filtering", "off")
    assert spmd.config.jax_traceback_filtering == "off"
    with pytest.raises(ArgumentError, match="traceback_filtering='none' is not one of"):
        spmd.config.update("jax_traceback_filtering", "none")
    assert spmd.config.traceback_filtering == "off"


# -------------------------------------------------------- the environment variable

SCRIPT = """
import numpy as np, spmd
def user_fn(x):
    return x @ x
spmd.jit(user_fn)(np.ones((2, 3)))
"""


def _run(script, env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in ("JAX_TRACEBACK_FILTERING", "SPMD_TRACEBACK_FILTERING")}
    full.update(env, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(script)], env=full, capture_output=True,
                          text=True, timeout=300)


def test_environment_variables_choose_the_mode(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    default = _run(script, {})
    assert default.returncode == 1 and "ShapeError" in default.stderr
    assert SPMD_DIR not in default.stderr and "return x @ x" in default.stderr
    assert "removed its internal frames" in default.stderr
    off = _run(script, {"JAX_TRACEBACK_FILTERING": "off"})
    assert off.returncode == 1 and "ShapeError" in off.stderr
    assert os.path.join(SPMD_DIR, "shard", "call", "jit.py") in off.stderr
    assert "removed its internal frames" not in off.stderr
    # SPMD_'s name is read first, JAX's second.
    both = _run(script, {"SPMD_TRACEBACK_FILTERING": "quiet_remove_frames",
                 "JAX_TRACEBACK_FILTERING": "off"})
    assert SPMD_DIR not in both.stderr and "return x @ x" in both.stderr
    bad = _run(script, {"JAX_TRACEBACK_FILTERING": "sometimes"})
    assert bad.returncode == 1
    assert "JAX_TRACEBACK_FILTERING='sometimes' is not one of" in bad.stderr


def test_an_eager_operation_on_placed_arrays_is_not_an_entry_point():
    """spmd's own jits (eager operations on sharded Arrays) leave the traceback whole, as
    any eager operation outside jit does."""
    mesh = spmd.make_mesh((4,), ("i",))
    x = spmd.device_put(np.ones((8, 3), np.float32), spmd.NamedSharding(mesh, P("i")))
    y = spmd.device_put(np.ones((8, 4), np.float32), spmd.NamedSharding(mesh, P("i")))

    def eager(a, b):
        return a + b  # (run by a jit of spmd's: spmd.numpy's placed elementwise ops)

    e = _raise(eager, x, y)
    assert type(e) is ShapeError and not hasattr(e, "__notes__")
    assert _user_functions(e)[:2] == ["_raise", "eager"] and _spmd_frames(e)
