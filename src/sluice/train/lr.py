"""The learning rate of a step: a pure function, so a resumed run needs no scheduler state."""

from __future__ import annotations

import math

from sluice.train.settings import LrSchedule

MIN_RATIO = 0.1  # cosine decays to 10 % of the peak


def lr_at(step: int, peak: float, warmup: int, total: int, schedule: LrSchedule) -> float:
    """Learning rate for optimizer step `step` (1-based)."""
    if warmup and step <= warmup:
        return peak * step / warmup
    if schedule is LrSchedule.CONSTANT:
        return peak
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return peak * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))
