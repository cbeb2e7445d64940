"""Settings: the HTTP wire — request limits and read timeouts, streams, the API formats' choices."""

from __future__ import annotations

from pydantic import Field

from sluice.config.section import Section

MB = 1024 * 1024


class WireSection(Section):
    max_body_bytes: int = Field(32 * MB, ge=1024)
    """the largest request body (Anthropic's limit for /v1/messages)"""
    default_anthropic_version: str | None = "2023-06-01"
    """used when the anthropic-version header is missing; None = 400"""
    # Under anthropic-version 2026-10-21 Anthropic rejects temperature/top_p/top_k; a self-hosted
    # server's users need sampling control, so by default we accept them.
    strict_sampling_params: bool = False
    """reject temperature/top_p/top_k under anthropic-version 2026-10-21, as Anthropic does"""
    reject_unknown_fields: bool = True
    """a request with a field the API does not know is a 400"""
    ping_interval_s: float = Field(10.0, gt=0)
    """SSE ping interval in seconds"""
    send_timeout_s: float = Field(30.0, gt=0)
    """cut a connection whose reader acknowledges nothing for this long while data waits (a
    stalled reader); also the most one SSE write may block"""
    max_stream_duration_s: float = Field(600.0, gt=0)
    """longest a stream may run"""
    stream_open_wait_s: float = Field(1.0, ge=0)
    """a stream with no output yet opens (and pings) after this"""
    request_timeout_s: float = Field(600.0, gt=0)
    """longest a non-streaming request may run"""
    # reading a request (api/read_guard.py): slow or oversized requests are refused (408 / 431)
    header_timeout_s: float = Field(10.0, gt=0)
    """connection open / first byte → headers complete"""
    body_timeout_s: float = Field(60.0, gt=0)
    """headers complete → whole body received"""
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    """the largest request head"""
    max_incomplete_requests: int = Field(256, ge=1)
    """connections mid-request; more are refused (503)"""
    shutdown_grace_s: float = Field(10.0, ge=0)
    """time open streams get on SIGTERM"""
    tcp_keepalive: bool = True
    """TCP keepalive probes on client connections"""
    tcp_user_timeout_ms: int = Field(30_000, ge=0)
    """TCP_USER_TIMEOUT of client connections; 0 = the kernel's default"""
    openapi: bool = True
    """/openapi.json, /docs, /redoc (false: all three are 404)"""
    tool_format: str = "hermes"
    """how tools, calls and results are spelled in prompts and replies (docs/API.md "Tool use"): a
    registered tool format ("hermes"), or a JSON file of ToolFormat fields over Hermes"""
