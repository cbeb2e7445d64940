"""One typed settings object for the server: defaults < settings file < env `SLUICE_*` < flags.

Validated at start-up; a bad value stops `sluice serve` with a message naming the setting,
before any model loads.
"""

from __future__ import annotations

import enum
import os
import re
import tomllib
from pathlib import Path
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sluice.errors import SluiceError

MB = 1024 * 1024
T = TypeVar("T")

# Where the model runs: auto (the first CUDA device when torch sees one, else the CPU), cpu, cuda
# (the current CUDA device) or cuda:N. The one spelling rule, shared by Settings, EngineConfig and
# the loader (models/device.py resolves a name against the devices this process can see).
DEVICE_NAMES = "auto, cpu, cuda or cuda:N"
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def is_device_name(name: str) -> bool:
    return _DEVICE_RE.fullmatch(name) is not None


class StoreKind(str, enum.Enum):
    """Where shared state lives: in this process, or in Redis (shared by every replica)."""

    MEMORY = "memory"
    REDIS = "redis"


def by_store_kind(kind: StoreKind | str, what: str, memory: Callable[[], T], redis: Callable[[], T]) -> T:
    """The store a `*_store` setting names, built by the matching factory (each store module is
    imported by its factory, so a gateway without Redis never loads redis); an unknown kind
    fails naming `what` and the choices."""
    if kind in (StoreKind.MEMORY, StoreKind.MEMORY.value):
        return memory()
    if kind in (StoreKind.REDIS, StoreKind.REDIS.value):
        return redis()
    raise ValueError(f"unknown {what} {kind!r}: use 'memory' or 'redis'")


class StoreFailMode(str, enum.Enum):
    """What a store outage means for a request: admit it (`open`) or refuse it with 529 (`closed`)."""

    OPEN = "open"
    CLOSED = "closed"


