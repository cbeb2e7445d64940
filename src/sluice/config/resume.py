"""Settings: what lets a client come back — stream resume and idempotent retries (docs/API.md)."""

from __future__ import annotations

from pydantic import Field, model_validator

from sluice.config.section import Section
from sluice.config.stores import StoreKind


class ResumeSection(Section):
    # -- stream resume ---------------------------------------------------------------------------
    replay_store: StoreKind = StoreKind.MEMORY
    """where streams' replay logs live: memory (this process) or redis (resume through any replica)"""
    replay_ttl_s: float = Field(600.0, gt=0)
    """how long a finished stream can be resumed"""
    replay_max_bytes: int = Field(1 << 20, ge=4096)
    """a stream's replay log at most, in bytes (memory store)"""

    # -- idempotent retries (Idempotency-Key) --------------------------------------------------
    idempotency_store: StoreKind = StoreKind.MEMORY
    """where Idempotency-Key replies live: memory (one gateway process) or redis (redis_url: every
    replica shares the keys)"""
    # how long a completed reply answers retries of its key. An hour: the SDKs retry within
    # seconds, a job runner resubmits after a crash within minutes; LLM replies are large, so
    # 24 h (Stripe's) would hold a day of replies in Redis. Raise it where retries come later.
    idempotency_ttl_s: float = Field(3600.0, gt=0)
    """how long a completed reply answers retries of its key"""

    @model_validator(mode="after")
    def _retries_follow_streams_everywhere(self) -> ResumeSection:
        # a retry of a keyed stream follows the first attempt's replay log: with keys shared
        # across replicas, the log must be too, or a retry on another replica finds nothing
        if self.idempotency_store is StoreKind.REDIS and self.replay_store is not StoreKind.REDIS:
            raise ValueError(
                "idempotency_store = 'redis' needs replay_store = 'redis' (a retried stream is "
                "followed through the replay log, from any replica)"
            )
        return self
