"""The per-worker circuit breaker, on an injected clock."""

from __future__ import annotations

from sluice.routing.dispatch.circuit_breaker import BreakerConfig, BreakerState, CircuitBreaker, Outcome
from tests.clock import FakeClock

CFG = BreakerConfig(
    consecutive_failures=3,
    error_rate=0.5,
    window_s=10.0,
    min_requests=6,
    cooldown_s=5.0,
    max_cooldown_s=20.0,
    probe_timeout_s=8.0,
)


def breaker(cfg: BreakerConfig = CFG) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(cfg, clock), clock


def run(b: CircuitBreaker, outcome: Outcome) -> None:
    permit = b.try_acquire()
    assert permit is not None
    b.record(permit, outcome)


def test_consecutive_failures_open_and_a_success_resets_the_count():
    b, _ = breaker()
    for _ in range(2):
        run(b, Outcome.FAILURE)
    run(b, Outcome.SUCCESS)
    for _ in range(2):
        run(b, Outcome.FAILURE)
    assert b.state is BreakerState.CLOSED
    run(b, Outcome.FAILURE)
    assert b.state is BreakerState.OPEN and not b.available() and b.try_acquire() is None


def test_timeouts_count_as_failures():
    b, _ = breaker()
    for _ in range(3):
        run(b, Outcome.TIMEOUT)  # a hung worker answers nothing; the caller's deadline reports it
    assert b.state is BreakerState.OPEN


def test_error_rate_over_the_window():
    b, clock = breaker()
    for outcome in [Outcome.SUCCESS, Outcome.FAILURE] * 2 + [Outcome.SUCCESS]:
        run(b, outcome)
        clock.t += 0.1
    assert b.state is BreakerState.CLOSED  # 2 of 5: below min_requests anyway
    run(b, Outcome.FAILURE)  # 3 of 6 = 50 %
    assert b.state is BreakerState.OPEN


def test_old_outcomes_leave_the_window():
    b, clock = breaker()
    for _ in range(2):
        run(b, Outcome.FAILURE)
        run(b, Outcome.SUCCESS)
    clock.t += 11  # those four are out of the 10 s window
    for outcome in [
        Outcome.SUCCESS,
        Outcome.SUCCESS,
        Outcome.FAILURE,
        Outcome.SUCCESS,
        Outcome.SUCCESS,
        Outcome.FAILURE,
    ]:
        run(b, outcome)
    assert b.state is BreakerState.CLOSED  # 2 of 6 in the window


def open_breaker() -> tuple[CircuitBreaker, FakeClock]:
    b, clock = breaker()
    for _ in range(3):
        run(b, Outcome.FAILURE)
    assert b.state is BreakerState.OPEN
    return b, clock


def test_half_open_lets_exactly_one_probe_through_and_success_closes():
    b, clock = open_breaker()
    clock.t += 4.9
    assert b.state is BreakerState.OPEN and not b.available() and b.try_acquire() is None  # 0.1 s of cooldown left
    clock.t += 0.1
    assert b.state is BreakerState.HALF_OPEN and b.available()
    probe = b.try_acquire()
    assert probe is not None and probe.probe
    assert b.try_acquire() is None and not b.available()  # one probe at a time
    b.record(probe, Outcome.SUCCESS)
    assert b.state is BreakerState.CLOSED and b.try_acquire() is not None


def test_a_failed_probe_reopens_with_a_doubled_cooldown_up_to_the_cap():
    b, clock = open_breaker()
    cooldowns = []
    for _ in range(4):
        opened = clock.t
        while b.state is BreakerState.OPEN:
            clock.t += 0.5
        cooldowns.append(clock.t - opened)
        b.record(b.try_acquire(), Outcome.FAILURE)
        assert b.state is BreakerState.OPEN
    assert cooldowns == [5.0, 10.0, 20.0, 20.0]
    while b.state is BreakerState.OPEN:
        clock.t += 0.5
    b.record(b.try_acquire(), Outcome.SUCCESS)
    for _ in range(3):  # closed again: the cool-down is back to its start
        run(b, Outcome.FAILURE)
    opened = clock.t
    while b.state is BreakerState.OPEN:
        clock.t += 0.5
    assert clock.t - opened == 5.0


def test_a_probe_that_never_answers_counts_as_failed():
    b, clock = open_breaker()
    clock.t += 5
    assert b.try_acquire() is not None  # the probe goes out and hangs
    clock.t += 7.9
    assert b.state is BreakerState.HALF_OPEN and not b.available()
    clock.t += 0.1
    assert b.state is BreakerState.OPEN  # probe_timeout_s passed: failure, cool-down doubled
    clock.t += 9.9
    assert b.state is BreakerState.OPEN
    clock.t += 0.1
    assert b.state is BreakerState.HALF_OPEN


def test_results_from_an_earlier_state_are_ignored():
    b, clock = breaker()
    slow = b.try_acquire()  # sent while closed, answers late
    for _ in range(3):
        run(b, Outcome.FAILURE)
    clock.t += 5
    assert b.state is BreakerState.HALF_OPEN
    b.record(slow, Outcome.SUCCESS)  # says nothing about the worker now
    assert b.state is BreakerState.HALF_OPEN and b.available()
    probe = b.try_acquire()
    late_failure_permit = probe
    b.record(probe, Outcome.SUCCESS)
    assert b.state is BreakerState.CLOSED
    b.record(late_failure_permit, Outcome.FAILURE)  # a duplicate report after recovery
    for _ in range(2):
        run(b, Outcome.FAILURE)
    assert b.state is BreakerState.CLOSED  # only 2 counted, not 3


def test_failed_health_checks_open_the_circuit():
    b, _ = breaker()
    for _ in range(3):
        b.record_health(False)
    assert b.state is BreakerState.OPEN
    b.record_health(True)
    assert b.state is BreakerState.OPEN  # recovery goes through the probe, not a health check
