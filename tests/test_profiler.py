"""spmd.profiler in one process: the Chrome trace of jitted steps on 8 simulated devices
(program spans per device, collectives per member with equal seq and both phases,
annotations, memory counters, checkpoints), start/stop, errors, and that tracing never
changes a result."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import numpy as np
import pytest

import spmd
from spmd import P, lax, profiler
from spmd.launch.timeline import recorder
from spmd.shard.arrays import memory

HOST_TID = 1_000_000  # the host track's thread id in the merged trace


@pytest.fixture(autouse=True)
def _no_trace_left():
    yield
    if profiler._file[0] is not None:
        profiler.stop_trace()
    memory.stop()


def _step_fn(mesh, scale):
    """A jitted step closing over ``scale``: psum and all_gather in a shard_map."""
    def body(b):
        total = lax.psum(b * scale, "d")
        gathered = lax.all_gather(b, "d", tiled=True)
        return b * total + gathered.sum()

    return spmd.jit(spmd.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d")))


def _read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def test_trace_of_jitted_steps_on_8_simulated_devices(tmp_path):
    mesh = spmd.make_mesh((8,), ("d",))
    step = _step_fn(mesh, np.float32(0.5))
    x = np.arange(16, dtype=np.float32)
    expected = [np.asarray(step(x + i)) for i in range(3)]  # (the cache warmed first)
    path = tmp_path / "t.json.gz"
    with profiler.trace(path):
        got = []
        for i in range(3):
            with profiler.StepTraceAnnotation("train", step_num=i):
                with profiler.TraceAnnotation("load", batch=i):
                    xi = x + i
                got.append(step(xi))  # (kept: live when the next calls count memory)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)

    trace = _read(path)
    events = trace["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {**{d: f"device {d}" for d in range(8)}, HOST_TID: "host"}

    programs = Counter(e["tid"] for e in events if e["ph"] == "X" and e["cat"] == "program"
                       and e["name"] == "jit(body)")
    assert programs == {d: 3 for d in range(8)}

    calls = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["cat"] == "collective":
            calls[(e["args"]["comm"], e["args"]["seq"])].append(e)
    assert sorted(calls) == [("0,1,2,3,4,5,6,7", s) for s in range(6)]  # 2 per step
    for (comm, seq), members in calls.items():
        assert sorted((e["tid"], e["args"]["phase"]) for e in members) == \
            sorted((d, p) for d in range(8) for p in ("wait", "transfer"))
        op = members[0]["args"]["op"]
        assert op == ("psum" if seq % 2 == 0 else "all_gather")
        assert all(e["args"]["op"] == op and e["args"]["bytes"] == 8 for e in members)

    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert [(e["name"], e["args"]["step_num"], e["tid"]) for e in steps] == \
        [("train", i, HOST_TID) for i in range(3)]
    loads = [e for e in events if e["ph"] == "X" and e["cat"] == "user"]
    assert [(e["name"], e["args"], e["tid"]) for e in loads] == \
        [("load", {"batch": i}, HOST_TID) for i in range(3)]

    counters = [e for e in events if e["ph"] == "C"]
    assert Counter(e["name"] for e in counters) == {f"memory device {d}": 3 for d in range(8)}
    # Each call's result (16 float32 split over 8 devices) is live when counted: 8 bytes
    # a device, and the earlier results (kept in got) stay live.
    on3 = [e["args"]["bytes_in_use"] for e in counters if e["name"] == "memory device 3"]
    assert [n - on3[0] for n in on3] == [0, 8, 16]
    assert all(e["args"]["peak_bytes_in_use"] >= e["args"]["bytes_in_use"] for e in counters)


def test_collectives_of_sub_groups_have_their_own_comm_and_seq():
    mesh = spmd.make_mesh((2, 4), ("i", "j"))
    f = spmd.jit(spmd.shard_map(lambda b: lax.psum(b, "j"), mesh=mesh,
                                in_specs=P(("i", "j")), out_specs=P("i")))
    x = np.arange(8, dtype=np.float32)
    recorder.start()
    try:
        y = np.asarray(f(x))
        f(x)
    finally:
        part = recorder.stop()
    np.testing.assert_array_equal(y, [6, 22])
    spans = [e for e in part["events"] if e[0] == "X" and e[2] == "collective"]
    got = sorted((e[6]["comm"], e[6]["seq"], e[5]) for e in spans)
    assert got == sorted((",".join(map(str, g)), s, d)
                         for g in ((0, 1, 2, 3), (4, 5, 6, 7)) for s in (0, 1) for d in g)
    assert {e[6]["op"] for e in spans} == {"psum"}


def test_tracing_never_changes_results():
    """Numbers with and without a trace, from a cache warmed before it, from programs
    first compiled while tracing and called after it, and from a never-traced twin."""
    mesh = spmd.make_mesh((8,), ("d",))
    scale = np.float32(3.0)
    warm, fresh, twin = (_step_fn(mesh, scale) for _ in range(3))
    x = np.linspace(-1, 1, 16).astype(np.float32)
    y = np.linspace(2, 3, 32).astype(np.float32)  # (another shape: another program)
    want_x, want_y = np.asarray(twin(x)), np.asarray(twin(y))
    np.testing.assert_array_equal(np.asarray(warm(x)), want_x)
    recorder.start()
    try:
        np.testing.assert_array_equal(np.asarray(warm(x)), want_x)
        np.testing.assert_array_equal(np.asarray(fresh(y)), want_y)  # compiled traced
    finally:
        part = recorder.stop()
    assert any(e[2] == "collective" for e in part["events"])
    for f in (warm, fresh):  # after the trace: traced and untraced programs alike
        np.testing.assert_array_equal(np.asarray(f(x)), want_x)
        np.testing.assert_array_equal(np.asarray(f(y)), want_y)
    recorder.start()  # (and a second trace gets its collectives again)
    try:
        fresh(y)
    finally:
        part = recorder.stop()
    assert sum(e[2] == "collective" for e in part["events"]) == 16


def test_programs_are_not_recorded_after_the_trace_ends():
    mesh = spmd.make_mesh((8,), ("d",))
    f = _step_fn(mesh, np.float32(1.0))
    x = np.ones(16, np.float32)
    recorder.start()
    f(x)
    recorder.stop()
    f(x)  # compiled with markers: they record nothing without a trace
    r = recorder.start()
    recorder.stop()
    assert r.events == type(r.events)()


def test_start_and_stop_write_a_directory_or_a_file(tmp_path):
    f = spmd.jit(lambda v: v * 2)
    profiler.start_trace(tmp_path / "run")
    f(np.ones(3, np.float32))
    written = profiler.stop_trace()
    assert written == str(tmp_path / "run" / "trace.json.gz")
    events = _read(written)["traceEvents"]
    assert [(e["name"], e["tid"]) for e in events if e["ph"] == "X"] == [("jit(<lambda>)", 0)]
    profiler.start_trace(str(tmp_path / "plain.json"))
    assert profiler.stop_trace() == str(tmp_path / "plain.json")
    assert "traceEvents" in _read(tmp_path / "plain.json")


def test_a_second_start_raises(tmp_path):
    profiler.start_trace(tmp_path / "a")
    with pytest.raises(profiler.ProfilerError, match="already being recorded"):
        profiler.start_trace(tmp_path / "b")
    profiler.stop_trace()


def test_stop_without_start_raises():
    with pytest.raises(profiler.ProfilerError, match="no trace was started"):
        profiler.stop_trace()


def test_an_unwritable_path_raises_at_start(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(profiler.ProfilerError, match="cannot create the directory"):
        profiler.start_trace(blocker / "trace")
    assert recorder.ACTIVE is None  # nothing started
    with pytest.raises(profiler.ProfilerError, match="log_dir is empty"):
        profiler.start_trace("")


def test_annotations_without_a_trace_record_nothing():
    @profiler.annotate_function
    def load(i):
        return i + 1

    with profiler.TraceAnnotation("idle", k=1) as ann:
        assert load(1) == 2
    assert ann._t0 is None
    r = recorder.start()
    try:
        assert load(2) == 3
        with profiler.TraceAnnotation("busy"):
            pass
    finally:
        part = recorder.stop()
    assert r is not None
    assert [(e[1], e[2], e[5]) for e in part["events"]] == \
        [("test_annotations_without_a_trace_record_nothing.<locals>.load", "user", recorder.HOST),
         ("busy", "user", recorder.HOST)]


def test_checkpoint_save_and_restore_record_spans(tmp_path):
    from spmd import checkpointing

    state = {"w": np.arange(6.0, dtype=np.float32)}
    recorder.start()
    try:
        checkpointing.save(str(tmp_path / "ckpt"), state, step=3)
        checkpointing.save_async(str(tmp_path / "ckpt"), state, step=4).wait()
        back = checkpointing.restore(str(tmp_path / "ckpt"), state)
    finally:
        part = recorder.stop()
    np.testing.assert_array_equal(np.asarray(back["w"]), state["w"])
    spans = [(e[1], e[6]["step"]) for e in part["events"] if e[2] == "checkpoint"]
    assert sorted(spans) == sorted([("checkpoint save", 3), ("checkpoint save", 4),
                                    ("checkpoint save (background write)", 4),
                                    ("checkpoint restore", 4)])
    assert all(e[5] == recorder.HOST for e in part["events"] if e[2] == "checkpoint")


def test_an_eager_shard_map_records_its_span_and_collectives():
    mesh = spmd.make_mesh((8,), ("d",))
    f = spmd.shard_map(lambda b: lax.psum(b, "d") * b, mesh=mesh, in_specs=P("d"),
                       out_specs=P("d"))
    x = np.arange(8, dtype=np.float32)
    recorder.start()
    try:
        y = np.asarray(f(x))
    finally:
        part = recorder.stop()
    np.testing.assert_array_equal(y, x * 28)
    spans = [(e[1], e[2], e[5]) for e in part["events"] if e[0] == "X"]
    assert sorted(spans) == sorted([("psum", "collective", d) for d in range(8)] +
                                   [("shard_map(<lambda>)", "program", d) for d in range(8)])
    np.testing.assert_array_equal(np.asarray(f(x)), y)  # (and without the trace)
