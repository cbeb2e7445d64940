"""Public ids in Anthropic's style: a prefix and 24 base62 characters (`msg_01…`, `req_01…`)."""

from __future__ import annotations

import secrets
import string

_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase


def new_id(prefix: str) -> str:
    # "01" first like Anthropic's ids; 22 random base62 characters carry ~131 bits.
    return f"{prefix}_01" + "".join(secrets.choice(_ALPHABET) for _ in range(22))
