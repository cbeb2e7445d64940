"""Settings: logs and traces (docs/OBSERVABILITY.md); `sluice serve` hands them on to its
local workers through the environment."""

from __future__ import annotations

from typing import Literal

from sluice.config.section import Section


class ObservabilitySection(Section):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """the least severe log records written"""
    log_format: Literal["json", "text"] = "json"
    """json: one object per line with request and trace ids (observability/logs.py); text: for a
    terminal"""
    trace_exporter: Literal["none", "otlp", "file"] = "none"
    """OpenTelemetry traces (observability/tracing.py): none (off, no cost), otlp or file"""
    otlp_endpoint: str | None = None
    """e.g. http://collector:4318/v1/traces (default: the SDK's)"""
    trace_file: str | None = None
    """file exporter: spans go to <trace_file>.<service>.<pid>.jsonl"""
    gaie_metrics: bool = False
    """/metrics also under the names the Gateway API Inference Extension reads
    (vllm:num_requests_waiting, vllm:kv_cache_usage_perc, vllm:lora_requests_info; docs/LORA.md)"""
