"""The timeline's merge, summary and plot (spmd.launch.timeline.{merge,summary,plot})
on synthetic parts whose clocks, arrivals and durations are known exactly.

Parts are built as the recorder writes them: times in each rank's own clock, which
is the common clock plus that rank's offset (large ones, +-300 s, included).
"""

import gzip
import json
import os
import sys

import pytest

from spmd.launch.timeline import merge, recorder, summary
from spmd.launch.timeline.merge import HOST_TID, TimelineError

T0 = 1000.0  # common-clock time of the first step (seconds)
STEP = 0.1  # a step every 100 ms
PROGRAM = 0.08  # each step's program lasts 80 ms
ARRIVE = 0.05  # collectives arrive 50 ms into the step (plus per-rank extra)
EXIT = 0.075  # and every member leaves 75 ms into it
LATE = 0.02  # the delayed rank arrives 20 ms later than the others' base


def _job(offsets, steps=10, late_rank=2, comm=None, hosts=None, drop=None):
    """Parts of ``len(offsets)`` ranks running ``steps`` steps, each a program with one
    psum inside; rank r arrives at ``ARRIVE + 1 ms * r`` into the step, except
    ``late_rank`` which arrives ``LATE`` later than ARRIVE.  ``drop``: (rank, seq) whose
    collective span is missing."""
    n = len(offsets)
    comm = comm or ",".join(map(str, range(n)))
    parts = []
    for r, off in enumerate(offsets):
        events = []
        for i in range(steps):
            s = T0 + i * STEP + off
            events.append(("X", "jit(step)", "program", s, s + PROGRAM, r, None))
            if drop == (r, i):
                continue
            events.append(("X", "psum", "collective", s + arrival(r, late_rank), s + EXIT, r,
                           {"comm": comm, "seq": i, "op": "psum", "bytes": 4096}))
        meta = {"rank": r, "host": (hosts or {}).get(r, f"node{r}"), "pid": 100 + r,
                "offset": off, "error": 1e-5 * (r + 1), "capacity": 1000,
                "recorded": len(events), "dropped": 0}
        parts.append({"meta": meta, "events": events})
    return parts


def arrival(r, late_rank):
    return ARRIVE + LATE if r == late_rank else ARRIVE + 0.001 * r


def _x(trace, **match):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"
            and all(e.get(k) == v or e["args"].get(k) == v for k, v in match.items())]


# ------------------------------------------------------------------ format

