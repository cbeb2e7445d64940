"""Settings: the engine's batching, KV cache and kernels (docs/ENGINE.md); a fleet file's
`[...engine]` table overrides them per version."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.config.section import Section


class EngineSection(Section):
    max_num_seqs: int = Field(64, ge=1)
    """cap on running sequences"""
    max_num_batched_tokens: int = Field(512, ge=1)
    """token budget of one engine step"""
    kv_cache_gib: float | None = Field(None, gt=0)
    """KV pool ceiling, touched on first use (default: what max_num_seqs x the context can use, at
    most half the available memory)"""
    kv_idle_gib: float = Field(0.0625, ge=0)
    """KV memory kept resident for blocks no request holds, i.e. the prefix cache of finished
    requests"""
    # the cache's second tier (docs/ENGINE.md)
    kv_spill_gib: float = Field(1.0, ge=0)
    """at rest, the prefix cache's KV goes to a file of at most this many GiB and all KV memory
    above the held blocks is given back; prefix hits read it back; 0 = off: kv_idle_gib stays
    resident"""
    kv_spill_dir: str | None = None
    """where the KV spill file lives, unnamed (default: the system's temporary directory; not a
    tmpfs)"""
    max_model_len: int | None = Field(None, ge=2)
    """context window (default: the model's)"""
    scheduling_policy: Literal["fcfs", "priority"] = "priority"
    """engine queue order"""
    admission_policy: Literal["optimistic", "reserve"] = "optimistic"
    """admit on prompt (optimistic) or on prompt+max_tokens (reserve)"""
    enable_prefix_caching: bool = True
    """the prefix cache, which lets a prompt reuse the KV of a prefix shared with earlier ones"""
    # docs/ENGINE.md tells the kernels, numerics and batching windows apart ("Numerics")
    kernels: Literal["auto", "torch"] = "auto"
    """auto: sluice's CPU kernels when they build (weights stay quantized); torch: the portable
    fp32 path"""
    numerics: Literal["exact", "fast"] = "exact"
    """exact: fp32 arithmetic, greedy output equals transformers; fast: int8 activations x 4-bit
    weights as llama.cpp computes, faster and slightly different"""
    kv_cache_dtype: Literal["auto", "float16"] = "auto"
    """auto: K/V cached in the model's dtype (fp32 on the CPU: exact); float16: half the KV memory
    and faster decode at long context, not exact, for use with numerics fast"""
    batching_window: Literal["flush", "hold", "adaptive"] = "flush"
    """while decodes run, admit new prompts at once (flush), hold them up to the window to prefill
    several together (hold), or hold only while load makes it pay (adaptive)"""
    batching_window_ms: float = Field(100.0, ge=0)
    """longest hold of a new prompt under hold / adaptive"""
    # None here: 0 (auto) and 1 are EngineConfig's, which --help may not import (torch)
    threads: int | None = Field(None, ge=0)
    """torch threads per worker; 0 = auto: one per core for a worker alone, serve's local
    workers share the cores equally (default: 0)"""
    # 0 is for workers with cores of their own (docs/ENGINE.md)
    decode_split_rows: int | None = Field(None, ge=0, le=64)
    """CPU kernels: split decode calls of batches of at least N rows, and decode attention, over
    the worker's threads when a core is free (the pool rests while the other cores are busy);
    0 = every decode call on the engine's thread (default: 1, one stream included)"""
    # On for serving (EngineConfig's default is off): 1.1-2.5x per stream on repetitive work,
    # 1.0x on free text (docs/BENCHMARKS.md, "Speculative decoding")
    speculative_tokens: int = Field(3, ge=0, le=16)
    """speculative decoding without a draft model: verify up to K tokens proposed from the
    request's own context per decode, while it pays; the output is unchanged; 0 = off"""
