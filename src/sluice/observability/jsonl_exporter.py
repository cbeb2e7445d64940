"""The `file` trace exporter (tracing.py): every finished span as one JSON line, a debugging aid
and how the tests read the spans of both processes. Its own module so that the OpenTelemetry SDK
it subclasses is imported only when tracing is on."""

from __future__ import annotations

import json
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """A SpanExporter writing each span as one JSON line (names, ids, times, attributes, events)."""

    def __init__(self, path: str):
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for span in spans:
                ctx, parent = span.get_span_context(), span.parent
                if ctx is None:  # only a span built by hand lacks one; the SDK's finished spans have it
                    continue
                f.write(
                    json.dumps(
                        {
                            "name": span.name,
                            "service": span.resource.attributes.get("service.name"),
                            "trace_id": f"{ctx.trace_id:032x}",
                            "span_id": f"{ctx.span_id:016x}",
                            "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
                            "start_ns": span.start_time,
                            "end_ns": span.end_time,
                            "attributes": dict(span.attributes or {}),
                            "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
                            "status": span.status.status_code.name,
                        },
                        default=str,
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
