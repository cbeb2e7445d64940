"""Build the authenticator and the gateway from settings."""

from __future__ import annotations

import logging
from pathlib import Path

from sluice.config import Settings
from sluice.gateway.admission import AdmissionQueue
from sluice.gateway.authenticator import Authenticator, KeyStoreAuthenticator, OpenAccess, SingleKey
from sluice.gateway.coalescer import Coalescer
from sluice.gateway.gateway import Gateway
from sluice.gateway.key_store import SQLiteKeyStore
from sluice.gateway.limiter import make_limiter
from sluice.gateway.principal import Principal
from sluice.gateway.response_cache import ResponseCache
from sluice.gateway.tiers import load_tiers

log = logging.getLogger("sluice.gateway")


def key_store_path(settings: Settings) -> Path:
    return Path(settings.data_dir).expanduser() / "keys.db"


def build_authenticator(settings: Settings) -> tuple[Authenticator, str]:
    """The authenticator the settings ask for, and the mode it resolved to (`auto` decided)."""
    tiers = load_tiers(settings.tiers)
    if settings.default_tier not in tiers:
        raise ValueError(f"default_tier {settings.default_tier!r} is not a tier ({', '.join(tiers)})")
    tier = tiers[settings.default_tier]
    # the local principal (open or single-key mode): the default tier's band, no limits
    local = Principal(tenant="default", tier=tier.name, priority=tier.priority, queue_deadline_s=tier.queue_deadline_s)
    key = settings.api_key.get_secret_value() if settings.api_key else None
    single = SingleKey(key, local) if key else None
    path = key_store_path(settings)
    mode = settings.auth
    if mode == "auto":
        has_keys = path.exists() and SQLiteKeyStore(path).has_active_keys()
        mode = "keys" if has_keys else ("single" if single else "open")
    if mode == "keys":
        log.info("authentication: key store %s", path)
        auth = KeyStoreAuthenticator(
            SQLiteKeyStore(path), tiers, single, settings.default_tier, settings.key_cache_ttl_s
        )
        for key_id, key_tier in auth.keys_with_unknown_tiers():
            log.warning(
                "key %s has tier %r, which is not defined (%s): it is served as the default tier %r",
                key_id,
                key_tier,
                ", ".join(tiers),
                settings.default_tier,
            )
        return auth, mode
    if mode == "single":
        if single is None:
            raise ValueError("auth = 'single' needs an api_key")
        return single, mode
    return OpenAccess(), mode


def build_gateway(settings: Settings, engine_max_seqs: int, capacity_tokens: int) -> Gateway:
    admission = AdmissionQueue(
        max_inflight=settings.max_inflight or engine_max_seqs + 8,
        max_queued_tokens=settings.max_queued_tokens,
        aging_s=settings.aging_s,
        capacity_tokens=capacity_tokens,
    )
    limiter = make_limiter(settings.limits_store, settings.redis_url, settings.on_store_error)
    coalescer = Coalescer() if settings.enable_coalescing else None
    cache = (
        ResponseCache(settings.response_cache_ttl_s, settings.response_cache_entries)
        if settings.response_cache
        else None
    )
    return Gateway(admission, limiter, coalescer, cache)
