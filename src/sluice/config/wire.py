"""Settings: the HTTP wire — request limits and read timeouts, streams, the API formats' choices."""

from __future__ import annotations

from pydantic import BaseModel, Field

MB = 1024 * 1024


class WireSection(BaseModel):
    max_body_bytes: int = Field(32 * MB, ge=1024)  # Anthropic's limit for /v1/messages
    default_anthropic_version: str | None = "2023-06-01"  # used when the header is missing; None = 400
    # Under anthropic-version 2026-10-21 Anthropic rejects temperature/top_p/top_k; a self-hosted
    # server's users need sampling control, so by default we accept them (strict = mirror Anthropic).
    strict_sampling_params: bool = False
    reject_unknown_fields: bool = True
    ping_interval_s: float = Field(10.0, gt=0)
    # a connection with bytes pending and none acknowledged this long is cut (stalled reader);
    # also the most one SSE write may block
    send_timeout_s: float = Field(30.0, gt=0)
    max_stream_duration_s: float = Field(600.0, gt=0)
    stream_open_wait_s: float = Field(1.0, ge=0)  # a stream with no output yet opens (and pings) after this
    request_timeout_s: float = Field(600.0, gt=0)  # non-streaming requests
    # reading a request (api/read_guard.py): slow or oversized requests are refused (408 / 431)
    header_timeout_s: float = Field(10.0, gt=0)  # connection open / first byte → headers complete
    body_timeout_s: float = Field(60.0, gt=0)  # headers complete → whole body received
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    max_incomplete_requests: int = Field(256, ge=1)  # connections mid-request; more are refused (503)
    shutdown_grace_s: float = Field(10.0, ge=0)
    tcp_keepalive: bool = True
    tcp_user_timeout_ms: int = Field(30_000, ge=0)  # 0 = kernel default
    openapi: bool = True  # /openapi.json, /docs, /redoc (false: all three are 404)
    # how tools, calls and results are spelled in prompts and replies (docs/API.md "Tool use"):
    # a registered tool format ("hermes"), or a JSON file of ToolFormat fields over Hermes
    tool_format: str = "hermes"
