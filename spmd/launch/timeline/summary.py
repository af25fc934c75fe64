"""What a merged trace says about where time went: the numbers
(:func:`summarize`) and the text ``spmd-run`` prints at job end (:func:`render`).

Per rank, its time (first event to last) splits into

- **compute**: time in compiled programs (``cat == "program"``) less the time of
  the collectives inside them;
- **transfer** and **wait**: the collectives' two phases (see
  :mod:`~spmd.launch.timeline.merge`);
- **other**: the rest, host time outside programs and collectives.

A rank with several device tracks (devices simulated in one process, or several
local devices) has these measured per track and averaged over its tracks that
took part in collectives (or, with none, those that ran programs): each device
runs the same program, and a sum would count one second of the rank's time once
per device.

The straggler is the member that arrived last at collectives most often (ties: the
larger median lateness); its lateness at one collective is its arrival less the
second-to-last member's.  A member is a rank, or a device when the members of a
collective live in one process.

>>> from spmd.launch.timeline import merge, summary
>>> part = {"meta": {"rank": 0, "host": "node0"},
...         "events": [("X", "jit(step)", "program", 0.0, 1.0, 0, None)]}
>>> s = summary.summarize(merge.merge([part]))
>>> s["per_rank"][0]["compute"]
1.0
"""

from __future__ import annotations

import bisect
from collections import Counter

import statistics

from spmd.launch.timeline.merge import HOST_TID, member_label

TOP = 5  # the collectives with the most waiting, listed


def summarize(trace: dict) -> dict:
    """The numbers of ``trace`` (a :func:`~spmd.launch.timeline.merge.merge` result),
    JSON-serialisable; times in seconds, shares as fractions of the rank's total.

    >>> summarize(trace)["straggler"]["rank"]  # doctest: +SKIP
    2
    """
    other = trace.get("otherData", {})
    bounds, programs, members = _scan(trace["traceEvents"])
    where = _enclosing(members, programs)
    hosts = other.get("hosts") or _hosts(trace["traceEvents"])
    pids = sorted(set(bounds) | {int(p) for p in hosts})
    start = min((b[0] for b in bounds.values()), default=0.0)
    end = max((b[1] for b in bounds.values()), default=0.0)
    errors = [c["error_us"] for c in other.get("clock", {}).values() if c.get("error_us") is not None]
    single = len(pids) == 1
    busy = _busy(programs, members, where)
    arrivals, straggler, calls = _stragglers(members, hosts, single)
    dropped = {p: {"dropped": n, "capacity": other.get("capacity", {}).get(p)}
               for p, n in other.get("dropped", {}).items() if n}
    return {
        "ranks": len(pids),
        "duration_s": (end - start) / 1e6,
        "clock_error_s": max(errors) / 1e6 if errors else None,
        "per_rank": [_shares(pid, hosts.get(str(pid)), bounds.get(pid), busy.get(pid, {}))
                     for pid in pids],
        "collectives": calls,
        "incomplete": other.get("incomplete", 0),
        "clamped": other.get("clamped", 0),
        "straggler": straggler,
        "arrivals": arrivals,
        "most_waiting": _most_waiting(members, where),
        "steps": _steps(programs),
        "dropped": dropped,
    }


# --------------------------------------------------------------- one pass

def _scan(events: list) -> tuple[dict, dict, dict]:
    """One pass over the events: each pid's first and last time; program spans per
    ``(pid, tid)`` sorted by start; each collective member's record, keyed by
    ``(pid, tid, comm, seq)``: ``[arrival, exit, wait, transfer, op, bytes, last]``
    (microseconds)."""
    bounds: dict = {}
    programs: dict = {}
    members: dict = {}
    for e in events:
        ph = e["ph"]
        if ph == "M":
            continue
        pid, ts = e["pid"], e["ts"]
        end = ts + e.get("dur", 0.0)
        b = bounds.get(pid)
        if b is None:
            bounds[pid] = [ts, end]
        else:
            if ts < b[0]:
                b[0] = ts
            if end > b[1]:
                b[1] = end
        if ph != "X":
            continue
        cat = e.get("cat")
        if cat == "program":
            programs.setdefault((pid, e["tid"]), []).append((ts, end, e["name"]))
        elif cat == "collective" and "phase" in e["args"]:
            a = e["args"]
            key = (pid, e["tid"], str(a.get("comm")), a.get("seq"))
            m = members.get(key)
            if m is None:
                m = members[key] = [ts, end, 0.0, 0.0, a.get("op", e["name"]), a.get("bytes"),
                                    a.get("last")]
            if a.get("phase") == "wait":
                m[0], m[2] = ts, e["dur"]
            else:
                m[1], m[3] = end, e["dur"]
    for spans in programs.values():
        spans.sort()
    return bounds, programs, members


