"""Tracing helpers any layer may use (a leaf): the tracer, and the trace context in gRPC metadata.

Without a configured tracer provider (observability/tracing.py: off by default) these are the
OpenTelemetry API's no-ops, so code can make spans unconditionally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import propagate, trace

TRACER_NAME = "sluice"


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def inject_metadata(span: trace.Span | None = None) -> list[tuple[str, str]]:
    """The trace context of `span` (default: the current one) as gRPC metadata; empty when
    tracing is off."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span) if span is not None else None)
    return list(carrier.items())


def extract_context(metadata: Sequence[tuple[str, str | bytes]] | None) -> Any:
    """The caller's trace context from gRPC metadata (a context to start a child span in)."""
    carrier = {k: v.decode() if isinstance(v, bytes) else v for k, v in (metadata or ())}
    return propagate.extract(carrier)
