"""Settings: the engine's batching, KV cache and kernels (docs/ENGINE.md); a fleet file's
`[...engine]` table overrides them per version."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class EngineSection(BaseModel):
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
