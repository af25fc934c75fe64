"""Where ``spmd-run`` places ranks: ``--hosts``, ``--hostfile`` and Slurm's allocation.

A *placement* is the list of ``(host, slots)`` a job may use, in order; a job of
``n`` ranks fills the first host's slots, then the next host's (block placement,
as MPICH's Hydra, Open MPI and Slurm place ranks by default), so rank ``r`` runs
on the host of slot ``r``.

>>> parse_hosts("node0:2,node1:2", "--hosts")
[('node0', 2), ('node1', 2)]
>>> expand_nodelist("node[01-03,07],gpu5")
['node01', 'node02', 'node03', 'node07', 'gpu5']
>>> tasks_per_node("2(x3),1")
[2, 2, 2, 1]
>>> assign([("a", 2), ("b", 2)], 3)
['a', 'a', 'b']

Every malformed input raises :class:`HostsError` naming where it came from
(the option, the file and line, the variable), the text and the fix.
"""

from __future__ import annotations

import os
import re
import socket

# Written by Hydra's -f and Open MPI's --hostfile alike (one host per line).
SLURM_NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
SLURM_TASKS_VARS = ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE")

_HOST = r"[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\]"
_MPICH_LINE = re.compile(rf"^({_HOST})(?::(\S+))?$")
_OMPI_SLOTS = re.compile(r"^(slots|max_slots|max-slots)=(\S*)$")

HOSTS_FIX = ("give each host as HOST or HOST:SLOTS, SLOTS a positive number of ranks "
             "(e.g. --hosts node0:4,node1:4)")
HOSTFILE_FIX = ("write one host a line, as `HOST`, `HOST:SLOTS` (MPICH) or `HOST slots=SLOTS` "
                "(Open MPI), SLOTS a positive number of ranks; `#` starts a comment")


class HostsError(ValueError):
    """A host list, hostfile or Slurm variable that cannot be read (``spmd-run``
    reports it as a usage error)."""


def _slots(text: str | None, where: str, fix: str) -> int:
    """A host's slot count (1 when not given)."""
    if text is None:
        return 1
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise HostsError(f"{where}: slots {text!r} is not a positive whole number; {fix}")


def parse_hosts(text: str, where: str = "--hosts") -> list[tuple[str, int]]:
    """``host:slots,...`` (MPICH's form; ``host`` alone is one slot) -> placement.

    >>> parse_hosts("a,b:3", "--hosts")
    [('a', 1), ('b', 3)]
    """
    out = []
    for item in text.split(","):
        item = item.strip()
        m = _MPICH_LINE.match(item)
        if not m:
            raise HostsError(f"{where} {text!r}: cannot read the host {item!r}; {HOSTS_FIX}")
        out.append((m.group(1), _slots(m.group(2), f"{where} {text!r}, host {item!r}",
                                       HOSTS_FIX)))
    return merge(out)


def _hostfile_line(line: str, where: str) -> tuple[str, int]:
    """One non-blank hostfile line (comment removed): MPICH's or Open MPI's form."""
    words = line.split()
    m = _MPICH_LINE.match(words[0])
    if m and len(words) == 1:
        return m.group(1), _slots(m.group(2), where, HOSTFILE_FIX)
    if m and m.group(2) is None:
        slots = 1
        for word in words[1:]:
            opt = _OMPI_SLOTS.match(word)
            if not opt:
                raise HostsError(f"{where}: cannot read {word!r}; {HOSTFILE_FIX}")
            if opt.group(1) == "slots":  # (max_slots only caps oversubscription)
                slots = _slots(opt.group(2), where, HOSTFILE_FIX)
        return m.group(1), slots
    raise HostsError(f"{where}: cannot read the host {words[0]!r}; {HOSTFILE_FIX}")


def read_hostfile(path: str) -> list[tuple[str, int]]:
    """A hostfile in MPICH's (``host:n``) or Open MPI's (``host slots=n``) form ->
    placement; a host listed twice gets the sum of its slots.

    >>> read_hostfile("hosts.txt")                                # doctest: +SKIP
    [('node0', 4), ('node1', 4)]
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise HostsError(f"--hostfile {path!r}: cannot read it ({e.strerror}); give the path "
                         "of a file listing the hosts, one a line") from None
    out = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append(_hostfile_line(line, f"--hostfile {path!r}, line {number} ({raw.strip()!r})"))
    if not out:
        raise HostsError(f"--hostfile {path!r} lists no host; {HOSTFILE_FIX}")
    return merge(out)


def merge(placement: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """One entry per host, in order of first mention, slots summed (as Open MPI does).

    >>> merge([("a", 2), ("b", 1), ("a", 1)])
    [('a', 3), ('b', 1)]
    """
    slots: dict[str, int] = {}
    for host, n in placement:
        slots[host] = slots.get(host, 0) + n
    return list(slots.items())


# ------------------------------------------------------------------ Slurm

def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _expand_one(item: str, where: str) -> list[str]:
    """``node[01-03,7]x`` -> its names (one bracket group at a time, left to right)."""
    m = re.match(r"^([^\[\]]*)\[([^\[\]]*)\](.*)$", item)
    if not m:
        if "[" in item or "]" in item:
            raise HostsError(f"{where}: unbalanced brackets in {item!r}; a Slurm node list "
                             "looks like node[01-03,07],gpu5")
        return [item]
    prefix, ranges, rest = m.groups()
    names = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise HostsError(f"{where}: cannot read the range {part!r} in {item!r}; a Slurm "
                             "node list looks like node[01-03,07],gpu5")
        width = len(lo)  # zero padding is kept: node[01-03] -> node01
        for k in range(int(lo), int(hi or lo) + 1):
            names += [prefix + str(k).zfill(width) + tail for tail in _expand_one(rest, where)]
    return names


def expand_nodelist(text: str, where: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Slurm's compressed node list -> host names, in order.

    >>> expand_nodelist("a[1-2]-ib,c")
    ['a1-ib', 'a2-ib', 'c']
    """
    out = []
    for item in _split_top(text):
        out += _expand_one(item, f"{where}={text!r}")
    return out


