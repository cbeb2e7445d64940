"""The circuit breaker's numbers (`[routing.breaker]` in the fleet file): here, beside the fleet
file's schema that carries them, so the file's layer does not import the breaker itself
(dispatch/circuit_breaker.py, which applies them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class BreakerConfig:
    consecutive_failures: int = 5
    error_rate: float = 0.5
    window_s: float = 30.0
    min_requests: int = 10
    cooldown_s: float = 5.0
    max_cooldown_s: float = 60.0
    probe_timeout_s: float = 30.0