def test_every_event_has_the_chrome_fields():
    trace = merge.merge(_job([0.0, 300.0, -300.0]))
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert trace["displayTimeUnit"] == "ms"
    need = {"X": {"ph", "name", "cat", "ts", "dur", "pid", "tid", "args"},
            "M": {"ph", "name", "pid", "args"}, "C": {"ph", "name", "pid", "ts", "args"},
            "i": {"ph", "name", "pid", "ts", "s", "args"}}
    kinds = set()
    for e in trace["traceEvents"]:
        assert need[e["ph"]] <= set(e), e
        kinds.add(e["ph"])
    assert kinds == {"X", "M"}
    json.dumps(trace)  # (serialisable as it is)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0 (node0)", 1: "rank 1 (node1)", 2: "rank 2 (node2)"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {(r, r): f"device {r}" for r in range(3)}
    order = {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert order == {0: 0, 1: 1, 2: 2}
    assert trace["otherData"]["format"] == "spmd timeline 1"


def test_times_are_aligned_microseconds_from_the_earliest_event():
    offsets = [0.0, 300.0, -300.0, 0.25]
    trace = merge.merge(_job(offsets))
    for r in range(4):
        steps = sorted(e["ts"] for e in _x(trace, cat="program", pid=r))
        assert steps == pytest.approx([i * STEP * 1e6 for i in range(10)], abs=1e-3)
        assert all(e["dur"] == pytest.approx(PROGRAM * 1e6, abs=1e-3)
                   for e in _x(trace, cat="program", pid=r))
    clock = trace["otherData"]["clock"]
    assert clock["1"]["offset_us"] == pytest.approx(300e6)
    assert clock["2"]["offset_us"] == pytest.approx(-300e6)
    assert clock["3"]["error_us"] == pytest.approx(40.0)


def test_phases_split_each_member_at_the_last_arrival():
    trace = merge.merge(_job([0.0, 300.0, -300.0]))
    for seq in range(10):
        waits = _x(trace, seq=seq, phase="wait")
        transfers = _x(trace, seq=seq, phase="transfer")
        assert sorted(e["pid"] for e in waits) == sorted(e["pid"] for e in transfers) == [0, 1, 2]
        last = (seq * STEP + ARRIVE + LATE) * 1e6  # rank 2's arrival
        for w in waits:
            assert w["ts"] == pytest.approx((seq * STEP + arrival(w["pid"], 2)) * 1e6, abs=1e-3)
            assert w["ts"] + w["dur"] == pytest.approx(last, abs=1e-3)
            assert w["args"]["last"] == 2 and w["args"]["members_seen"] == 3
            assert w["args"]["op"] == "psum" and w["args"]["bytes"] == 4096
            assert "incomplete" not in w["args"]
        for t in transfers:
            assert t["ts"] == pytest.approx(last, abs=1e-3)
            assert t["ts"] + t["dur"] == pytest.approx((seq * STEP + EXIT) * 1e6, abs=1e-3)
        assert [w["dur"] for w in waits if w["pid"] == 2] == [0.0]  # (empty, still emitted)
    assert trace["otherData"]["clamped"] == 0


def test_a_last_arrival_after_a_members_exit_is_clamped():
    a = {"meta": {"rank": 0, "offset": 0.0, "error": 1e-3},
         "events": [("X", "psum", "collective", 1.0, 1.2, 0, {"comm": "0,1", "seq": 0})]}
    b = {"meta": {"rank": 1, "offset": 0.0, "error": 1e-3},
         "events": [("X", "psum", "collective", 1.25, 1.3, 1, {"comm": "0,1", "seq": 0})]}
    trace = merge.merge([a, b])
    assert trace["otherData"]["clamped"] == 1
    (t0,) = _x(trace, pid=0, phase="transfer")
    (w0,) = _x(trace, pid=0, phase="wait")
    assert t0["dur"] == 0.0 and t0["ts"] == pytest.approx(0.2e6)
    assert w0["ts"] + w0["dur"] == pytest.approx(0.2e6)  # (the wait ends at its exit)
    (t1,) = _x(trace, pid=1, phase="transfer")
    assert t1["ts"] == pytest.approx(0.25e6) and t1["dur"] == pytest.approx(0.05e6)


def test_a_group_missing_a_member_is_incomplete_and_still_emitted():
    trace = merge.merge(_job([0.0, 1.0, 2.0], drop=(1, 4)))
    assert len(_x(trace, seq=4, phase="wait")) == 2
    assert all(e["args"]["incomplete"] is True and e["args"]["members_seen"] == 2
               for e in _x(trace, seq=4))
    assert not any("incomplete" in e["args"] for s in (3, 5) for e in _x(trace, seq=s))
    assert trace["otherData"]["incomplete"] == 1
    text = summary.render(summary.summarize(trace))
    assert "incomplete collectives: 1" in text


def test_dropped_events_are_reported():
    parts = _job([0.0, 0.0])
    parts[1]["meta"].update(dropped=1200, capacity=20)
    trace = merge.merge(parts)
    assert trace["otherData"]["dropped"] == {"0": 0, "1": 1200}
    (mark,) = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert mark["name"] == "events dropped" and mark["s"] == "p" and mark["pid"] == 1
    assert mark["args"] == {"dropped": 1200, "capacity": 20}
    last_end = max(e["ts"] + e["dur"] for e in _x(trace, pid=1))
    assert mark["ts"] == pytest.approx(last_end, abs=1e-3)
    s = summary.summarize(trace)
    assert s["dropped"] == {"1": {"dropped": 1200, "capacity": 20}}
    assert "rank 1 dropped 1200 (capacity 20)" in summary.render(s)


def test_counters_become_memory_counters_per_device():
    part = {"meta": {"rank": 0, "offset": 5.0},
            "events": [("X", "jit(f)", "program", 6.0, 6.5, 0, None),
                       ("C", "memory", 6.5, 0, {"bytes_in_use": 10, "peak_bytes_in_use": 20}),
                       ("C", "memory", 6.5, 1, {"bytes_in_use": 30, "peak_bytes_in_use": 30})]}
    trace = merge.merge([part])
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [(c["name"], c["ts"], c["args"]["bytes_in_use"]) for c in counters] == [
        ("memory device 0", 0.5e6, 10), ("memory device 1", 0.5e6, 30)]


def test_parts_without_events_or_offset():
    empty = {"meta": {"rank": 1, "host": "node1"}, "events": []}
    plain = {"meta": {"rank": 0}, "events": [("X", "save", "checkpoint", 2.0, 3.0, -1, None)]}
    trace = merge.merge([plain, empty])
    assert trace["otherData"]["clock"]["0"] == {"offset_us": 0.0, "error_us": None}
    (span,) = _x(trace)
    assert span["ts"] == 0.0 and span["dur"] == 1e6 and span["tid"] == HOST_TID
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"
             and e["name"] in ("process_name", "thread_name")}
    assert names == {0: "host", 1: "rank 1 (node1)"}  # (rank 0's name is replaced by its thread's)
    s = summary.summarize(trace)
    assert [r["rank"] for r in s["per_rank"]] == [0, 1]
    assert s["per_rank"][1]["total_s"] == 0.0 and s["straggler"] is None
    assert "2 ranks" in summary.render(s)
    assert merge.merge([{"meta": {}, "events": []}])["traceEvents"][0]["args"] == {"name": "rank 0"}


