"""A per-worker circuit breaker: stop sending requests to a worker that keeps failing.

    CLOSED ──(N consecutive failures, or failure rate ≥ r over the window)──▶ OPEN
    OPEN ──(cool-down elapsed)──▶ HALF_OPEN: exactly one probe request is let through
    HALF_OPEN ──probe succeeds──▶ CLOSED        HALF_OPEN ──probe fails──▶ OPEN (cool-down × 2)

Failures include timeouts: a worker that hangs (SIGSTOP, a wedged GPU) never breaks the
connection, so the caller's deadline reports `Outcome.TIMEOUT` and it counts like an error.
A half-open probe that never reports back at all (the caller itself got stuck) counts as a
failure once `probe_timeout_s` passes, so the breaker cannot wedge half-open.

Outcomes carry the `Permit` they were granted with; a permit from an earlier state (a slow
request sent before the circuit opened) is ignored, so a late success cannot close a circuit
that has opened since, and a late failure cannot reopen one that has recovered.

The cool-down doubles on each consecutive reopen up to `max_cooldown_s` and resets on close
(a worker that stays broken is probed ever less often; LiteLLM's fixed cool-downs re-cool
a dead deployment every few seconds forever). The rate rule needs `min_requests` outcomes in
the window, so one failure out of one request does not open a circuit. The clock is injected.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sluice.routing.fleet_file.breaker_settings import BreakerConfig


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Outcome(str, enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"  # the worker refused, broke the connection or failed the request
    TIMEOUT = "timeout"  # a deadline passed with no answer: counted as a failure

    @property
    def failed(self) -> bool:
        return self is not Outcome.SUCCESS


@dataclass(slots=True, frozen=True)
class Permit:
    epoch: int  # the breaker's state epoch when granted
    probe: bool  # the single half-open probe


class CircuitBreaker:
    def __init__(self, config: BreakerConfig = BreakerConfig(), clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._epoch = 0
        self._consecutive = 0
        self._window: deque[tuple[float, bool]] = deque()  # (time, failed) while closed
        self._failures_in_window = 0
        self._opened_at = 0.0
        self._cooldown = config.cooldown_s
        self._probe_deadline: float | None = None  # set while the half-open probe is out
        self.opens = 0  # times the circuit opened (for metrics)

    # -- state --------------------------------------------------------------------------------
    @property
    def state(self) -> BreakerState:
        self._advance(self._clock())
        return self._state

    def available(self) -> bool:
        """Would a request be let through now (without taking the half-open probe slot)?"""
        now = self._clock()
        self._advance(now)
        return self._state is BreakerState.CLOSED or (
            self._state is BreakerState.HALF_OPEN and self._probe_deadline is None
        )

    def try_acquire(self) -> Permit | None:
        """A permit to send one request, or None when the circuit refuses it."""
        now = self._clock()
        self._advance(now)
        if self._state is BreakerState.CLOSED:
            return Permit(self._epoch, probe=False)
        if self._state is BreakerState.HALF_OPEN and self._probe_deadline is None:
            self._probe_deadline = now + self.config.probe_timeout_s
            return Permit(self._epoch, probe=True)
        return None

    # -- outcomes -----------------------------------------------------------------------------
    def record(self, permit: Permit, outcome: Outcome) -> None:
        now = self._clock()
        self._advance(now)
        if permit.epoch != self._epoch:
            return  # from before the last state change: says nothing about the worker now
        if self._state is BreakerState.HALF_OPEN:
            if permit.probe:
                self._close(now) if not outcome.failed else self._open(now, reopen=True)
            return
        if self._state is not BreakerState.CLOSED:
            return
        self._window.append((now, outcome.failed))
        self._failures_in_window += outcome.failed
        self._trim(now)
        self._consecutive = self._consecutive + 1 if outcome.failed else 0
        if outcome.failed and self._should_open():
            self._open(now, reopen=False)

    def record_health(self, healthy: bool) -> None:
        """A health-check result outside any request. A failed check counts as a failure while
        closed. A passing one never closes an open circuit by itself: recovery goes through
        the half-open probe, which a health checker may take too (try_acquire, then record)."""
        permit = Permit(self._epoch, probe=False)
        if self.state is BreakerState.CLOSED and not healthy:
            self.record(permit, Outcome.FAILURE)

    # -- transitions --------------------------------------------------------------------------
    def _should_open(self) -> bool:
        c = self.config
        if self._consecutive >= c.consecutive_failures:
            return True
        n = len(self._window)
        return n >= c.min_requests and self._failures_in_window / n >= c.error_rate

    def _trim(self, now: float) -> None:
        horizon = now - self.config.window_s
        while self._window and self._window[0][0] < horizon:
            _, failed = self._window.popleft()
            self._failures_in_window -= failed

    def _open(self, now: float, reopen: bool) -> None:
        if reopen:
            self._cooldown = min(self._cooldown * 2, self.config.max_cooldown_s)
        self._state = BreakerState.OPEN
        self._epoch += 1
        self._opened_at = now
        self._probe_deadline = None
        self.opens += 1

    def _close(self, now: float) -> None:
        self._state = BreakerState.CLOSED
        self._epoch += 1
        self._consecutive = 0
        self._window.clear()
        self._failures_in_window = 0
        self._cooldown = self.config.cooldown_s
        self._probe_deadline = None

    def _advance(self, now: float) -> None:
        """Apply the transitions that time alone causes."""
        if self._state is BreakerState.OPEN and now >= self._opened_at + self._cooldown:
            self._state = BreakerState.HALF_OPEN
            self._epoch += 1
            self._probe_deadline = None
        elif self._state is BreakerState.HALF_OPEN and self._probe_deadline is not None and now >= self._probe_deadline:
            self._open(now, reopen=True)  # the probe never answered: a hung worker
            self._advance(now)  # a zero cool-down would half-open again at once
