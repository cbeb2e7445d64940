"""The request a piece of code is working for, as a context variable (a leaf anyone may import).

Set where a request enters a process — the HTTP middleware (`req_…`), the worker's Generate
handler (the generation id) — and inherited by every task started while serving it, so a log
line written anywhere below carries it without being passed around (observability/logs.py).
"""

from __future__ import annotations

import contextvars

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("sluice_request_id", default=None)
