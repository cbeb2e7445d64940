"""API keys: hashed at rest, constant-time checks, revoke/rotate, the CLI, never logged."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time

import pytest

from sluice.config import load_settings
from sluice.gateway.authenticator import KeyStoreAuthenticator
from sluice.gateway.key_store import KEY_PREFIX, InMemoryKeyStore, SQLiteKeyStore
from sluice.gateway.limits import Limits
from sluice.gateway.tiers import DEFAULT_TIERS, load_tiers


def test_create_authenticate_revoke(tmp_path):
    store = SQLiteKeyStore(tmp_path / "keys.db")
    key, rec = store.create("acme", "free", Limits(rpm=7))
    auth = KeyStoreAuthenticator(store, cache_ttl_s=0)  # no cache: revocation on the next request

    def principal(k: str):
        return asyncio.run(auth.authenticate(k))

    p = principal(key)
    assert p.tenant == "acme" and p.tier == "free" and p.key_id == rec.key_id
    assert p.limits.rpm == 7 and p.limits.itpm == 30_000  # the key's override over the tier's default
    assert p.priority == 2
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")  # same length, one character off
    assert principal(wrong) is None and principal("") is None
    assert store.revoke(rec.key_id) and principal(key) is None
    assert not store.revoke(rec.key_id)  # already revoked
    raw = (tmp_path / "keys.db").read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("keys.db-*"))
    assert key.encode() not in raw and key[14:].encode() not in raw  # no plaintext at rest


def test_rotate(tmp_path):
    store = SQLiteKeyStore(tmp_path / "keys.db")
    old, rec = store.create("acme", "standard", Limits(otpm=99))
    new, new_rec = store.rotate(rec.key_id)
    assert store.lookup(old) is None
    got = store.lookup(new)
    assert got is not None and got.tenant == "acme" and got.overrides.otpm == 99 and new_rec.key_id != rec.key_id


def _cli(*args: str, data_dir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "keys", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_create_list_revoke_rotate(tmp_path):
    created = _cli("create", "--tenant", "acme", "--tier", "priority", "--rpm", "10", data_dir=tmp_path)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("sk-sluice-") and "key_id: key_" in created.stderr
    key_id = created.stderr.split("key_id: ")[1].split()[0]
    listed = _cli("list", data_dir=tmp_path)
    assert key_id in listed.stdout and "acme" in listed.stdout and key not in listed.stdout
    rotated = _cli("rotate", key_id, data_dir=tmp_path)
    assert rotated.returncode == 0 and rotated.stdout.strip().startswith("sk-sluice-")
    assert "revoked" in _cli("list", data_dir=tmp_path).stdout
    assert _cli("revoke", key_id, data_dir=tmp_path).returncode == 2  # already revoked by the rotation
    bad = _cli("create", "--tenant", "acme", "--tier", "platinum", data_dir=tmp_path)
    assert bad.returncode == 2 and "unknown tier" in bad.stderr


@pytest.fixture(params=["sqlite", "memory"])
def make_store(request, tmp_path):
    def make(clock=time.time):
        if request.param == "sqlite":
            return SQLiteKeyStore(tmp_path / "keys.db", clock=clock)
        return InMemoryKeyStore(clock=clock)

    return make


def test_both_stores_share_the_semantics(make_store):
    now = [1000.0]
    store = make_store(lambda: now[0])
    assert not store.has_active_keys()
    key, rec = store.create("acme", "standard", Limits(rpm=3))
    assert key.startswith(KEY_PREFIX) and len(key) >= len(KEY_PREFIX) + 43
    assert rec.hint == key[: len(rec.hint)] and len(rec.hint) <= len(KEY_PREFIX) + 4 and rec.key_id not in key
    assert store.lookup(key) == rec and store.has_active_keys()
    assert store.lookup(key[:-1] + ("x" if key[-1] != "x" else "y")) is None
    assert store.lookup(key + "x") is None and store.lookup("") is None and store.lookup(key.upper()) is None
    # rotation with a grace period: both keys work until it ends, then only the new one
    new, new_rec = store.rotate(rec.key_id, grace_s=60)
    assert store.lookup(key) is not None and store.lookup(new) == new_rec
    now[0] += 61
    assert store.lookup(key) is None and store.lookup(new) == new_rec
    with pytest.raises(KeyError):
        store.rotate(rec.key_id)  # the old key is dead
    # revoke during a grace period takes effect at once
    newer, _ = store.rotate(new_rec.key_id, grace_s=60)
    assert store.revoke(new_rec.key_id) and store.lookup(new) is None and store.lookup(newer) is not None
    assert [r.key_id for r in store.list()][:2] == [rec.key_id, new_rec.key_id]
    with pytest.raises(ValueError):
        store.create("", "free")


def test_two_store_instances_on_one_file_see_each_other(tmp_path):
    """What several gateway processes and the CLI do: separate connections, one WAL file."""
    a, b = SQLiteKeyStore(tmp_path / "keys.db"), SQLiteKeyStore(tmp_path / "keys.db")
    key, rec = a.create("acme", "free")
    assert b.lookup(key) == rec
    assert a.revoke(rec.key_id) and b.lookup(key) is None


def test_keys_never_reach_the_logs(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, every level
    store = SQLiteKeyStore(tmp_path / "keys.db")
    auth = KeyStoreAuthenticator(store)
    key, rec = store.create("acme", "free")
    wrong = key[:-2] + "zz"

    async def use() -> None:
        assert (await auth.authenticate(key)) is not None
        assert (await auth.authenticate(wrong)) is None

    asyncio.run(use())
    new, _ = store.rotate(rec.key_id)
    store.revoke(rec.key_id)
    text = caplog.text + "".join(repr(r.args) for r in caplog.records)
    for secret in (key, wrong, new, key[len(rec.hint) :]):
        assert secret not in text
    assert key not in repr(rec) and key not in repr(store.list())


@pytest.mark.parametrize("server_table", [False, True], ids=["top-level", "with-server-table"])
def test_tiers_from_a_toml_settings_file(tmp_path, server_table):
    """Tiers apply from a settings file with or without a `[server]` table beside them (a file with
    `[server]` used to drop top-level `[tiers.*]` silently)."""
    path = tmp_path / "sluice.toml"
    head = "[server]\nport = 9001\n" if server_table else ""
    path.write_text(head + "[tiers.standard]\nrpm = 7\n[tiers.gold]\npriority = 0\nrpm = 100\nqueue_deadline_s = 5\n")
    settings = load_settings(path)
    assert settings.port == (9001 if server_table else 8000)
    tiers = load_tiers(settings.tiers)
    assert tiers["standard"].limits.rpm == 7 and tiers["standard"].limits.itpm == DEFAULT_TIERS["standard"].limits.itpm
    assert (
        tiers["gold"].priority == 0 and tiers["gold"].queue_deadline_s == 5 and tiers["free"] == DEFAULT_TIERS["free"]
    )
    assert [t.priority for t in (DEFAULT_TIERS[n] for n in ("priority", "standard", "free", "batch"))] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="unknown"):
        load_tiers({"standard": {"rpn": 5}})
    with pytest.raises(ValueError, match="positive"):
        load_tiers({"standard": {"rpm": 0}})
    # the CLI takes its tier names from the same file
    created = _cli("create", "--tenant", "acme", "--tier", "gold", "--config", str(path), data_dir=tmp_path)
    assert created.returncode == 0 and created.stdout.startswith(KEY_PREFIX), created.stderr
    assert _cli("create", "--tenant", "acme", "--tier", "gold", data_dir=tmp_path).returncode == 2


def test_a_key_with_an_undefined_tier_is_warned_about_and_served_in_the_default_tier(tmp_path, caplog):
    from sluice.gateway.factory import build_authenticator

    store = SQLiteKeyStore(tmp_path / "keys.db")
    key, rec = store.create("acme", "nosuchtier", Limits())
    settings = load_settings(None, data_dir=str(tmp_path), default_tier="free")
    with caplog.at_level(logging.WARNING, logger="sluice.gateway"):
        auth, mode = build_authenticator(settings)
    assert mode == "keys"
    assert rec.key_id in caplog.text and "nosuchtier" in caplog.text and key not in caplog.text
    principal = asyncio.run(auth.authenticate(key))
    assert principal is not None and principal.tier == "free"


def test_a_revoked_key_stops_working_within_the_cache_ttl(tmp_path):
    """Verified keys are cached `cache_ttl_s` (injected clock); revocation takes effect within
    that bound, and an unknown key is never cached (a new key works at once)."""
    now = [1000.0]
    store = SQLiteKeyStore(tmp_path / "keys.db")
    key, rec = store.create("acme", "standard", Limits())
    auth = KeyStoreAuthenticator(store, cache_ttl_s=5.0, clock=lambda: now[0])

    async def who(k: str):
        return await auth.authenticate(k)

    assert asyncio.run(who(key)).tenant == "acme"
    store.revoke(rec.key_id)
    now[0] += 4.9
    assert asyncio.run(who(key)) is not None  # still cached: within the documented bound
    now[0] += 0.2
    assert asyncio.run(who(key)) is None  # past it: the store says revoked
    fresh, _ = store.create("acme", "standard", Limits())
    assert asyncio.run(who(fresh)) is not None
    uncached = KeyStoreAuthenticator(store, cache_ttl_s=0)
    key2, rec2 = store.create("beta", "standard", Limits())
    assert asyncio.run(uncached.authenticate(key2)) is not None
    store.revoke(rec2.key_id)
    assert asyncio.run(uncached.authenticate(key2)) is None  # no cache: the next request
