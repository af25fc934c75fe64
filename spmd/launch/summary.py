"""The messages ``spmd-run`` prints when a job does not succeed."""

from __future__ import annotations

import signal

PROG = "spmd-run"
# Lines of each failed rank's error shown in the summary.
ERROR_TAIL = 20


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


def _plural(ranks, hosts: dict[int, str] | None = None) -> str:
    """``rank 2`` / ``ranks 0-2``; with ``hosts`` naming more than one host, each
    rank's host too: ``rank 2 (node1)``, ``ranks 0-1 (node0), 2-3 (node1)``."""
    word = "rank " if len(ranks) == 1 else "ranks "
    if not spans_hosts(hosts):
        return word + format_ranks(ranks)
    groups: dict[str, list[int]] = {}
    for r in sorted(ranks):
        groups.setdefault(hosts.get(r, "?"), []).append(r)
    return word + ", ".join(f"{format_ranks(rs)} ({h})" for h, rs in groups.items())


def spans_hosts(hosts: dict[int, str] | None) -> bool:
    """Whether the job's ranks ran on more than one host (then reports name them).

    >>> spans_hosts({0: "a", 1: "b"}), spans_hosts({0: "a", 1: "a"}), spans_hosts(None)
    (True, False, False)
    """
    return bool(hosts) and len(set(hosts.values())) > 1


def lost_host(np: int, reports: dict[int, dict], mpiexec_reported, exits: list[int],
              hosts: dict[int, str] | None, still_open: list[int] = ()
              ) -> tuple[str, list[int], str] | None:
    """(host, its ranks, how) when a whole host was lost: the job spans hosts, mpiexec
    reported no rank's end (``mpiexec_reported``: its exit codes or its BAD
    TERMINATION box, which a host's MPI proxy reports; a lost host's proxy cannot),
    and none of the host's ranks reported a result; ``how`` is ``"silent"`` when the
    host's ranks alone stayed connected to the launcher after the job ended
    (``still_open``: a machine gone, see :mod:`spmd.launch.alive`), ``"ended"``
    when the first rank to end is on that host (``exits``: ranks in the order their
    processes ended, where the launcher could see it).

    >>> lost_host(4, {}, None, [2, 3, 0, 1], {0: "n0", 1: "n0", 2: "n1", 3: "n1"})
    ('n1', [2, 3], 'ended')
    """
    if not spans_hosts(hosts) or mpiexec_reported:
        return None
    per_host = _host_ranks(hosts)
    silent = [h for h, rs in per_host.items() if set(rs) <= set(still_open)]
    if len(silent) == 1 and len(silent) < len(per_host):
        host, how = silent[0], "silent"
    elif exits:
        host, how = hosts.get(exits[0]), "ended"
    else:
        return None
    ranks = per_host.get(host, [])
    if host is None or any(r in reports for r in ranks):
        return None
    return host, ranks, how


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


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def failure_summary(np: int, reports: dict[int, dict], rc: int | None,
                    faults: dict[int, str], killed: dict[int, int] | None = None,
                    hosts: dict[int, str] | None = None,
                    lost: tuple[str, list[int], str] | None = None) -> tuple[str, int]:
    """(the message, the launcher's exit status) for a job that did not succeed;
    ``killed``: rank -> the signal that killed it (as mpiexec reported it);
    ``hosts``: rank -> its host (named when the job spans several); ``lost``: (host,
    its ranks, how) when a whole host stopped answering (:func:`lost_host`).

    >>> failure_summary(2, {0: {"status": 0}}, 1, {}, killed={1: 9})[1]
    137
    """
    failed = {r: rep for r, rep in reports.items() if rep.get("status", 1) != 0}
    silent = [r for r in range(np) if r not in reports]
    crashed = {r: _without_launcher(faults[r]) for r in silent if faults.get(r, "").strip()}
    killed = {r: s for r, s in (killed or {}).items() if r in silent}
    per_host = _host_ranks(hosts)
    whole = _whole_host(killed, per_host) if spans_hosts(hosts) else None
    # A rank of another host may crash on the lost connection a moment later: the
    # lost host still came first.
    if lost is not None and not failed and not any(r in crashed for r in lost[1]):
        lines, status = _lost_host_lines(lost, rc)
        killed = {r: 0 for r in lost[1]}  # (not listed again below)
    elif whole is not None and not failed and not any(r in crashed for r in killed):
        lines, status = _killed_host_lines(whole, per_host[whole], killed)
    elif killed and not failed and not any(r in crashed for r in killed):
        lines, status = _killed_lines(np, killed, hosts)
    elif failed:
        lines, status = _failed_lines(np, failed, hosts)
    else:
        lines, status = _unreported_lines(np, rc, crashed, killed, hosts)
    after = f" after {lost[0]} was lost" if lost is not None else ""
    for r, text in sorted(crashed.items()):
        lines.append(f"--- {_plural([r], hosts)}: died on a fatal signal{after}")
        lines.append(_tail(text))
    others = [r for r in silent if r not in crashed and r not in killed]
    if others:
        lines.append(f"({_plural(others, hosts)}: no result; ended with the job, killed by a signal "
                     "(e.g. out of memory), or stopped by MPI_Abort)")
    return "\n".join(lines), status