def tasks_per_node(text: str, where: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slurm's ``2(x3),1`` -> ``[2, 2, 2, 1]``.

    >>> tasks_per_node("4,1(x2)")
    [4, 1, 1]
    """
    out = []
    for part in text.split(","):
        m = re.match(r"^\s*(\d+)(?:\(x(\d+)\))?\s*$", part)
        if not m or int(m.group(1)) == 0:
            raise HostsError(f"{where}={text!r}: cannot read {part!r}; Slurm writes it as "
                             "counts with repeats, e.g. 2(x3),1")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slurm_placement(environ) -> list[tuple[str, int]] | None:
    """The allocation's hosts and their task counts when inside Slurm, else None.

    >>> slurm_placement({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"})
    [('n1', 2), ('n2', 2)]
    >>> slurm_placement({}) is None
    True
    """
    var = next((v for v in SLURM_NODELIST_VARS if environ.get(v, "").strip()), None)
    if var is None:
        return None
    names = expand_nodelist(environ[var].strip(), var)
    tvar = next((v for v in SLURM_TASKS_VARS if environ.get(v, "").strip()), None)
    counts = tasks_per_node(environ[tvar], tvar) if tvar else [1] * len(names)
    if len(counts) != len(names):
        raise HostsError(f"{var}={environ[var]!r} names {len(names)} nodes but "
                         f"{tvar}={environ[tvar]!r} gives {len(counts)} counts; run spmd-run "
                         "inside the allocation's own environment (sbatch or salloc), or "
                         "give the hosts with --hosts")
    return merge(list(zip(names, counts)))


# ------------------------------------------------------------------ placing ranks

def assign(placement: list[tuple[str, int]], n: int) -> list[str]:
    """The host of each of ``n`` ranks: the slots filled in order (callers check
    that there are enough: :func:`check_fits`).

    >>> assign([("a", 1), ("b", 3)], 3)
    ['a', 'b', 'b']
    """
    out = []
    for host, slots in placement:
        out += [host] * min(slots, n - len(out))
    return out


def check_fits(placement: list[tuple[str, int]], n: int, source: str) -> None:
    """HostsError when ``n`` ranks do not fit the slots of ``placement``.

    >>> check_fits([("a", 2)], 2, "--hosts 'a:2'")   # fits: nothing to say
    """
    total = sum(s for _, s in placement)
    if n > total:
        listed = ",".join(f"{h}:{s}" for h, s in placement)
        raise HostsError(f"-n {n} ranks do not fit the {total} slots of {source} ({listed}); "
                         f"lower -n to at most {total}, or give the hosts more slots (HOST:SLOTS, "
                         "SLOTS the ranks that host runs)")


def ranks_per_host(hosts: list[str]) -> dict[str, list[int]]:
    """Host -> its ranks, from :func:`assign`'s list.

    >>> ranks_per_host(["a", "a", "b"])
    {'a': [0, 1], 'b': [2]}
    """
    out: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        out.setdefault(h, []).append(r)
    return out


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine: its name, ``localhost``, ``127.0.0.1`` or
    ``::1`` (other loopback addresses may be emulated nodes: they count as hosts).

    >>> is_local("localhost"), is_local("node-that-is-not-here")
    (True, False)
    """
    here = socket.gethostname()
    return host in (here, here.split(".")[0], "localhost", "127.0.0.1", "::1")


# Each MPI's hostfile line for (host, slots).
HOSTFILE_LINE = {"mpich": "{0}:{1}", "openmpi": "{0} slots={1}"}


def write_hostfile(placement: list[tuple[str, int]], path: str, impl: str) -> str:
    """Write ``placement`` as ``impl``'s hostfile (MPICH's ``host:n``, Open MPI's
    ``host slots=n``); return ``path``.

    >>> open(write_hostfile([("a", 2)], "/tmp/hf", "openmpi")).read().splitlines()  # doctest: +SKIP
    ['a slots=2']
    """
    line = HOSTFILE_LINE["openmpi" if impl == "openmpi" else "mpich"]
    with open(path, "w") as f:
        f.write("".join(line.format(h, s) + "\n" for h, s in placement))
    return path


def host_args(ns, impl: str, launch_dir: str, placement=None) -> list[str]:
    """mpiexec's options naming the hosts of ``ns`` (spmd-run's options, resolved:
    ``ns.placement``, ``ns.hostfile``) or ``placement``: Hydra's -hosts / -f, Open
    MPI's --host / --hostfile (a hostfile is written in the MPI's own form into the
    launch directory, whichever form it was given in).

    >>> host_args(ns, "mpich", "/shared/job-1")                  # doctest: +SKIP
    ['-hosts', 'node0:2,node1:2']
    """
    placement = ns.placement if placement is None else placement
    if not placement:
        return []
    listed = ",".join(f"{h}:{s}" for h, s in placement)
    if ns.hostfile is None or placement is not ns.placement:
        return ["-hosts", listed] if impl != "openmpi" else ["--host", listed]
    path = os.path.join(launch_dir, "hostfile")
    option = "--hostfile" if impl == "openmpi" else "-f"
    return [option, write_hostfile(placement, path, impl)]
