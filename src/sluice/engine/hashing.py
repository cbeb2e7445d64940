"""Chained block hashes for prefix caching.

H_i = sha256(H_{i-1} || token ids of block i || salt if i == 0). Each hash names the whole
prefix up to its block, so a lookup walks from the left and stops at the first miss. The salt
(the tenant's namespace unless sharing is configured) lives in the first block only, which is
enough to separate every chain. A cryptographic hash, not Python's hash(): a tenant who could
forge collisions could read another prefix's KV.
"""

from __future__ import annotations

import hashlib
import struct


def block_hash(parent: bytes | None, tokens: list[int] | tuple[int, ...], salt: str = "") -> bytes:
    h = hashlib.sha256()
    if parent is None:
        h.update(b"\x00root")
        h.update(salt.encode())
        h.update(b"\x00")
    else:
        h.update(parent)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


def extend_hashes(hashes: list[bytes], token_ids: list[int], block_size: int, salt: str) -> None:
    """Append hashes for every newly completed full block of `token_ids`."""
    full = len(token_ids) // block_size
    for i in range(len(hashes), full):
        parent = hashes[i - 1] if i else None
        hashes.append(block_hash(parent, token_ids[i * block_size : (i + 1) * block_size], salt))