def _lost_host_lines(lost: tuple[str, list[int], str], rc: int | None) -> tuple[list, int]:
    """A whole host stopped answering (:func:`lost_host`)."""
    why = ("its ranks' connections to spmd-run stayed open after mpiexec lost the "
           "host's MPI proxy and exited with status {rc}: the machine is down or cut "
           "from the network" if lost[2] == "silent" else
           "mpiexec lost its connection to the host's MPI proxy and exited with status "
           "{rc}: the machine went down, lost its network, or all its processes were "
           "killed").format(rc=rc)
    return [f"{PROG}: {lost[0]} lost ({_listing(lost[1])}): it stopped answering "
            f"({why}); the job was ended"], rc if rc else 1


def _killed_host_lines(host: str, ranks: list[int], killed: dict[int, int]
                       ) -> tuple[list, int]:
    """Every rank of one host, and only those, killed by a signal."""
    sig = min(killed.values())
    return [f"{PROG}: {host} lost ({_listing(ranks)}): killed by "
            f"{_signal_name(sig)} (no Python error: e.g. the out-of-memory killer, "
            "the machine's shutdown, or a kill command); the job was ended"], 128 + sig


def _killed_lines(np: int, killed: dict[int, int], hosts) -> tuple[list, int]:
    """Ranks killed by a signal, with no Python stack: a signal that cannot be caught
    (SIGKILL) or was sent."""
    sig = min(killed.values())
    ranks = sorted(killed)
    verb = "was" if len(ranks) == 1 else "were"
    return [f"{PROG}: {_plural(ranks, hosts)} of {np} {verb} killed by {_signal_name(sig)} "
            "(no Python error: e.g. the out-of-memory killer, or a kill command); the "
            "job was ended"
            + ("" if len(ranks) == 1 else
               f" (one of them first, the others by the job's cleanup at the same "
               f"moment: which came first cannot be told)")], 128 + sig


def _failed_lines(np: int, failed: dict[int, dict], hosts) -> tuple[list, int]:
    """Ranks that reported a failure from Python: the first one's status; ranks failing
    the same way are shown once."""
    first = min(failed, key=lambda r: (failed[r].get("time", 0), r))
    status = int(failed[first]["status"])
    groups: dict[tuple, list[int]] = {}
    for r, rep in sorted(failed.items()):
        groups.setdefault((rep["status"], rep.get("kind"), rep.get("error", "")), []).append(r)
    if len(failed) == 1:
        lines = [f"{PROG}: {_plural([first], hosts)} of {np} failed with exit status {status}; "
                 "the job was ended"]
    else:
        lines = [f"{PROG}: {_plural(sorted(failed), hosts)} of {np} failed; rank {first} "
                 f"first, with exit status {status}; the job was ended"]
    for (st, kind, error), ranks in groups.items():
        what = {"exception": "raised an exception", "exit": f"called sys.exit({st})",
                "interrupt": "was interrupted (KeyboardInterrupt)",
                "deadline": "reported a collective deadline"}.get(kind, "failed")
        lines.append(f"--- {_plural(ranks, hosts)}: {what}, exit status {st}")
        if error.strip():
            lines.append(_tail(error))
    return lines, status


