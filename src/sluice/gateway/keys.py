"""What an API key looks like, and the only forms of it that may be stored or shown.

A key is `sk-sluice-` + 43 url-safe characters (32 random bytes, 256 bits). Stores keep its
SHA-256 (a plain hash is the right tool here: the secret is 256 random bits, so there is nothing
to brute-force, and lookup by hash index stays one B-tree probe) and a short non-secret hint —
the prefix plus 4 random characters — to help people tell their keys apart in lists. The
plaintext exists only in the return value of `new_key()`; nothing here logs.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "sk-sluice-"
KEY_RANDOM_BYTES = 32
HINT_CHARS = len(KEY_PREFIX) + 4  # "sk-sluice-AbCd": enough to tell keys apart, 24 bits at most


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def new_key_id() -> str:
    """The public name of a key (lists, logs, `revoke KEY_ID`); unrelated to the secret."""
    return "key_" + secrets.token_hex(6)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_hint(key: str) -> str:
    return key[:HINT_CHARS]


def same_hash(stored: str, presented_hash: str) -> bool:
    """Constant-time confirmation after the index lookup: the final yes never depends on where
    two hashes first differ."""
    return hmac.compare_digest(stored.encode(), presented_hash.encode())
