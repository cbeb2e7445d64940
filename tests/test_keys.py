"""API keys: hashed at rest, constant-time checks, revoke/rotate, the CLI, never logged."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from sluice.gateway.authenticator import KeyStoreAuthenticator
from sluice.gateway.key_store import SQLiteKeyStore
from sluice.gateway.limits import Limits


def test_create_authenticate_revoke(tmp_path):
    store = SQLiteKeyStore(tmp_path / "keys.db")
    key, rec = store.create("acme", "free", Limits(rpm=7))
    auth = KeyStoreAuthenticator(store)

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
    return subprocess.run([sys.executable, "-m", "sluice.cli", "keys", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60)


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
