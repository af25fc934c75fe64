"""Elastic restarts (``spmd-run --min-ranks M``): which ranks and hosts the next
attempt gets after one failed, and why.

A failed attempt *lost ranks* when the launcher's failure summary
(:func:`spmd.launch.summary.failure_summary`) put it down to ranks that died
without a Python error: a whole host lost (:func:`spmd.launch.summary.lost_host`),
every rank of one host killed by a signal, or ranks killed by a signal
(:meth:`spmd.launch.job.Job.killed`).  :func:`lost_ranks` applies the summary's
own order of those cases, with the same inputs, so that the line printed for an
attempt and the summary above it never disagree.  Any other failure (a Python
exception, ``sys.exit``, a fatal signal with a stack, ranks stranded in a
collective) is the program's: the job is restarted at the same size, as without
``--min-ranks``.

:func:`next_attempt` then takes the lost ranks away: with hosts, every slot of
each host that lost a rank (a spare host from ``--spare`` takes its place first);
without hosts, the lost ranks themselves.  The job never grows back.
"""

from __future__ import annotations

import dataclasses
import signal

from spmd.launch import hosts as hostlist
from spmd.launch.summary import _host_ranks, _whole_host, spans_hosts

Placement = list[tuple[str, int]]


class ElasticError(Exception):
    """Fewer than ``--min-ranks`` ranks are left for the next attempt."""


@dataclasses.dataclass(frozen=True)
class Loss:
    """The ranks an attempt lost (sorted) and how: ``"lost"`` (their host stopped
    answering: :func:`spmd.launch.summary.lost_host`) or the number of the signal
    that killed them.  ``one_of``: the summary's "one of them first, the others by
    the job's cleanup at the same moment" (MPICH ends the other ranks with the same
    SIGKILL at once): one rank of ``ranks`` died, which one cannot be told."""

    ranks: tuple[int, ...]
    how: object
    one_of: bool = False

    @property
    def count(self) -> int:
        """How many ranks died (not those the job's cleanup ended)."""
        return 1 if self.one_of else len(self.ranks)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """The size and hosts of an attempt: ``np`` ranks on ``placement`` (None: all
    on this machine), ``spare`` hosts not used yet, and ``why`` it has this size
    (empty for the first attempt and a restart at the same size)."""

    np: int
    placement: Placement | None
    spare: Placement
    why: str = ""


def lost_ranks(np: int, reports: dict[int, dict], faults: dict[int, str],
               killed: dict[int, int], lost: tuple[str, list[int], str] | None,
               hosts: dict[int, str] | None = None) -> Loss | None:
    """The ranks an attempt lost, as its failure summary classified the failure
    (the cases of :func:`spmd.launch.summary.failure_summary` that name killed or
    lost ranks, in its order), or None when the failure is not a lost rank.

    >>> lost_ranks(4, {0: {"status": 0}}, {}, {3: 9}, None)
    Loss(ranks=(3,), how=9, one_of=False)
    >>> lost_ranks(2, {0: {"status": 1}, 1: {"status": 1}}, {}, {}, None) is None
    True
    """
    if any(rep.get("status", 1) != 0 for rep in reports.values()):
        return None  # a rank's Python error: the summary reports that one
    silent = [r for r in range(np) if r not in reports]
    crashed = {r for r in silent if faults.get(r, "").strip()}
    killed = {r: s for r, s in (killed or {}).items() if r in silent}
    if lost is not None and not crashed & set(lost[1]):
        return Loss(tuple(sorted(lost[1])), "lost")
    if killed and not crashed & set(killed):
        whole = _whole_host(killed, _host_ranks(hosts)) if spans_hosts(hosts) else None
        # Every rank of one host killed: that host was lost (all of them died).
        return Loss(tuple(sorted(killed)), min(killed.values()),
                    one_of=whole is None and len(killed) > 1)
    return None


def describe(loss: Loss, rank_hosts: list[str] | None) -> str:
    """``node1 lost (ranks 2, 3 killed by SIGKILL)`` / ``rank 3 killed by SIGKILL``.

    >>> describe(Loss((2, 3), 9), ["a", "a", "b", "b"])
    'b lost (ranks 2, 3 killed by SIGKILL)'
    >>> describe(Loss((1,), "lost"), None)
    'rank 1 lost (stopped answering)'
    """
    ranks = ("rank " if len(loss.ranks) == 1 else "ranks ") + ", ".join(map(str, loss.ranks))
    if loss.one_of:
        ranks = "one of " + ranks
    how = "stopped answering" if loss.how == "lost" else f"killed by {_signal_name(loss.how)}"
    others = ", the others ended by the job's cleanup" if loss.one_of else ""
    if rank_hosts:
        lost_hosts = ", ".join(dict.fromkeys(rank_hosts[r] for r in loss.ranks))
        return f"{lost_hosts} lost ({ranks} {how}{others})"
    if loss.how == "lost":
        return f"{ranks} lost ({how})"
    return f"{ranks} {how}" + (f" ({others[2:]})" if others else "")


