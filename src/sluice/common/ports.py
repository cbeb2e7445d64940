"""A free TCP port for a process about to be started on it.

Why not simply the kernel's port 0, bound and released here: such a port comes from the
ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, 32768–60999 by default), from which
the kernel also hands a local port to every outgoing connection — so between its release here
and the child's bind, any connection on the machine may take it, and the child fails with
EADDRINUSE. A supervised process that keeps its port across restarts (a search router's local
replica, whose URL the router holds) would then never come back; a test would fail once in a
while under load. A port below that range is never handed out by the kernel on its own: one is
picked there at random (two callers rarely pick the same) and checked free by binding it.
Where the range leaves no room below it, the kernel's port 0 as before.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000  # below: the well-known and registered services' usual ports, left alone
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 64
_rng = random.SystemRandom()


def ephemeral_range(path: Path = _RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for local ports it picks itself (Linux's default where unreadable)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1", ephemeral: tuple[int, int] | None = None, rng: random.Random = _rng) -> int:
    """A port on `host` that nothing is bound to now, below the kernel's ephemeral range when
    it leaves room there (else one the kernel picks)."""
    low, _ = ephemeral or ephemeral_range()
    if low - LOWEST >= 1000:
        for _ in range(_TRIES):
            port = rng.randrange(LOWEST, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue  # bound by another process (or in TIME_WAIT): another one
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