# ------------------------------------------------------------------ one process, many devices

def _simulated(steps=6, devices=4, late=3):
    """One process, ``devices`` simulated devices: a program span on each device
    track, one psum per step whose members are the devices (device ``late`` arrives
    10 ms after the others), and a host annotation."""
    events = [("X", "epoch", "user", 50.0, 50.0 + steps * STEP, recorder.HOST, None)]
    comm = ",".join(map(str, range(devices)))
    for i in range(steps):
        s = 50.0 + i * STEP
        for d in range(devices):
            events.append(("X", "jit(step)", "program", s, s + PROGRAM, d, None))
            t = s + ARRIVE + (0.01 if d == late else 0.0)
            events.append(("X", "psum", "collective", t, s + EXIT, d,
                           {"comm": comm, "seq": i, "op": "psum", "bytes": 64}))
    return {"meta": {"rank": 0, "host": "box", "offset": 0.0, "error": None}, "events": events}


def test_one_process_with_many_devices():
    trace = merge.merge([_simulated()])
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {0: "device 0", 1: "device 1", 2: "device 2", 3: "device 3",
                       HOST_TID: "host"}
    for seq in range(6):
        waits = _x(trace, seq=seq, phase="wait")
        assert sorted(e["tid"] for e in waits) == [0, 1, 2, 3]
        assert all(e["args"]["last"] == [0, 3] and e["args"]["members_seen"] == 4
                   for e in waits)
        ends = {round(e["ts"] + e["dur"], 3) for e in waits}
        assert ends == {round((seq * STEP + ARRIVE + 0.01) * 1e6, 3)}
    s = summary.summarize(trace)
    assert s["straggler"]["label"] == "device 3" and s["straggler"]["device"] == 3
    assert s["straggler"]["share"] == 1.0
    assert s["straggler"]["late_median_s"] == pytest.approx(0.01, abs=1e-9)
    (row,) = s["per_rank"]
    assert row["tracks"] == 4  # (measured per device and averaged)
    # per device: wait 10 ms on devices 0-2, 0 on 3; transfer 15 ms; program 80 ms
    assert row["wait_s"] == pytest.approx(6 * 0.03 / 4)
    assert row["transfer_s"] == pytest.approx(6 * 0.015)
    assert row["compute_s"] == pytest.approx(6 * PROGRAM - row["wait_s"] - row["transfer_s"])
    assert sum(row[k] for k in ("compute", "transfer", "wait", "other")) == pytest.approx(1.0)
    assert "straggler: device 3 arrived last at 100%" in summary.render(s)


# ------------------------------------------------------------------ summary

