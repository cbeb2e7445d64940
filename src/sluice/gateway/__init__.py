"""Policy between the API and the engines: keys and tenants, rate limits, admission, coalescing.

No HTTP here; the API calls these pieces (see gateway.py for the per-request flow):
  keys.py, key_store.py      API keys (hashed at rest), KeyStore / SQLiteKeyStore / InMemoryKeyStore
  tiers.py, principal.py     tiers (band, limits, queue deadline) and the authenticated caller
  authenticator.py           presented key → Principal (open, single key, key store)
  token_bucket.py, limits.py bucket arithmetic, Limits, Decision
  limiter*.py                RateLimiter: memory and Redis (Lua) stores, fail-open/closed guard
  rate_limit_headers.py      anthropic-ratelimit-* and retry-after headers from a Decision
  admission.py               the bounded priority queue with late-bound dispatch (Overloaded)
  coalescer.py               singleflight for identical deterministic requests
  response_cache.py          optional exact-match reply cache
  gateway.py, factory.py     one request's path through all of it; construction from settings
"""
