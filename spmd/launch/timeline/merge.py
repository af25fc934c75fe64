"""The ranks' records as one clock-aligned Chrome trace (the JSON that Perfetto and
``chrome://tracing`` open).

Each part (one process's ``{"meta": ..., "events": [...]}``, see
:mod:`~spmd.launch.timeline.recorder`) becomes a trace process: ``pid`` is the
part's rank, named ``"rank k (host)"``; each device id it recorded on is a thread
(``tid`` = the device id, named ``"device d"``).  The recorder's host track
(:data:`~spmd.launch.timeline.recorder.HOST`, -1) becomes thread :data:`HOST_TID`
(1_000_000, named ``"host"``): Chrome wants non-negative thread ids, and no device
id reaches a million.

Times move onto the common clock with the part's ``offset`` (``t_common = t_local -
offset``) and are written in microseconds from the earliest event of all parts, so
the file starts near 0.

A collective (``cat == "collective"``, ``args`` with ``comm`` and ``seq``) is one
span per member, from its arrival to its exit.  The spans of all parts with the
same ``(comm, seq)`` are one call; the last member's arrival splits each member's
span into a ``"wait"`` phase (arrival to last arrival: it could not start) and a
``"transfer"`` phase (last arrival to exit).  Clock error can put the last arrival
after a member's exit; that member's transfer is then empty at its exit, and
``otherData["clamped"]`` counts it.

>>> from spmd.launch.timeline import merge
>>> part = {"meta": {"rank": 0, "host": "node0", "offset": 0.0},
...         "events": [("X", "jit(step)", "program", 1.0, 1.5, 0, None)]}
>>> trace = merge.merge([part])
>>> [e["ts"] for e in trace["traceEvents"] if e["ph"] == "X"]
[0.0]
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import os
import re
import uuid

from spmd.errors import SpmdError
from spmd.launch.timeline.recorder import HOST, read_part

HOST_TID = 1_000_000  # the thread id of a process's host track in the trace
FORMAT = "spmd timeline 1"
_PART_NAME = re.compile(r"rank-(\d+)\.jsonl$")


class TimelineError(SpmdError, ValueError):
    """Timeline records that cannot be read, merged or written (a missing spool
    directory, no parts, two parts of one rank, an output path in a missing
    directory)."""


# ------------------------------------------------------------------ reading

def read_parts(directory: str) -> list[dict]:
    """Every ``rank-<k>.jsonl`` spool in ``directory`` as a part, sorted by rank.

    A part whose meta was never written (the rank died before its first flush)
    takes its rank from the file name.

    >>> parts = read_parts("/tmp/job-trace")          # doctest: +SKIP
    >>> [p["meta"]["rank"] for p in parts]            # doctest: +SKIP
    [0, 1, 2, 3]
    """
    if not os.path.isdir(directory):
        raise TimelineError(f"read_parts: the spool directory {directory!r} does not exist; "
                            "pass the directory the ranks spooled into (rank-<k>.jsonl files)")
    found = []
    for path in glob.glob(os.path.join(glob.escape(directory), "rank-*.jsonl")):
        m = _PART_NAME.search(os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    if not found:
        raise TimelineError(f"read_parts: no rank-<k>.jsonl spool files in {directory!r}; "
                            "did the job run with a trace on (spmd-run --trace PATH)?")
    parts = []
    for rank, path in sorted(found):
        part = read_part(path)
        part["meta"].setdefault("rank", rank)
        parts.append(part)
    parts.sort(key=lambda p: p["meta"]["rank"])
    return parts


# ------------------------------------------------------------------ merging

def merge(parts: list[dict]) -> dict:
    """One Chrome trace of ``parts`` (see the module's docstring), with ``otherData``
    holding each rank's clock offset and error, recorded and dropped events, and the
    number of clamped transfers.

    >>> a = {"meta": {"rank": 0, "offset": 0.0}, "events": [
    ...     ("X", "psum", "collective", 1.0, 1.3, 0, {"comm": "0,1", "seq": 0})]}
    >>> b = {"meta": {"rank": 1, "offset": 5.0}, "events": [
    ...     ("X", "psum", "collective", 6.2, 6.3, 1, {"comm": "0,1", "seq": 0})]}
    >>> t = merge([a, b])
    >>> sorted((e["pid"], e["args"]["phase"], round(e["ts"]), round(e["dur"]))
    ...        for e in t["traceEvents"] if e["ph"] == "X")
    [(0, 'transfer', 200000, 100000), (0, 'wait', 0, 200000), (1, 'transfer', 200000, 100000), (1, 'wait', 200000, 0)]
    """
    if not parts:
        raise TimelineError("merge: parts is empty; pass at least one part "
                            "(recorder.stop() or read_parts(directory))")
    infos = _part_infos(parts)
    base = _earliest(parts, infos)
    events: list = []
    spans: dict = {}  # (comm, seq) -> [(pid, tid, t0, t1, name, args)] on the common clock
    tracks: dict = {}  # pid -> set of trace tids
    for part, info in zip(parts, infos):
        _convert(part.get("events") or [], info, base, events, spans,
                 tracks.setdefault(info["pid"], set()))
    clamped, incomplete = _collectives(spans, base, events)
    meta_events = _metadata(infos, tracks)
    other = _other_data(infos, clamped, incomplete)
    for info in infos:
        if info["dropped"]:
            events.append({"ph": "i", "s": "p", "name": "events dropped", "pid": info["pid"],
                           "ts": max(0.0, (info["last"] - base) * 1e6) if info["last"] is not None
                           else 0.0,
                           "args": {"dropped": info["dropped"], "capacity": info["capacity"]}})
    return {"traceEvents": meta_events + events, "displayTimeUnit": "ms", "otherData": other}


def _part_infos(parts: list[dict]) -> list[dict]:
    """Each part's facts: pid (rank), host, offset (0 when missing), error, counts."""
    infos, seen = [], {}
    for i, part in enumerate(parts):
        meta = part.get("meta") or {}
        rank = int(meta.get("rank", i))
        if rank in seen:
            raise TimelineError(f"merge: parts {seen[rank]} and {i} both have rank {rank}; "
                                "pass one part per rank")
        seen[rank] = i
        events = part.get("events") or []
        last = max((e[4] if e[0] == "X" else e[2] for e in events), default=None)
        offset = meta.get("offset") or 0.0
        infos.append({"pid": rank, "host": meta.get("host"), "offset": float(offset),
                      "error": meta.get("error") if meta.get("offset") is not None else None,
                      "capacity": meta.get("capacity"), "recorded": meta.get("recorded", len(events)),
                      "dropped": meta.get("dropped", 0) or 0,
                      "last": None if last is None else last - offset})
    return infos


def _earliest(parts: list[dict], infos: list[dict]) -> float:
    """The earliest event time of all parts on the common clock (0 with no events)."""
    firsts = [min(e[3] if e[0] == "X" else e[2] for e in part["events"]) - info["offset"]
              for part, info in zip(parts, infos) if part.get("events")]
    return min(firsts, default=0.0)


def _convert(raw: list, info: dict, base: float, events: list, spans: dict, tids: set) -> None:
    """Append ``raw``'s spans and counters to ``events`` (collectives to ``spans``,
    split later); note the trace tids used."""
    pid, offset = info["pid"], info["offset"]
    shift = offset + base  # (local seconds - shift) * 1e6 = trace microseconds
    for e in raw:
        if e[0] == "X":
            _, name, cat, t0, t1, tid, args = e
            tid = HOST_TID if tid == HOST else tid
            tids.add(tid)
            if cat == "collective" and args and "comm" in args and "seq" in args:
                spans.setdefault((str(args["comm"]), args["seq"]), []).append(
                    (pid, tid, t0 - offset, t1 - offset, name, args))
                continue
            events.append({"ph": "X", "name": name, "cat": cat, "ts": (t0 - shift) * 1e6,
                           "dur": (t1 - t0) * 1e6, "pid": pid, "tid": tid, "args": args or {}})
        elif e[0] == "C":
            _, name, t, tid, values = e
            label = "host" if tid == HOST else f"device {tid}"
            events.append({"ph": "C", "name": f"{name} {label}", "pid": pid,
                           "ts": (t - shift) * 1e6, "args": values})


def member_label(pid: int, tid: int, pids_distinct: bool):
    """How a collective's member is named: its rank when every member is a different
    process, else ``[rank, device]`` (devices simulated in one process)."""
    return pid if pids_distinct else [pid, tid]


def _expected_members(comm: str) -> int | None:
    """The member count a ``comm`` like ``"0,1,2,3"`` lists (None for another form)."""
    items = comm.split(",")
    return len(items) if all(s.strip().lstrip("-").isdigit() for s in items) else None


def _collectives(spans: dict, base: float, events: list) -> tuple[int, int]:
    """Append each collective member's wait and transfer phases; the counts of
    clamped transfers and incomplete calls."""
    clamped = incomplete = 0
    for (comm, _), members in spans.items():
        last_t0, last = max((m[2], i) for i, m in enumerate(members))
        seen = {(m[0], m[1]) for m in members}
        distinct = len({m[0] for m in members}) == len(seen)
        label = member_label(members[last][0], members[last][1], distinct)
        expected = _expected_members(comm)
        partial = expected is not None and len(seen) < expected
        incomplete += partial
        for pid, tid, t0, t1, name, args in members:
            split = last_t0
            if split > t1:  # (clock error: the last arrival after this member left)
                split = t1
                clamped += 1
            extra = {"last": label, "members_seen": len(seen)}
            if partial:
                extra["incomplete"] = True
            for phase, a, b in (("wait", t0, split), ("transfer", split, t1)):
                events.append({"ph": "X", "name": name, "cat": "collective",
                               "ts": (a - base) * 1e6, "dur": (b - a) * 1e6, "pid": pid,
                               "tid": tid, "args": {**args, **extra, "phase": phase}})
    return clamped, incomplete


def _metadata(infos: list[dict], tracks: dict) -> list[dict]:
    """Process names ("rank k (host)"), their order, and thread names."""
    out = []
    for info in infos:
        pid = info["pid"]
        name = f"rank {pid} ({info['host']})" if info["host"] else f"rank {pid}"
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}})
        for tid in sorted(tracks.get(pid, ())):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": "host" if tid == HOST_TID else f"device {tid}"}})
    return out