def test_the_delayed_rank_is_the_straggler():
    hosts = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    s = summary.summarize(merge.merge(_job([0.0, 300.0, -300.0, 7.0], steps=30, hosts=hosts)))
    st = s["straggler"]
    assert (st["rank"], st["host"], st["last"], st["of"], st["share"]) == (2, "node1", 30, 30, 1.0)
    # its lateness: its arrival less the next-latest (rank 3's, 3 ms after ARRIVE)
    assert st["late_median_s"] == pytest.approx(LATE - 0.003, abs=1e-9)
    assert st["late_p90_s"] == pytest.approx(LATE - 0.003, abs=1e-9)
    others = [a for a in s["arrivals"] if a["rank"] != 2]
    assert [(a["rank"], a["last"], a["share"]) for a in others] == [(0, 0, 0.0), (1, 0, 0.0),
                                                                    (3, 0, 0.0)]
    text = summary.render(s)
    assert "straggler: rank 2 (node1) arrived last at 100%" in text
    assert "17.0 ms median" in text


def test_shares_sum_to_one_and_match_the_known_times():
    s = summary.summarize(merge.merge(_job([0.0, -300.0, 300.0], steps=10)))
    total = 9 * STEP + PROGRAM
    for row in s["per_rank"]:
        r = row["rank"]
        wait = 10 * (ARRIVE + LATE - arrival(r, 2))
        transfer = 10 * (EXIT - ARRIVE - LATE)
        assert row["total_s"] == pytest.approx(total)
        assert row["wait_s"] == pytest.approx(wait)
        assert row["transfer_s"] == pytest.approx(transfer)
        assert row["compute_s"] == pytest.approx(10 * PROGRAM - wait - transfer)
        assert row["other_s"] == pytest.approx(total - 10 * PROGRAM)
        assert sum(row[k] for k in ("compute", "transfer", "wait", "other")) == pytest.approx(1.0)
    (top,) = s["most_waiting"]
    assert (top["op"], top["comm"], top["bytes"], top["program"], top["calls"]) == (
        "psum", "0,1,2", 4096, "jit(step)", 10)
    assert top["wait_s"] == pytest.approx(sum(10 * (ARRIVE + LATE - arrival(r, 2))
                                              for r in range(3)))
    assert top["mean_wait_s"] == pytest.approx(top["wait_s"] / 10)
    assert s["steps"]["1"]["count"] == 10
    assert s["steps"]["1"]["median_s"] == pytest.approx(PROGRAM)
    assert s["clock_error_s"] == pytest.approx(3e-5)
    json.dumps(s)
    text = summary.render(s)
    assert "most waiting: psum over 0,1,2 (4.1 kB) in jit(step)" in text


# ------------------------------------------------------------------ files

def test_write_json_and_gzip_round_trip(tmp_path):
    trace = merge.merge(_job([0.0, 300.0]))
    for name in ("t.json", "t.json.gz"):
        path = tmp_path / name
        merge.write(trace, str(path))
        assert merge.read(str(path)) == json.loads(json.dumps(trace))
    with gzip.open(tmp_path / "t.json.gz", "rt") as f:
        assert json.load(f)["otherData"]["format"] == "spmd timeline 1"
    assert json.loads((tmp_path / "t.json").read_text())["displayTimeUnit"] == "ms"
    assert sorted(os.listdir(tmp_path)) == ["t.json", "t.json.gz"]  # (no temp files left)


def test_write_to_a_missing_directory_is_an_error(tmp_path):
    path = tmp_path / "nowhere" / "t.json"
    with pytest.raises(TimelineError, match="nowhere.*does not exist"):
        merge.write(merge.merge(_job([0.0])), str(path))
    assert not (tmp_path / "nowhere").exists()


