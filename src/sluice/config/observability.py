"""Settings: logs and traces (docs/OBSERVABILITY.md); `sluice serve` hands them on to its
local workers through the environment."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ObservabilitySection(BaseModel):
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # json: one JSON object per line with request id and trace id (observability/logs.py);
    # text: the classic line, for a terminal
    log_format: Literal["json", "text"] = "json"
    # OpenTelemetry traces (observability/tracing.py): none (off, no cost) | otlp | file
    trace_exporter: Literal["none", "otlp", "file"] = "none"
    otlp_endpoint: str | None = None  # e.g. http://collector:4318/v1/traces (default: the SDK's)
    trace_file: str | None = None  # file exporter: spans go to <trace_file>.<service>.<pid>.jsonl
    # /metrics also under the names the Gateway API Inference Extension's endpoint picker reads
    # (vllm:num_requests_waiting, vllm:kv_cache_usage_perc, vllm:lora_requests_info; docs/LORA.md)
    gaie_metrics: bool = False
