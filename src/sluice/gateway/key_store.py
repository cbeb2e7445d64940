"""API keys: created once, stored only as a SHA-256 hash, checked in constant time.

A key is `sk-sluice-` + 43 url-safe characters (256 random bits). The store keeps its hash, a
public `key_id` (`key_…`, shown in lists and logs), a short non-secret hint (the first 14
characters) and the key's tenant, tier and optional limit overrides. A plain SHA-256 is the
right hash here: the secret is 256 random bits, so there is nothing to brute-force, and the
lookup stays fast. Authentication finds the row by hash index and confirms it with
`hmac.compare_digest`. `SQLiteKeyStore` is the default (WAL, safe for several processes);
`KeyStore` is the interface for others.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sluice.gateway.limits import Limits

KEY_PREFIX = "sk-sluice-"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    tenant TEXT NOT NULL,
    tier TEXT NOT NULL,
    rpm INTEGER, itpm INTEGER, otpm INTEGER, max_concurrent INTEGER,
    created_at REAL NOT NULL,
    revoked_at REAL
)
"""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(slots=True, frozen=True)
class KeyRecord:
    key_id: str
    tenant: str
    tier: str
    overrides: Limits
    hint: str
    created_at: float
    revoked_at: float | None = None


class KeyStore(Protocol):
    def create(self, tenant: str, tier: str, overrides: Limits = Limits()) -> tuple[str, KeyRecord]: ...
    def lookup(self, key: str) -> KeyRecord | None: ...
    def list(self) -> list[KeyRecord]: ...
    def revoke(self, key_id: str) -> bool: ...
    def rotate(self, key_id: str) -> tuple[str, KeyRecord]: ...
    def has_active_keys(self) -> bool: ...


class SQLiteKeyStore:
    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        try:
            self.path.chmod(0o600)  # hashes only, but nobody else needs to read them
        except OSError:
            pass

    def create(self, tenant: str, tier: str, overrides: Limits = Limits()) -> tuple[str, KeyRecord]:
        if not tenant or not tier:
            raise ValueError("a key needs a tenant and a tier")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        rec = KeyRecord("key_" + secrets.token_hex(6), tenant, tier, overrides, key[:14], time.time())
        o = overrides
        self._db.execute(
            "INSERT INTO api_keys VALUES (?,?,?,?,?,?,?,?,?,?,NULL)",
            (rec.key_id, hash_key(key), rec.hint, tenant, tier, o.rpm, o.itpm, o.otpm, o.max_concurrent, rec.created_at),
        )
        return key, rec

    def lookup(self, key: str) -> KeyRecord | None:
        digest = hash_key(key)
        row = self._db.execute("SELECT * FROM api_keys WHERE key_hash = ?", (digest,)).fetchone()
        if row is None or not hmac.compare_digest(row[1], digest) or row[10] is not None:
            return None
        return _record(row)

    def list(self) -> list[KeyRecord]:
        return [_record(r) for r in self._db.execute("SELECT * FROM api_keys ORDER BY created_at").fetchall()]

    def revoke(self, key_id: str) -> bool:
        cur = self._db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (time.time(), key_id))
        return cur.rowcount == 1

    def rotate(self, key_id: str) -> tuple[str, KeyRecord]:
        """A new key with the same tenant, tier and overrides; the old one is revoked."""
        old = next((r for r in self.list() if r.key_id == key_id), None)
        if old is None or old.revoked_at is not None:
            raise KeyError(f"no active key {key_id}")
        key, rec = self.create(old.tenant, old.tier, old.overrides)
        self.revoke(key_id)
        return key, rec

    def has_active_keys(self) -> bool:
        return self._db.execute("SELECT 1 FROM api_keys WHERE revoked_at IS NULL LIMIT 1").fetchone() is not None

    def close(self) -> None:
        self._db.close()


def _record(row: tuple) -> KeyRecord:
    return KeyRecord(row[0], row[3], row[4], Limits(row[5], row[6], row[7], row[8]), row[2], row[9], row[10])
