"""Which ranks of a job across hosts ended first, and which never ended: one TCP
connection from each rank to ``spmd-run``, held for the rank's life.

On one machine a FIFO in the launch directory tells the launcher the order in
which the ranks' processes ended (``spmd.launch.job.Job._watch_exits``); a FIFO
does not connect two machines, so across hosts each rank connects to the
launcher instead (``SPMD_LAUNCHER_ALIVE=address:port``) and sends its rank and
the job's token.  The kernel closes a dead process's connection at once: the
first to close is the first rank that died.  A machine that went down (power,
kernel, network) closes nothing: its ranks' connections stay open after mpiexec
has ended the job, which tells a lost machine from ranks that were killed.

>>> watch = Watch("127.0.0.1", "job-x1y2")                       # doctest: +SKIP
>>> watch.env_value()                                           # doctest: +SKIP
'127.0.0.1:40411'
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import time

ENV = "SPMD_LAUNCHER_ALIVE"
# How long a rank may take to connect (the launcher is on the job's network).
CONNECT_S = 2.0
# How long the launcher watches after mpiexec has exited: the ranks of the hosts
# that are still up are being ended by their MPI proxies meanwhile.
AFTER_EXIT_S = 1.5


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (Linux), None if unknown.

    >>> interface_address("lo")                                   # doctest: +SKIP
    '127.0.0.1'
    """
    SIOCGIFADDR = 0x8915
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def launcher_address(mpiexec_args: list[str], environ) -> str | None:
    """Where the ranks reach the launcher: ``$SPMD_LAUNCHER_ADDRESS``, else the address
    of the interface MPI is told to use (Hydra's ``-iface NAME``), else this host's
    name if it resolves to an address other hosts can reach (not a loopback one);
    None: no channel (the summary then cannot tell which host went first).

    >>> launcher_address(["-iface", "lo"], {})                     # doctest: +SKIP
    '127.0.0.1'
    """
    if environ.get("SPMD_LAUNCHER_ADDRESS"):
        return environ["SPMD_LAUNCHER_ADDRESS"]
    for flag, value in zip(mpiexec_args, mpiexec_args[1:]):
        if flag in ("-iface", "--iface"):
            return interface_address(value)
    try:
        addr = socket.gethostbyname(socket.getfqdn())
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


class Watch:
    """The launcher's end: accepts each rank's connection and records the order in
    which they close (:meth:`run`)."""

    def __init__(self, address: str, token: str):
        self.token = token
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.bind((address, 0))
        self.server.listen(128)
        self.server.setblocking(False)
        self.open_at_end: list[int] = []  # ranks still connected when the watch ended

    def env_value(self) -> str:
        host, port = self.server.getsockname()[:2]
        return f"{host}:{port}"

    def run(self, running, ended) -> None:
        """Until ``running()`` is false (and :data:`AFTER_EXIT_S` more, while any rank
        is still connected): accept ranks, call ``ended(rank)`` as each connection
        closes; then note the ranks still connected (:attr:`open_at_end`)."""
        poller = select.poll()
        poller.register(self.server, select.POLLIN)
        conns: dict[int, list] = {}  # fd -> [socket, bytes read, rank or None]
        stop_at = None
        while stop_at is None or (time.monotonic() < stop_at and any(
                c[2] is not None for c in conns.values())):
            if stop_at is None and not running():
                stop_at = time.monotonic() + AFTER_EXIT_S
            for fd, ev in poller.poll(50):
                if fd == self.server.fileno():
                    self._accept(poller, conns)
                elif fd in conns:
                    self._read(poller, conns, fd, ended)
        self.open_at_end = sorted(c[2] for c in conns.values() if c[2] is not None)
        for c in conns.values():
            c[0].close()
        self.server.close()

    def _accept(self, poller, conns) -> None:
        try:
            sock, _ = self.server.accept()
        except OSError:
            return
        sock.setblocking(False)
        conns[sock.fileno()] = [sock, b"", None]
        poller.register(sock, select.POLLIN | select.POLLHUP)

    def _read(self, poller, conns, fd, ended) -> None:
        sock, buf, rank = conns[fd]
        try:
            data = sock.recv(256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # closed: the rank's process has ended
            poller.unregister(fd)
            del conns[fd]
            sock.close()
            if rank is not None:
                ended(rank)
            return
        buf += data
        conns[fd][1] = buf[-256:]
        if rank is None and b"\n" in buf:
            words = buf.split(b"\n", 1)[0].split()
            if len(words) == 2 and words[0].isdigit() and words[1].decode(errors="replace") \
                    == self.token:
                conns[fd][2] = int(words[0])


def connect(rank: int, token: str, environ=os.environ):
    """The rank's end: a connection to the launcher held for the process's life (the
    caller keeps it), or None without ``$SPMD_LAUNCHER_ALIVE`` or when it cannot
    connect (the job runs on; only the report is less precise).

    >>> conn = connect(2, "job-x1y2")                    # in a rank: kept, never closed
    """
    where = environ.get(ENV, "")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_S)
        sock.sendall(f"{rank} {token}\n".encode())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock
    except OSError:
        return None
