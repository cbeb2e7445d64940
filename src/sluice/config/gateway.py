"""Settings: the gateway (docs/GATEWAY.md) — keys and tiers, rate limits and their store, the
admission queue, coalescing and the response cache, Message Batches."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from sluice.config.stores import StoreFailMode, StoreKind


class GatewaySection(BaseModel):
    data_dir: str = "~/.local/share/sluice"  # the SQLite key store lives here (keys.db)
    # auto: the key store when it holds an active key (the single api_key still works), else the
    # single api_key if set, else open. open/single/keys force one mode.
    auth: Literal["auto", "open", "single", "keys"] = "auto"
    # a verified key is cached this long: revoking a key takes effect within this bound
    key_cache_ttl_s: float = Field(5.0, ge=0)
    tiers: dict[str, dict[str, Any]] = Field(default_factory=dict)  # [tiers.NAME] overrides
    default_tier: str = "standard"  # tier of the single-key / open principal (unlimited unless set)
    limits_store: StoreKind = StoreKind.MEMORY
    redis_url: str = "redis://127.0.0.1:6379/0"
    on_store_error: StoreFailMode = StoreFailMode.OPEN  # Redis down: admit (open) or 529 (closed)
    max_inflight: int | None = Field(None, ge=1)  # requests dispatched to the engine; default max_num_seqs + 8
    max_queued_tokens: int = Field(500_000, ge=1)  # admission queue bound (prompt + max_tokens)
    aging_s: float = Field(10.0, ge=0)  # a waiting request gains one band per aging_s
    enable_coalescing: bool = True
    coalesce_across_tenants: bool = False
    response_cache: bool = False
    response_cache_ttl_s: float = Field(300.0, gt=0)
    response_cache_entries: int = Field(1000, ge=1)
    # Message Batches (docs/GATEWAY.md): kept this long after they end, at most this many
    batch_retention_s: float = Field(86_400.0, gt=0)
    max_batches: int = Field(10_000, ge=1)
