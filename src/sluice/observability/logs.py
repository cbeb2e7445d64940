"""Structured logs: one JSON object per line, with the request id and trace id of the request the
line belongs to.

Every sluice process logs through the standard `logging` module; `configure()` installs one
handler whose formatter writes `{"ts", "level", "logger", "msg", "request_id", "trace_id",
"span_id", …}`. The request id lives in a context variable set where a request enters (the HTTP
middleware; the worker's Generate handler, from gRPC metadata), so every line written while
serving it — in any layer, on any task that inherited the context — carries it without being
passed around. The trace ids come from the current OpenTelemetry span, when tracing is on.

What never reaches a log: prompt or reply text, API keys, Authorization headers. The code logs
ids, counts, timings and categories only (safety verdicts log offsets, not text, unless a policy
opts in with `log_text`); `tests/system/api/test_logs.py` checks a whole serve's output for a canary prompt
and key.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from sluice.request_context import request_id_var

# LogRecord attributes that are the record's own plumbing, not extra fields a caller passed
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _trace_ids() -> tuple[str | None, str | None]:
    try:
        from opentelemetry import trace
    except ImportError:  # tracing is optional
        return None, None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None, None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        trace_id, span_id = _trace_ids()
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id_var.get(),
            "trace_id": trace_id,
            "span_id": span_id,
        }
        out.update({k: v for k, v in vars(record).items() if k not in _RESERVED and k not in out})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """For a terminal: the classic line, with the request id when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None) or request_id_var.get()
        return f"{line} [{rid}]" if rid else line


def configure(level: str = "info", fmt: str = "json") -> None:
    """One stderr handler for the whole process (replaces earlier ones: uvicorn's included)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
