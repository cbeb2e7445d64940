"""A safety decision, and its log line (offsets and ids, never the text unless asked)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

log = logging.getLogger("sluice.safety")


@dataclass(slots=True, frozen=True)
class Verdict:
    layer: str  # L1 | L2 | L3 | L4
    category: str
    rule: str  # "literal:<n>", "regex:<n>", "classifier:<class>"
    start: int = -1  # offsets in the original text checked (-1 when not positional)
    end: int = -1
    score: float | None = None

    @property
    def code(self) -> str:
        return f"safety.{'input' if self.layer == 'L1' else 'output'}.{self.category}"


def log_verdict(v: Verdict, request_id: str, text: str | None = None, **extra: object) -> None:
    record = {"event": "safety_verdict", "request_id": request_id, **asdict(v), "code": v.code, **extra}
    if text is not None and v.start >= 0:
        record["text"] = text[v.start : v.end]
    log.warning(json.dumps(record, ensure_ascii=False))
