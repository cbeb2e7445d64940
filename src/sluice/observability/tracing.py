"""OpenTelemetry traces for each request, across the gateway and its workers.

Off by default (`trace_exporter = "none"`): the OpenTelemetry API's no-op tracer is then all the
code touches — creating a span costs a function call and an attribute set goes nowhere, so the
hot path pays nothing worth measuring. When on:
- `otlp`: spans are batched to an OTLP/HTTP collector (`otlp_endpoint`, e.g.
  http://collector:4318/v1/traces);
- `file`: every finished span is one JSON line in `<trace_file>.<service>.<pid>.jsonl` (a
  debugging aid, and how the tests read the spans of both processes).

The gateway's spans: the HTTP request, authentication, the routing plan (model, version, why),
L1, admission (time queued), the generation (tokens, worker, retries, migrations, TTFT). The
trace context travels to the worker in the gRPC call's metadata (W3C `traceparent`), so the
worker's span (queue time, prefill and decode time, tokens, preemptions) is a child in the same
trace. Log lines carry the current trace and span ids (logs.py). The helpers every layer uses to
make spans and carry the context are in the leaf module `sluice.trace_context`.
"""

from __future__ import annotations

import os

from opentelemetry import trace


def configure(exporter: str, service: str, otlp_endpoint: str | None = None, trace_file: str | None = None) -> None:
    """Install the tracer provider for this process (once, at start-up)."""
    if exporter == "none":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    # the SDK and this exporter are imported only when tracing is on (the off path costs nothing)
    from sluice.observability.jsonl_exporter import JsonLinesExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    elif exporter == "file":
        if not trace_file:
            raise ValueError("trace_exporter = 'file' needs trace_file")
        provider.add_span_processor(
            SimpleSpanProcessor(JsonLinesExporter(f"{trace_file}.{service}.{os.getpid()}.jsonl"))
        )
    else:
        raise ValueError(f"unknown trace_exporter {exporter!r}: none, otlp or file")
    trace.set_tracer_provider(provider)
