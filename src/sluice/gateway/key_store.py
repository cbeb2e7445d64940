"""Key stores: API key records by hash — the `KeyStore` interface, SQLite (default) and memory.

Only `hash_key(key)` is stored (see keys.py). `lookup` finds the row by its hash index and
confirms it with a constant-time compare; the plaintext is returned once, by `create`/`rotate`,
and never stored or logged.

Revocation is a timestamp: `revoked_at <= now` means dead. `rotate(key_id, grace_s)` issues a
new key and sets the old one's `revoked_at` `grace_s` in the future, so clients can switch over
without an outage; `revoke` always takes effect at once (also on a key in its grace period).

`SQLiteKeyStore` is a file under the data directory in WAL mode: readers never wait for a
writer, so `sluice keys create` in one process and several gateway processes reading the same
file work together; each statement is its own transaction (autocommit).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from sluice.gateway.keys import KEY_PREFIX, hash_key, key_hint, new_key, new_key_id, same_hash
from sluice.gateway.limits import Limits

__all__ = ["KEY_PREFIX", "InMemoryKeyStore", "KeyRecord", "KeyStore", "SQLiteKeyStore", "hash_key"]

Clock = Callable[[], float]

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
_COLUMNS = "key_id, key_hash, hint, tenant, tier, rpm, itpm, otpm, max_concurrent, created_at, revoked_at"


@dataclass(slots=True, frozen=True)
class KeyRecord:
    """Everything about a key except the key. Safe to print and log."""

    key_id: str
    tenant: str
    tier: str
    overrides: Limits  # None fields fall back to the tier's limits
    hint: str  # the first few characters only
    created_at: float  # unix time
    revoked_at: float | None = None  # unix time; may be in the future during a rotation grace

    def active(self, now: float) -> bool:
        return self.revoked_at is None or self.revoked_at > now


class KeyStore(Protocol):
    """Where key records live. Implementations must never persist the plaintext key."""

    def create(self, tenant: str, tier: str, overrides: Limits = Limits()) -> tuple[str, KeyRecord]:
        """A new key: (plaintext — shown to the user once, record)."""
        ...

    def lookup(self, key: str) -> KeyRecord | None:
        """The record of an active key, or None (unknown, revoked, malformed)."""
        ...

    def list(self) -> list[KeyRecord]: ...

    def revoke(self, key_id: str) -> bool:
        """Revoke now; False when there is no active key with that id."""
        ...

    def rotate(self, key_id: str, grace_s: float = 0.0) -> tuple[str, KeyRecord]:
        """A new key with the same tenant, tier and overrides; the old one dies after grace_s.
        Raises KeyError when key_id is not an active key."""
        ...

    def has_active_keys(self) -> bool: ...


def _check(tenant: str, tier: str) -> None:
    if not tenant or not tier:
        raise ValueError("a key needs a tenant and a tier")


class InMemoryKeyStore:
    """For tests and embedding: same semantics as SQLite, gone with the process."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._by_hash: dict[str, str] = {}  # hash -> key_id
        self._records: dict[str, tuple[str, KeyRecord]] = {}  # key_id -> (hash, record)
        self._lock = threading.Lock()

    def create(self, tenant: str, tier: str, overrides: Limits = Limits()) -> tuple[str, KeyRecord]:
        _check(tenant, tier)
        key = new_key()
        rec = KeyRecord(new_key_id(), tenant, tier, overrides, key_hint(key), self._clock())
        digest = hash_key(key)
        with self._lock:
            self._by_hash[digest] = rec.key_id
            self._records[rec.key_id] = (digest, rec)
        return key, rec

    def lookup(self, key: str) -> KeyRecord | None:
        digest = hash_key(key)
        with self._lock:
            key_id = self._by_hash.get(digest)
            stored, rec = self._records[key_id] if key_id is not None else ("", None)
        if rec is None or not same_hash(stored, digest) or not rec.active(self._clock()):
            return None
        return rec

    def list(self) -> list[KeyRecord]:
        with self._lock:
            return sorted((r for _, r in self._records.values()), key=lambda r: r.created_at)

    def revoke(self, key_id: str) -> bool:
        return self._set_revoked(key_id, self._clock())

    def _set_revoked(self, key_id: str, at: float) -> bool:
        with self._lock:
            item = self._records.get(key_id)
            if item is None or not item[1].active(self._clock()):
                return False
            self._records[key_id] = (item[0], replace(item[1], revoked_at=at))
            return True

    def rotate(self, key_id: str, grace_s: float = 0.0) -> tuple[str, KeyRecord]:
        old = self._records.get(key_id)
        if old is None or not old[1].active(self._clock()):
            raise KeyError(f"no active key {key_id}")
        key, rec = self.create(old[1].tenant, old[1].tier, old[1].overrides)
        self._set_revoked(key_id, self._clock() + max(0.0, grace_s))
        return key, rec

    def has_active_keys(self) -> bool:
        now = self._clock()
        with self._lock:
            return any(r.active(now) for _, r in self._records.values())


class SQLiteKeyStore:
    def __init__(self, path: str | Path, clock: Clock = time.time):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        # One connection shared by the event loop and any worker threads: the lock serialises
        # its use (sqlite3 connections are not safe for concurrent use from threads).
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=5.0)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute(_SCHEMA)
        try:
            self.path.chmod(0o600)  # hashes only, but nobody else needs to read them
        except OSError:
            pass

    def _exec(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, params)

    def create(self, tenant: str, tier: str, overrides: Limits = Limits()) -> tuple[str, KeyRecord]:
        _check(tenant, tier)
        key = new_key()
        rec = KeyRecord(new_key_id(), tenant, tier, overrides, key_hint(key), self._clock())
        o = overrides
        self._exec(
            f"INSERT INTO api_keys ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,NULL)",
            (
                rec.key_id,
                hash_key(key),
                rec.hint,
                tenant,
                tier,
                o.rpm,
                o.itpm,
                o.otpm,
                o.max_concurrent,
                rec.created_at,
            ),
        )
        return key, rec

    def lookup(self, key: str) -> KeyRecord | None:
        digest = hash_key(key)
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_hash = ?", (digest,)).fetchone()
        if row is None or not same_hash(row[1], digest):
            return None
        rec = _record(row)
        return rec if rec.active(self._clock()) else None

    def get(self, key_id: str) -> KeyRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else _record(row)

    def list(self) -> list[KeyRecord]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at").fetchall()
        return [_record(r) for r in rows]

    def revoke(self, key_id: str) -> bool:
        return self._set_revoked(key_id, self._clock())

    def _set_revoked(self, key_id: str, at: float) -> bool:
        now = self._clock()
        cur = self._exec(
            "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND (revoked_at IS NULL OR revoked_at > ?)",
            (at, key_id, now),
        )
        return cur.rowcount == 1

    def rotate(self, key_id: str, grace_s: float = 0.0) -> tuple[str, KeyRecord]:
        old = self.get(key_id)
        if old is None or not old.active(self._clock()):
            raise KeyError(f"no active key {key_id}")
        key, rec = self.create(old.tenant, old.tier, old.overrides)
        self._set_revoked(key_id, self._clock() + max(0.0, grace_s))
        return key, rec

    def has_active_keys(self) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM api_keys WHERE revoked_at IS NULL OR revoked_at > ? LIMIT 1", (self._clock(),)
            ).fetchone()
        return row is not None

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _record(row: tuple) -> KeyRecord:
    return KeyRecord(row[0], row[3], row[4], Limits(row[5], row[6], row[7], row[8]), row[2], row[9], row[10])
