"""Idempotent retries: the per-request rules, the key stores (memory, Redis)."""
