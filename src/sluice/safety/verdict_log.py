"""Every verdict as one structured log line: layer, category, rule, offsets, timings — and the
matched text only when the policy sets log_text (off by default: logs must not become a copy of
users' prompts or of the banned content itself)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

from sluice.safety.verdict import Verdict

log = logging.getLogger("sluice.safety")


def log_verdict(v: Verdict, request_id: str, text: str | None = None, **extra: object) -> dict[str, Any]:
    """Log `v`; `text` is the checked text and is logged (the matched span only)
    only when given — callers pass it only when their policy's log_text is true. Returns the
    record (tests and metrics read it)."""
    record: dict[str, Any] = {"event": "safety_verdict", "request_id": request_id}
    record.update(asdict(v))
    record["code"] = v.code
    record.update(extra)
    if text is not None and v.start >= 0:
        record["text"] = text[v.start : v.end]
    log.warning(json.dumps(record, ensure_ascii=False, default=str))
    return record