def next_attempt(current: Attempt, rank_hosts: list[str] | None, loss: Loss,
                 min_ranks: int) -> Attempt:
    """The next attempt after ``current`` lost ``loss.ranks`` (``rank_hosts``: each
    rank's host in ``current``).  With hosts, each host that lost a rank is left out
    with all its slots (when which of several ranks died cannot be told, the hosts
    of all of them: a dead host is never kept); the first spare host with at least
    its slots takes its place (and the ranks it ran), else the job runs on the
    ranks the other hosts ran.  Without hosts, on ``np`` less the ranks that died
    (:attr:`Loss.count`: the ranks of one machine are alike).  ElasticError when fewer than
    ``min_ranks`` are left.

    >>> a = Attempt(4, [("n0", 2), ("n1", 2)], [("n2", 2)])
    >>> next_attempt(a, ["n0", "n0", "n1", "n1"], Loss((2, 3), 9), 2)
    Attempt(np=4, placement=[('n0', 2), ('n2', 2)], spare=[], why='n1 lost (ranks 2, 3 \
killed by SIGKILL); spare n2 took its place')
    """
    why = describe(loss, rank_hosts)
    if current.placement is None or not rank_hosts:
        np, placement, spare = current.np - loss.count, None, list(current.spare)
    else:
        np, placement, spare, replaced = _without_lost_hosts(current, rank_hosts, loss)
        if replaced:
            why += "; " + ", ".join(f"spare {new} took {old}'s place" if len(replaced) > 1
                                    else f"spare {new} took its place"
                                    for old, new in replaced)
    if np < min_ranks:
        raise ElasticError(
            f"--min-ranks {min_ranks}: only {np} of {current.np} ranks are left after "
            f"{why}; not restarting. Lower --min-ranks to at most {np}, give spare hosts "
            "with --spare HOST:SLOTS, or bring the lost ranks' machines back")
    return Attempt(np, placement, spare, why)


def _without_lost_hosts(current: Attempt, rank_hosts: list[str], loss: Loss):
    """(np, placement, spare, [(lost host, spare host)]) with the hosts that lost a
    rank replaced by spare ones or left out."""
    per_host = hostlist.ranks_per_host(rank_hosts)
    gone = {rank_hosts[r] for r in loss.ranks}
    spare = list(current.spare)
    placement, np, replaced = [], 0, []
    for host, slots in current.placement:
        used = len(per_host.get(host, []))
        if host not in gone:
            placement.append((host, slots))
            np += used
            continue
        # A spare with at least the lost host's slots, in the order listed.
        for i, (name, spare_slots) in enumerate(spare):
            if spare_slots >= slots and name not in gone:
                placement.append((name, spare_slots))
                np += used
                replaced.append((host, name))
                del spare[i]
                break
    return np, placement, spare, replaced


def parse_spare(text: str | None) -> Placement:
    """``--spare HOST:SLOTS,...`` -> the spare hosts, in order (HostsError naming
    the option when it cannot be read).

    >>> parse_spare("node2:2,node3")
    [('node2', 2), ('node3', 1)]
    """
    return [] if text is None else hostlist.parse_hosts(text, "--spare")


def check_options(np: int, min_ranks: int | None, max_restarts: int, spare: Placement,
                  placement: Placement | None) -> None:
    """ElasticError naming the option, its value and the fix when ``--min-ranks`` or
    ``--spare`` cannot be used as given.

    >>> check_options(4, 2, 1, [], None)   # fine: nothing to say
    """
    if min_ranks is not None and min_ranks > np:
        raise ElasticError(f"--min-ranks {min_ranks} is more than -n {np}: the job could never "
                           f"run; give --min-ranks between 1 and {np}")
    if min_ranks is not None and max_restarts <= 0:
        raise ElasticError(f"--min-ranks {min_ranks} needs --max-restarts N > 0 (got "
                           f"{max_restarts}): without a restart there is no smaller attempt; "
                           "add --max-restarts 1 (or more)")
    if spare and min_ranks is None:
        raise ElasticError("--spare is used by elastic restarts only; add --min-ranks M "
                           "(and --max-restarts N > 0), or leave --spare out")
    if spare and placement is None:
        raise ElasticError("--spare takes a lost host's place, but the job names no hosts; "
                           "give them with --hosts or --hostfile (or run under Slurm), or "
                           "leave --spare out")
    taken = {h for h, _ in placement or []} & {h for h, _ in spare}
    if taken:
        raise ElasticError(f"--spare names {', '.join(sorted(taken))}, already one of the "
                           "job's hosts; a spare host must be another one")


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
