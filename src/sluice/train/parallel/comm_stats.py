"""Bytes and seconds of gradient communication, counted where the collectives are issued."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class CommStats:
    bytes: int = 0  # payload this rank handed to collectives (compressed size when compressed)
    seconds: float = 0.0  # from issuing a collective to its completion, summed over buckets
    timed: bool = True  # False where only the bytes are known (FSDP2's collectives are internal)
    # perf_counter() of the last bucket's issue and of the last completion: the backward pass's
    # compute is over when its last bucket is issued, so what follows until the last collective
    # completes is communication the step waited for (not hidden behind compute)
    last_issued: float = 0.0
    last_done: float = 0.0

    def record(self, issued: float, done: float) -> None:
        self.seconds += done - issued
        self.last_issued = max(self.last_issued, issued)
        self.last_done = max(self.last_done, done)

    def take(self) -> tuple[int, float | None]:
        """This step's figures, and reset for the next."""
        out = (self.bytes, self.seconds if self.timed else None)
        self.bytes, self.seconds = 0, 0.0
        return out

    def last_wait(self) -> float:
        """Seconds from the last bucket's issue to the last completion so far (not reset)."""
        return max(0.0, self.last_done - self.last_issued) if self.last_issued else 0.0

    def take_wait(self) -> float:
        """Seconds from the last bucket's issue to the last completion in this step; resets."""
        wait = max(0.0, self.last_done - self.last_issued) if self.last_issued else 0.0
        self.last_issued = self.last_done = 0.0
        return wait
