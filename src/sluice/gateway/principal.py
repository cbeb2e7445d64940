"""Who is calling, as every layer below authentication sees it."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.gateway.limits import Limits


@dataclass(slots=True, frozen=True)
class Principal:
    tenant: str = "default"
    tier: str = "standard"
    key_id: str = ""  # the public id of the key used ("" in open / single-key mode)
    priority: int = 1  # the tier's band: lower is served first
    limits: Limits | None = None  # None = unlimited
    queue_deadline_s: float = 30.0

    @property
    def limit_key(self) -> str:
        """Rate limits are per key (a tenant's keys may carry different limits)."""
        return self.key_id or f"tenant:{self.tenant}"
