"""Tiers: a priority band, default limits and a queue deadline per class of customer.

Built-in tiers can be changed and new ones added from the settings file:

    [tiers.standard]
    priority = 1
    rpm = 600
    itpm = 400000

(in the server settings file, top level or beside a `[server]` table).
The built-in numbers follow Anthropic's published tiers loosely (reference §9.1): free ≈ their
Tier 1, priority ≈ Tier 4; batch is the lowest band with a long queue deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sluice.gateway.limits import Limits


@dataclass(slots=True, frozen=True)
class Tier:
    name: str
    priority: int  # scheduling band: 0 is served first
    limits: Limits
    queue_deadline_s: float  # how long a request may wait in the admission queue


DEFAULT_TIERS: dict[str, Tier] = {
    "priority": Tier("priority", 0, Limits(rpm=4000, itpm=2_000_000, otpm=400_000, max_concurrent=64), 60.0),
    "standard": Tier("standard", 1, Limits(rpm=1000, itpm=400_000, otpm=80_000, max_concurrent=32), 30.0),
    "free": Tier("free", 2, Limits(rpm=50, itpm=30_000, otpm=8_000, max_concurrent=4), 10.0),
    "batch": Tier("batch", 3, Limits(rpm=1000, itpm=2_000_000, otpm=400_000, max_concurrent=64), 24 * 3600.0),
}

_LIMIT_KEYS = ("rpm", "itpm", "otpm", "max_concurrent")


def load_tiers(table: dict[str, Any] | None) -> dict[str, Tier]:
    """DEFAULT_TIERS overlaid with a `[tiers.NAME]` table from the settings file."""
    tiers = dict(DEFAULT_TIERS)
    for name, spec in (table or {}).items():
        unknown = set(spec) - {"priority", "queue_deadline_s", *_LIMIT_KEYS}
        if unknown:
            raise ValueError(f"tiers.{name}: unknown keys {sorted(unknown)}")
        for k in _LIMIT_KEYS:
            if k in spec and spec[k] is not None and (not isinstance(spec[k], int) or spec[k] < 1):
                raise ValueError(f"tiers.{name}.{k}: must be a positive integer")
        base = tiers.get(name, Tier(name, 1, Limits(), 30.0))
        limits = replace(base.limits, **{k: spec[k] for k in _LIMIT_KEYS if k in spec})
        tiers[name] = Tier(
            name,
            int(spec.get("priority", base.priority)),
            limits,
            float(spec.get("queue_deadline_s", base.queue_deadline_s)),
        )
    return tiers