def test_read_parts_of_spools(tmp_path):
    for r, skew in ((1, 300.0), (0, 0.0)):
        rec = recorder.Recorder(rank=r, host=f"node{r}", spool=str(tmp_path / f"rank-{r}.jsonl"),
                                skew=skew)
        rec.aligned(skew, 1e-4)
        rec.span("jit(step)", "program", 1.0, 1.5, tid=r)
        rec.flush()
    with open(tmp_path / "rank-1.jsonl", "a") as f:
        f.write('["X","psum","collective",1.2,')  # (a torn last line)
    (tmp_path / "rank-2.jsonl").write_text("")  # (a rank that died before its first flush)
    (tmp_path / "notes.txt").write_text("not a part")
    parts = merge.read_parts(str(tmp_path))
    assert [p["meta"]["rank"] for p in parts] == [0, 1, 2]
    assert [len(p["events"]) for p in parts] == [1, 1, 0]
    assert parts[1]["meta"]["host"] == "node1"
    trace = merge.merge(parts)
    assert [e["ts"] for e in _x(trace)] == [0.0, 0.0]  # (rank 1's skew taken out)


def test_read_parts_errors(tmp_path):
    with pytest.raises(TimelineError, match="does not exist"):
        merge.read_parts(str(tmp_path / "missing"))
    with pytest.raises(TimelineError, match="no rank-<k>.jsonl"):
        merge.read_parts(str(tmp_path))


def test_merge_errors():
    with pytest.raises(TimelineError, match="parts is empty"):
        merge.merge([])
    with pytest.raises(TimelineError, match="both have rank 0"):
        merge.merge([{"meta": {"rank": 0}, "events": []}, {"meta": {"rank": 0}, "events": []}])


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from spmd.launch.timeline import plot

    trace = merge.merge(_job([0.0, 300.0, -300.0], steps=20))
    path = tmp_path / "timeline.png"
    plot.plot(trace, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path)) == ["timeline.png"]
    with pytest.raises(TimelineError, match="nowhere.*does not exist"):
        plot.plot(trace, str(tmp_path / "nowhere" / "t.png"))


def test_a_rank_with_two_devices_and_collectives_on_one():
    """Under MPI a rank records its collectives on its first device and programs on
    each: its shares come from the tracks that took part in collectives."""
    parts = _job([0.0, 2.0])
    for r, part in enumerate(parts):
        extra = 10 + r  # the rank's second local device
        part["events"] += [("X", "jit(step)", "program", e[3], e[4], extra, None)
                           for e in list(part["events"]) if e[2] == "program"]
    s = summary.summarize(merge.merge(parts))
    for row in s["per_rank"]:
        assert row["tracks"] == 1
        wait = 10 * (ARRIVE + 0.001 - arrival(row["rank"], 2))  # (no late rank of 2)
        assert row["wait_s"] == pytest.approx(wait)
        assert row["compute_s"] == pytest.approx(10 * (PROGRAM - (EXIT - ARRIVE - 0.001)) - wait)
    assert s["steps"]["1"]["device"] == 1 and s["steps"]["1"]["count"] == 10


def test_a_recorders_part_merges():
    recorder.start(rank=0, host="box")
    try:
        r = recorder.ACTIVE
        for d in range(2):
            r.span("jit(f)", "program", 1.0, 2.0, tid=d)
            r.span("psum", "collective", 1.2 + 0.1 * d, 1.5, tid=d,
                   args={"comm": "0,1", "seq": 0, "op": "psum", "bytes": 8})
        r.counter("memory", 2.0, 0, {"bytes_in_use": 8, "peak_bytes_in_use": 16})
    finally:
        part = recorder.stop()
    trace = merge.merge([part])
    assert [e["args"]["last"] for e in _x(trace, phase="wait")] == [[0, 1], [0, 1]]
    assert [round(e["ts"]) for e in _x(trace, phase="transfer")] == [300000, 300000]
    assert summary.summarize(trace)["straggler"]["label"] == "device 1"


def test_plot_without_matplotlib_names_the_install(tmp_path, monkeypatch):
    from spmd.launch.timeline import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (as if not installed)
    with pytest.raises(ImportError, match=r"pip install matplotlib.*spmd\[examples\]"):
        plot.plot(merge.merge(_job([0.0])), str(tmp_path / "t.png"))
    assert os.listdir(tmp_path) == []


def test_written_files_are_readable_as_the_umask_allows(tmp_path):
    old = os.umask(0o022)
    try:
        merge.write(merge.merge(_job([0.0])), str(tmp_path / "t.json"))
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "t.json").st_mode & 0o777 == 0o644