def _unreported_lines(np: int, rc: int | None, crashed: dict[int, str],
                      killed: dict[int, int], hosts) -> tuple[list, int]:
    """No rank reported an error from Python: ranks that died on a fatal signal, or
    mpiexec's status alone."""
    if crashed:
        sigs = sorted({_signal_name(killed[r]) for r in crashed if r in killed})
        line = (f"{PROG}: {_plural(sorted(crashed), hosts)} of {np} died on a fatal signal"
                + (f" ({', '.join(sigs)})" if sigs else "")
                + f"; the job was ended (mpiexec exit status {rc})")
    elif spans_hosts(hosts) and rc == 255 and not killed:
        line = (f"{PROG}: the job failed: mpiexec exited with status {rc}, as when it "
                "loses its connection to a host's MPI proxy (a machine went down, lost "
                "its network, or all its processes were killed), and no rank reported "
                "an error from Python; which host went first cannot be told from here")
    else:
        line = (f"{PROG}: the job failed: mpiexec exited with status {rc} and no rank "
                "reported an error from Python")
    return [line], rc if rc else 1


def _host_ranks(hosts: dict[int, str] | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r, h in sorted((hosts or {}).items()):
        out.setdefault(h, []).append(r)
    return out


def _whole_host(killed: dict[int, int], per_host: dict[str, list[int]]) -> str | None:
    """The host all of whose ranks, and only those, were killed."""
    for host, ranks in per_host.items():
        if sorted(killed) == ranks and len(ranks) > 0:
            return host
    return None


def _listing(ranks, hosts: dict[int, str] | None = None) -> str:
    """``[0, 2, 3]`` -> ``"ranks 0, 2, 3"``; ``[1]`` -> ``"rank 1"``; with ``hosts``
    naming several hosts, ``"rank 1 (node0)"``."""
    ranks = sorted(ranks)
    where = (lambda r: f" ({hosts.get(r, '?')})") if spans_hosts(hosts) else (lambda r: "")
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(f"{r}{where(r)}"
                                                                   for r in ranks)


def stranded_summary(np: int, finished: list[int], waits: dict[int, dict],
                     hosts: dict[int, str] | None = None) -> str:
    """Ranks that finished while others wait for them in a collective."""
    them = "it" if len(finished) == 1 else "them"
    groups: dict[tuple, list[int]] = {}
    for r, w in sorted(waits.items()):
        groups.setdefault((w.get("what", "a collective"), w.get("where", "")), []).append(r)
    lines = []
    for (what, where), ranks in groups.items():
        verb = "waits" if len(ranks) == 1 else "wait"
        lines.append(f"{PROG}: {_listing(finished, hosts)} finished while "
                     f"{_listing(ranks, hosts)} {verb} for "
                     f"{them} in {what}" + (f" ({where})" if where else "")
                     + f"; the job of {np} ranks was ended")
    lines.append("(a rank that ends its script leaves any collective that needs it without "
                 "a partner: check that every rank runs the same collectives)")
    return "\n".join(lines)


def timeout_summary(np: int, timeout: float, reports: dict[int, dict],
                    pids: dict[int, int], stacks: dict[int, str],
                    hosts: dict[int, str] | None = None) -> str:
    lines = [f"{PROG}: the job did not finish within --timeout {timeout:g}s and was ended"]
    running = [r for r in range(np) if r not in reports]
    remote = [r for r in running if r not in pids and r in (hosts or {})]
    if remote and spans_hosts(hosts):
        lines.append(f"{_plural(remote, hosts)} of {np} still running on other hosts than "
                     "spmd-run's (where they were cannot be asked from here)")
        running = [r for r in running if r not in remote]
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
    elif not remote:
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
