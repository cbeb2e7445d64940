"""Settings: the gateway (docs/GATEWAY.md) — keys and tiers, rate limits and their store, the
admission queue, coalescing and the response cache, Message Batches."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sluice.config.section import Section
from sluice.config.stores import StoreFailMode, StoreKind


class GatewaySection(Section):
    data_dir: str = "~/.local/share/sluice"
    """where the SQLite key store lives (keys.db)"""
    auth: Literal["auto", "open", "single", "keys"] = "auto"
    """auto: the key store when it holds an active key (the single api_key still works), else the
    single api_key if set, else open; open, single and keys force one mode"""
    key_cache_ttl_s: float = Field(5.0, ge=0)
    """how long a verified key is cached: revoking a key takes effect within this bound"""
    tiers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """[tiers.NAME] overrides of the built-in tiers"""
    default_tier: str = "standard"
    """the tier of the single-key or open principal (unlimited unless set)"""
    limits_store: StoreKind = StoreKind.MEMORY
    """where rate-limit counters live: memory (one gateway process) or redis (every replica)"""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """the Redis of every store set to redis"""
    on_store_error: StoreFailMode = StoreFailMode.OPEN
    """Redis down: admit (open) or answer 529 (closed)"""
    max_inflight: int | None = Field(None, ge=1)
    """requests dispatched to the engine at once (default: max_num_seqs + 8)"""
    max_queued_tokens: int = Field(500_000, ge=1)
    """the admission queue's bound, in prompt + max_tokens tokens"""
    aging_s: float = Field(10.0, ge=0)
    """a waiting request gains one priority band per aging_s"""
    enable_coalescing: bool = True
    """identical deterministic requests in flight at once share one generation"""
    coalesce_across_tenants: bool = False
    """coalesce identical requests of different tenants too"""
    response_cache: bool = False
    """keep finished deterministic replies and answer a repeat from them"""
    response_cache_ttl_s: float = Field(300.0, gt=0)
    """how long a cached response answers"""
    response_cache_entries: int = Field(1000, ge=1)
    """the response cache's size, in responses"""
    # Message Batches (docs/GATEWAY.md)
    batch_retention_s: float = Field(86_400.0, gt=0)
    """how long a message batch is kept after it ends"""
    max_batches: int = Field(10_000, ge=1)
    """message batches kept at most"""
