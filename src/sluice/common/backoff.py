"""When to restart a supervised child process that exited, and when to give up: one policy for
serving's spawned workers (worker/supervisor.py) and search's local shard replicas
(search/router/replication/supervisor.py).

Exponential back-off (base, 2×base, 4×base … capped) counted over the exits within a window,
so a child that crashes at start does not spin, while one that dies once in a long while is
restarted after the base delay: exits older than the window are forgotten. With a bound
(`max_restarts` exits within the window), one more exit gives up: a process that keeps dying
will not get better by itself, and exiting non-zero hands the problem to whatever supervises the
supervisor (systemd, Kubernetes), which can reschedule or alert. Without one it never gives up.
Pure and clock-injected, so the policy is tested without processes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class RestartBackoff:
    max_restarts: int | None = 5  # restarts allowed within window_s; one more exit gives up (None: never)
    window_s: float = 600.0
    base_s: float = 1.0
    max_s: float = 30.0
    _exits: deque[float] = field(default_factory=deque)

    def on_exit(self, now: float) -> float | None:
        """Record an exit at `now`; the delay before the restart, or None to give up."""
        self._exits.append(now)
        while self._exits and self._exits[0] < now - self.window_s:
            self._exits.popleft()
        n = len(self._exits)  # exits within the window, this one included
        if self.max_restarts is not None and n > self.max_restarts:
            return None
        return min(self.max_s, self.base_s * 2 ** (n - 1))

    @property
    def recent_exits(self) -> int:
        return len(self._exits)
