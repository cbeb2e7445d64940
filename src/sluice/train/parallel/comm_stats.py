"""Bytes and seconds of gradient communication, counted where the collectives are issued."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class CommStats:
    bytes: int = 0  # payload this rank handed to collectives (compressed size when compressed)
    seconds: float = 0.0  # from issuing a collective to its completion, summed over buckets
    timed: bool = True  # False where only the bytes are known (FSDP2's collectives are internal)

    def take(self) -> tuple[int, float | None]:
        """This step's figures, and reset for the next."""
        out = (self.bytes, self.seconds if self.timed else None)
        self.bytes, self.seconds = 0, 0.0
        return out
