"""When to restart a worker that died, and when to give up.

Exponential backoff (1 s, 2 s, 4 s … capped) so a worker that crashes at start does not spin,
and a bound (`max_restarts` exits within `window_s`) after which the supervisor gives up: a
process that keeps dying will not get better by itself, and exiting non-zero hands the problem
to whatever supervises *us* (systemd, Kubernetes), which can reschedule or alert. Exits older
than the window are forgotten, so a worker that dies once a day is restarted forever.
Pure and clock-injected, so the policy is tested without processes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class RestartPolicy:
    max_restarts: int = 5  # restarts allowed within window_s; one more exit gives up
    window_s: float = 600.0
    base_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    _exits: deque[float] = field(default_factory=deque)

    def on_exit(self, now: float) -> float | None:
        """Record an exit at `now`; the delay before the restart, or None to give up."""
        self._exits.append(now)
        while self._exits and self._exits[0] < now - self.window_s:
            self._exits.popleft()
        n = len(self._exits)  # exits within the window, this one included
        if n > self.max_restarts:
            return None
        return min(self.max_backoff_s, self.base_backoff_s * 2 ** (n - 1))

    @property
    def recent_exits(self) -> int:
        return len(self._exits)
