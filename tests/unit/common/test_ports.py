"""common/ports.py: a free port for a child process, below the kernel's ephemeral range so that
no outgoing connection can take it before the child binds it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from sluice.common.ports import LOWEST, ephemeral_range, free_port


def test_a_port_below_the_ephemeral_range_that_is_free_and_bindable():
    low, _ = ephemeral_range()
    ports = {free_port() for _ in range(20)}
    if low - LOWEST >= 1000:  # this machine's range leaves room below it (Linux's default does)
        assert all(LOWEST <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_bound_port_is_passed_over_and_a_range_with_no_room_falls_back_to_the_kernels(tmp_path: Path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        picks = iter([taken, taken, taken + 1 if taken + 1 < 65536 else taken - 1])

        class Scripted(random.Random):
            def randrange(self, *a: object) -> int:
                return next(picks)

        # the range's low end put above the held port, so the scripted picks are in range
        got = free_port(ephemeral=(max(taken + 2, LOWEST + 1000), 65000), rng=Scripted())
        assert got != taken
    assert LOWEST > 1024
    low_only = free_port(ephemeral=(LOWEST + 10, 65000))  # no room below: the kernel's pick
    assert low_only >= 1024
    (tmp_path / "range").write_text("1024\t65000\n")
    assert ephemeral_range(tmp_path / "range") == (1024, 65000)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)