def _other_data(infos: list[dict], clamped: int, incomplete: int) -> dict:
    def us(x):
        return None if x is None else float(x) * 1e6

    return {"clock": {str(i["pid"]): {"offset_us": us(i["offset"]), "error_us": us(i["error"])}
                      for i in infos},
            "hosts": {str(i["pid"]): i["host"] for i in infos},
            "capacity": {str(i["pid"]): i["capacity"] for i in infos},
            "dropped": {str(i["pid"]): i["dropped"] for i in infos},
            "recorded": {str(i["pid"]): i["recorded"] for i in infos},
            "clamped": clamped, "incomplete": incomplete, "format": FORMAT}


# ------------------------------------------------------------------ writing

def write(trace: dict, path: str) -> None:
    """Write ``trace`` to ``path`` as JSON (gzip-compressed when it ends with
    ``.json.gz``), atomically: a reader sees the old file or the whole new one.

    >>> write(merge([{"meta": {"rank": 0}, "events": []}]), "/tmp/t.json.gz")  # doctest: +SKIP
    """
    data = json.dumps(trace, separators=(",", ":")).encode()
    with atomic_file(path, "write") as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as f:
                f.write(data)
        else:
            raw.write(data)


def output_directory(path: str, caller: str) -> str:
    """The directory ``path`` will be written in, which must exist (``caller``: the
    function named in the error).

    >>> output_directory("/tmp/t.json", "write")
    '/tmp'
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise TimelineError(f"{caller}: the directory of {path!r} does not exist; "
                            "create it first or pass a path in an existing directory")
    return directory


@contextlib.contextmanager
def atomic_file(path: str, caller: str):
    """A binary file that becomes ``path`` when the block ends without an error (a
    temporary file beside it, then ``os.replace``); ``caller`` names the function
    in the error for a missing directory.

    >>> with atomic_file("/tmp/out.bin", "write") as f:  # doctest: +SKIP
    ...     f.write(b"...")
    """
    directory = output_directory(path, caller)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    # (os.open with 0o666: the file gets the user's umask, as a plain open() would;
    # mkstemp's 0o600 would hide a trace from the colleague it is for)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read(path: str) -> dict:
    """A trace written by :func:`write` (``.json`` or ``.json.gz``).

    >>> read("/tmp/t.json.gz")["otherData"]["format"]  # doctest: +SKIP
    'spmd timeline 1'
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)