def _hosts(events: list) -> dict:
    """``{"pid": host}`` from the process names (a trace without ``otherData``)."""
    out = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "process_name":
            name = e["args"]["name"]
            out[str(e["pid"])] = name[name.find("(") + 1:-1] if name.endswith(")") else None
    return out


def _enclosing(members: dict, programs: dict) -> dict:
    """For each collective member inside a program span of its track: that
    program's name (the latest-starting span that began before it and ends after)."""
    starts = {k: [s[0] for s in spans] for k, spans in programs.items()}
    out = {}
    for key, m in members.items():
        spans = programs.get(key[:2])
        if not spans:
            continue
        i = bisect.bisect_right(starts[key[:2]], m[0]) - 1
        if i >= 0 and spans[i][1] >= m[1]:
            out[key] = spans[i][2]
    return out


# --------------------------------------------------------------- shares

def _busy(programs: dict, members: dict, where: dict) -> dict:
    """Per rank, per device track: ``[program, collectives inside programs, wait,
    transfer, has collectives]`` (microseconds), in one pass over each."""
    busy: dict = {}
    for (pid, tid), spans in programs.items():
        if tid != HOST_TID:
            t = busy.setdefault(pid, {}).setdefault(tid, [0.0, 0.0, 0.0, 0.0, False])
            t[0] += sum(s[1] - s[0] for s in spans)
    for key, m in members.items():
        t = busy.setdefault(key[0], {}).setdefault(key[1], [0.0, 0.0, 0.0, 0.0, False])
        t[2] += m[2]
        t[3] += m[3]
        t[4] = True
        if key in where:
            t[1] += m[2] + m[3]
    return busy


def _shares(pid: int, host, bound, busy: dict) -> dict:
    """One rank's total, compute, transfer, wait and other time and shares (``busy``:
    its tracks from :func:`_busy`)."""
    tracks = [t for t in busy.values() if t[4]] or list(busy.values())
    n = max(len(tracks), 1)
    compute = sum(t[0] - t[1] for t in tracks) / n / 1e6
    wait = sum(t[2] for t in tracks) / n / 1e6
    transfer = sum(t[3] for t in tracks) / n / 1e6
    total = (bound[1] - bound[0]) / 1e6 if bound else 0.0
    row = {"rank": pid, "host": host, "tracks": len(tracks), "total_s": total,
           "compute_s": compute, "transfer_s": transfer, "wait_s": wait,
           "other_s": total - compute - transfer - wait}
    for k in ("compute", "transfer", "wait", "other"):
        row[k] = row[k + "_s"] / total if total > 0 else 0.0
    return row


# --------------------------------------------------------------- straggler

def _stragglers(members: dict, hosts: dict, single: bool) -> tuple[list, dict | None, int]:
    """Each member's record of arriving last (share, lateness median and p90), the
    straggler among them, and the number of collective calls."""
    calls: dict = {}  # (comm, seq) -> [(arrival, pid, tid)]
    for (pid, tid, comm, seq), m in members.items():
        calls.setdefault((comm, seq), []).append((m[0], pid, tid))
    took_part: Counter = Counter()
    late: dict = {}
    for arrivals in calls.values():
        if len(arrivals) < 2:
            continue
        arrivals.sort()
        distinct = len({a[1] for a in arrivals}) == len(arrivals)
        for _, pid, tid in arrivals:
            took_part[_key(pid, tid, distinct)] += 1
        last, second = arrivals[-1], arrivals[-2]
        late.setdefault(_key(last[1], last[2], distinct), []).append((last[0] - second[0]) / 1e6)
    rows = []
    for key in sorted(took_part, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        lateness = late.get(key, [])
        rows.append({"member": member_label(key[0], key[1], key[1] is None),
                     "rank": key[0], "device": key[1], "host": hosts.get(str(key[0])),
                     "label": _label(key, hosts, single),
                     "last": len(lateness), "of": took_part[key],
                     "share": len(lateness) / took_part[key],
                     "late_median_s": statistics.median(lateness) if lateness else 0.0,
                     "late_p90_s": _p90(lateness) if lateness else 0.0})
    candidates = [r for r in rows if r["last"]]
    straggler = max(candidates, key=lambda r: (r["last"], r["late_median_s"]), default=None)
    return rows, straggler, len(calls)


def _key(pid: int, tid: int, distinct: bool) -> tuple:
    return (pid, None) if distinct else (pid, tid)


def _label(key: tuple, hosts: dict, single: bool) -> str:
    """"rank 2 (node1)", "device 3" (one process) or "rank 0 device 3"."""
    pid, tid = key
    host = hosts.get(str(pid))
    rank = f"rank {pid} ({host})" if host else f"rank {pid}"
    if tid is None:
        return rank
    return f"device {tid}" if single else f"{rank} device {tid}"


# --------------------------------------------------------------- waiting, steps

def _most_waiting(members: dict, where: dict) -> list[dict]:
    """The :data:`TOP` collectives (op, comm, bytes, enclosing program) with the most
    waiting summed over members: their calls, total and mean wait per call."""
    groups: dict = {}  # key -> [wait, {seq}]
    for key, m in members.items():
        g = groups.setdefault((m[4], key[2], m[5], where.get(key)), [0.0, set()])
        g[0] += m[2]
        g[1].add(key[3])
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])[:TOP]
    return [{"op": op, "comm": comm, "bytes": nbytes, "program": program,
             "calls": len(seqs), "wait_s": wait / 1e6, "mean_wait_s": wait / 1e6 / len(seqs)}
            for (op, comm, nbytes, program), (wait, seqs) in top]