class SettingsError(SluiceError):
    """A setting is invalid; the message names it."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SLUICE_", extra="forbid", validate_default=True)

    # -- where to listen, who may call --------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = None  # single-key mode; unset = open (binds 127.0.0.1 only)

    # -- the model and its engine ---------------------------------------------------------------
    model: str | None = None  # .gguf file or HF folder; default: the bundled SmolLM2
    served_model_name: str | None = None  # the id clients send; default: derived from the model
    model_aliases: list[str] = Field(default_factory=list)  # extra ids accepted for the model
    # fp32 is exact (greedy output equals transformers'); bfloat16 / float16 halve weight and KV
    # memory and are meant for GPUs (on CPU the kernels run fp32 only: other dtypes take torch)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # DEVICE_NAMES; a CUDA device that is not there stops start-up
    worker: str | None = None  # address of a running `sluice worker`; unset = spawn one locally
    # a fleet file (docs/FLEET.md): models, versions, workers; unset = a fleet of one model
    # built from the settings above (model, served_model_name, model_aliases, worker)
    fleet: str | None = None
    # without a fleet file: scale the spawned worker with the local autoscaler (docs/FLEET.md:
    # one serving worker, one in the warm pool, at most autoscale_max_workers); a fleet file
    # says it per version instead
    autoscale: bool = False
    autoscale_max_workers: int = Field(2, ge=1)
    admin_key: SecretStr | None = None  # guards the admin API (/admin/*); unset = no admin API
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(512, ge=1)
    kv_cache_gib: float | None = Field(None, gt=0)  # None: max_num_seqs x context, within memory
    kv_idle_gib: float = Field(0.0625, ge=0)  # KV memory kept resident for finished requests' cache
    # the cache's second tier: at rest the KV given back goes to a file here (docs/ENGINE.md)
    kv_spill_gib: float = Field(1.0, ge=0)  # 0 = off
    kv_spill_dir: str | None = None  # None: the system's temporary directory
    max_model_len: int | None = Field(None, ge=2)
    scheduling_policy: Literal["fcfs", "priority"] = "priority"
    admission_policy: Literal["optimistic", "reserve"] = "optimistic"
    enable_prefix_caching: bool = True
    # auto: the CPU kernels (weights stay in their GGUF blocks) when they build; torch: the
    # portable fp32 path. exact / fast: see docs/ENGINE.md ("Numerics").
    kernels: Literal["auto", "torch"] = "auto"
    numerics: Literal["exact", "fast"] = "exact"
    kv_cache_dtype: Literal["auto", "float16"] = "auto"  # float16: the opt-in 16-bit K/V cache (not exact)
    batching_window: Literal["flush", "hold", "adaptive"] = "flush"  # docs/ENGINE.md
    batching_window_ms: float = Field(100.0, ge=0)
    # torch threads per worker; None/0 = auto (the cores shared equally by serve's local workers)
    threads: int | None = Field(None, ge=0)
    # decode calls of at least this many rows split over the worker's threads (the kernels'
    # helper pool); 0 = off: for workers with cores of their own (docs/ENGINE.md)
    decode_split_rows: int | None = Field(None, ge=0, le=64)
    # speculative decoding: n-gram proposals verified per decode at most; 0 = off. On for serving
    # (EngineConfig's default is off): 1.1-2.5x per stream on repetitive work, 1.0x on free text
    # (docs/BENCHMARKS.md, "Speculative decoding"); the output is unchanged either way
    speculative_tokens: int = Field(3, ge=0, le=16)
    worker_start_timeout_s: float = Field(180.0, gt=0)
    # a spawned worker that dies is restarted (backoff 1 s, 2 s, 4 s … 30 s); after more than
    # worker_max_restarts exits within worker_restart_window_s, serve exits with code 3
    worker_max_restarts: int = Field(5, ge=0)
    worker_restart_window_s: float = Field(600.0, gt=0)
    health_check_interval_s: float = Field(1.0, gt=0)  # how often the engine's health is probed
    health_check_timeout_s: float = Field(2.0, gt=0)  # a probe unanswered this long = engine down (hung)
    # a worker's fault injection (worker/faults.py): a testing aid, off by default
    fault_injection: str | None = None

    # -- the wire -------------------------------------------------------------------------------
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
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # json: one JSON object per line with request id and trace id (observability/logs.py);
    # text: the classic line, for a terminal
    log_format: Literal["json", "text"] = "json"
    # OpenTelemetry traces (observability/tracing.py): none (off, no cost) | otlp | file
    trace_exporter: Literal["none", "otlp", "file"] = "none"
    otlp_endpoint: str | None = None  # e.g. http://collector:4318/v1/traces (default: the SDK's)
    trace_file: str | None = None  # file exporter: spans go to <trace_file>.<service>.<pid>.jsonl
    openapi: bool = True  # /openapi.json, /docs, /redoc (false: all three are 404)

    # how tools, calls and results are spelled in prompts and replies (docs/API.md "Tool use"):
    # a registered tool format ("hermes"), or a JSON file of ToolFormat fields over Hermes
    tool_format: str = "hermes"

    # -- stream resume (docs/API.md) ---------------------------------------------------------
    replay_store: StoreKind = StoreKind.MEMORY  # redis: resume through any replica
    replay_ttl_s: float = Field(600.0, gt=0)  # how long a finished stream can be resumed
    replay_max_bytes: int = Field(1 << 20, ge=4096)  # per stream (memory store)

    # -- idempotent retries (docs/API.md: Idempotency-Key) ------------------------------------
    # memory: one gateway process; redis (redis_url): every replica shares the keys
    idempotency_store: StoreKind = StoreKind.MEMORY
    # how long a completed reply answers retries of its key. An hour: the SDKs retry within
    # seconds, a job runner resubmits after a crash within minutes; LLM replies are large, so
    # 24 h (Stripe's) would hold a day of replies in Redis. Raise it where retries come later.
    idempotency_ttl_s: float = Field(3600.0, gt=0)

    # -- safety (docs/SAFETY.md) --------------------------------------------------------------
    safety: bool = True
    safety_policy: str | None = None  # a policy TOML file; None = the built-in default policy
    safety_tier_policies: dict[str, str] = Field(default_factory=dict)  # tier name -> policy file

    # -- the gateway (docs/GATEWAY.md) ------------------------------------------------------------
    data_dir: str = "~/.local/share/sluice"  # the SQLite key store lives here (keys.db)
    # auto: the key store when it holds an active key (the single api_key still works), else the
    # single api_key if set, else open. open/single/keys force one mode.
    auth: Literal["auto", "open", "single", "keys"] = "auto"
    # a verified key is cached this long: revoking a key takes effect within this bound
    key_cache_ttl_s: float = Field(5.0, ge=0)
    tiers: dict[str, dict[str, Any]] = Field(default_factory=dict)  # [tiers.NAME] overrides
    default_tier: str = "standard"  # tier of the single-key / open principal (unlimited unless set)
    limits_store: StoreKind = StoreKind.MEMORY
    redis_url: str = "redis://127.0.0.1:6379/0"
    on_store_error: StoreFailMode = StoreFailMode.OPEN  # Redis down: admit (open) or 529 (closed)
    max_inflight: int | None = Field(None, ge=1)  # requests dispatched to the engine; default max_num_seqs + 8
    max_queued_tokens: int = Field(500_000, ge=1)  # admission queue bound (prompt + max_tokens)
    aging_s: float = Field(10.0, ge=0)  # a waiting request gains one band per aging_s
    enable_coalescing: bool = True
    coalesce_across_tenants: bool = False
    response_cache: bool = False
    response_cache_ttl_s: float = Field(300.0, gt=0)
    response_cache_entries: int = Field(1000, ge=1)
    # Message Batches (docs/GATEWAY.md): kept this long after they end, at most this many
    batch_retention_s: float = Field(86_400.0, gt=0)
    max_batches: int = Field(10_000, ge=1)

    @field_validator("api_key", "admin_key")
    @classmethod
    def _key_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            return None
        return v


    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str) -> str:
        if not is_device_name(v):
            raise ValueError(f"{v!r} is not a device: use {DEVICE_NAMES}")
        return v

    @model_validator(mode="after")
    def _retries_follow_streams_everywhere(self) -> "Settings":
        # a retry of a keyed stream follows the first attempt's replay log: with keys shared
        # across replicas, the log must be too, or a retry on another replica finds nothing
        if self.idempotency_store is StoreKind.REDIS and self.replay_store is not StoreKind.REDIS:
            raise ValueError("idempotency_store = 'redis' needs replay_store = 'redis' (a retried stream is "
                             "followed through the replay log, from any replica)")
        return self


def load_settings(file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build settings from an optional TOML file, the environment and explicit overrides.

    `overrides` with value None are ignored, so unset CLI flags fall through to env and file.
    """
    data: dict[str, Any] = {}
    if file is not None:
        path = Path(file).expanduser()
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SettingsError(f"settings file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"settings file {path} is not valid TOML: {exc}") from None
        data = _flatten_server_table(data, path)
    try:
        return _layered(data, overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def _flatten_server_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Settings may sit at the top level or in a `[server]` table — or both: a file with
    `[server]` plus top-level tables such as `[tiers.NAME]` applies all of them. A setting given
    in both places is an error (which one was meant?), never silently one of them."""
    server = data.get("server")
    if server is None:
        return data
    if not isinstance(server, dict):
        raise SettingsError(f"settings file {path}: server must be a table")
    merged = {k: v for k, v in data.items() if k != "server"}
    both = sorted(set(merged) & set(server))
    if both:
        raise SettingsError(f"settings file {path}: {', '.join(both)} given both at the top level and in [server]")
    merged.update(server)
    return merged


def _layered(file_data: dict[str, Any], overrides: dict[str, Any]) -> Settings:
    # pydantic-settings ranks init kwargs above env vars. File values must rank below env, so a
    # file value is dropped where the env sets the same setting; flags (overrides) stay on top.
    merged = dict(file_data)
    for name in Settings.model_fields:
        if "SLUICE_" + name.upper() in os.environ:
            merged.pop(name, None)
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**merged)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid settings: " + "; ".join(parts)
