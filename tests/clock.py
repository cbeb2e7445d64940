"""One fake clock for every test that injects time: it moves only when the test moves it.

Pass it wherever code takes a `clock=` callable (it returns `t`), or a `Clock` with
`monotonic()` and `now()` (the scaling policy's). `advance(s)` moves both readings together;
setting `t` moves the monotonic reading alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

NOON_UTC = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)  # a Monday


class FakeClock:
    def __init__(self, t: float = 1000.0, wall: datetime = NOON_UTC) -> None:
        self.t = t
        self.wall = wall

    def __call__(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return self.wall

    def advance(self, s: float) -> None:
        self.t += s
        self.wall += timedelta(seconds=s)