def _steps(programs: dict) -> dict:
    """Per rank: the durations of its most common program (the training step), from
    its first device track that ran it, in order."""
    names: dict = {}
    for (pid, _), spans in programs.items():
        names.setdefault(pid, Counter()).update(s[2] for s in spans)
    out = {}
    for pid, counts in sorted(names.items()):
        name = counts.most_common(1)[0][0]
        tid = min(t for (p, t), spans in programs.items()
                  if p == pid and any(s[2] == name for s in spans))
        durations = [(s[1] - s[0]) / 1e6 for s in programs[(pid, tid)] if s[2] == name]
        out[str(pid)] = {"name": name, "device": tid, "count": len(durations),
                         "median_s": statistics.median(durations), "durations_s": durations}
    return out


# --------------------------------------------------------------- text

def render(summary: dict) -> str:
    """The text ``spmd-run`` prints at job end: one line of totals, a row per rank,
    the straggler, the collectives with the most waiting, and warnings (dropped
    events, incomplete collectives, clamped transfers).

    >>> print(render(summarize(trace)))  # doctest: +SKIP
    spmd timeline: 4 ranks, 12.0 s, clock error <= 0.05 ms (max over ranks)
    ...
    """
    s = summary
    err = s["clock_error_s"]
    clock = f"clock error <= {_time(err)} (max over ranks)" if err is not None else "clocks not aligned"
    lines = [f"spmd timeline: {s['ranks']} rank{'s' * (s['ranks'] != 1)}, "
             f"{_time(s['duration_s'])}, {clock}",
             f"{'rank':<6} {'host':<16} {'compute':>8} {'transfer':>9} {'wait':>6} {'other':>6}"]
    for r in s["per_rank"]:
        lines.append(f"{r['rank']:<6} {str(r['host'] or '-')[:16]:<16} {r['compute']:>8.0%} "
                     f"{r['transfer']:>9.0%} {r['wait']:>6.0%} {r['other']:>6.0%}")
    st = s["straggler"]
    if st is not None:
        lines.append(f"straggler: {st['label']} arrived last at {st['share']:.0%} of its "
                     f"{st['of']} collectives, late by {_time(st['late_median_s'])} median, "
                     f"{_time(st['late_p90_s'])} p90")
    elif s["collectives"]:
        lines.append("straggler: none (no collective had two members in the trace)")
    for i, w in enumerate(s["most_waiting"][:3]):
        where = f" in {w['program']}" if w["program"] else ""
        size = f" ({_bytes(w['bytes'])})" if w["bytes"] is not None else ""
        lines.append(f"{'most waiting:' if i == 0 else '':<13} {w['op']} over {w['comm']}{size}"
                     f"{where}: {_time(w['wait_s'])} waited (all members) over {w['calls']} calls, "
                     f"{_time(w['mean_wait_s'])} per call")
    names = {step["name"] for step in s["steps"].values()}
    if names:
        one = len(names) == 1  # (the usual case: name the step once)
        lines.append(f"step times ({names.pop() + ', ' if one else ''}median): " + ", ".join(
            f"rank {pid} {_time(step['median_s'])} x{step['count']}"
            + ("" if one else f" {step['name']}") for pid, step in s["steps"].items()))
    for pid, d in s["dropped"].items():
        lines.append(f"dropped events: rank {pid} dropped {d['dropped']} "
                     f"(capacity {d['capacity']}); its timeline ends early")
    if s["incomplete"]:
        lines.append(f"incomplete collectives: {s['incomplete']} seen on fewer members than "
                     "their communicator (a rank died or dropped events)")
    if s["clamped"]:
        lines.append(f"clamped transfers: {s['clamped']} (a member left before the last one "
                     "arrived on the aligned clock: clock error)")
    return "\n".join(lines)


def _time(seconds: float) -> str:
    if abs(seconds) >= 1:
        return f"{seconds:.1f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _p90(values: list) -> float:
    """The 90th percentile, interpolated between the two nearest values (numpy's
    default); without numpy: the launcher that prints it loads no array library."""
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=10, method="inclusive")[8]
