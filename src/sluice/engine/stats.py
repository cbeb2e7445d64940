"""Engine statistics as plain data, for metrics, logs and benchmarks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sluice.engine.config import DEFAULT_BLOCK_SIZE


@dataclass(slots=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0  # usable blocks (the null block excluded)
    kv_blocks_free: int = 0  # includes cached blocks that nobody holds (evictable)
    kv_blocks_used: int = 0
    kv_live_tokens: int = 0  # tokens computed by running requests (shared prefixes counted per request)
    outstanding_tokens: int = 0  # work left, running + waiting: uncomputed context + outputs still allowed
    kv_table_slots: int = 0  # slots in running requests' block tables (shared blocks counted per request)
    prefix_cache_queries: int = 0  # prompt tokens looked up, cumulative
    prefix_cache_hits: int = 0  # of which found in the cache, cumulative
    num_preemptions: int = 0  # cumulative
    num_steps: int = 0  # cumulative
    last_step_tokens: int = 0
    last_step_seqs: int = 0
    max_num_batched_tokens: int = 0
    max_num_seqs: int = 0  # the engine's cap on running sequences
    prompt_tokens_computed: int = 0  # cumulative, excluding prefix-cache hits
    output_tokens: int = 0  # cumulative
    block_size: int = DEFAULT_BLOCK_SIZE
    last_step_utilization: float = 0.0  # see batch_utilization
    batch_utilization_sum: float = 0.0  # per-step utilization summed over steps, cumulative
    num_held_steps: int = 0  # steps in which the batching window held new arrivals, cumulative
    kv_blocks_resident: int = 0  # blocks written at least once (their pages are resident)
    kv_resident_bytes: int = 0  # their memory
    kv_spilled_blocks: int = 0  # blocks in the spill tier (engine/kv_spill.py)
    kv_spill_restored_blocks: int = 0  # of which read back by prefix hits, cumulative
    spec_proposed_tokens: int = 0  # speculative decoding: tokens proposed and verified, cumulative
    spec_accepted_tokens: int = 0  # of which accepted (each saved a step), cumulative
    # LoRA (engine/adapters.py): the cap on adapters running at once, the adapters of running and
    # of waiting requests and those resident (names), their weights' memory, loads and evictions
    max_loras: int = 0
    lora_running: list[str] = field(default_factory=list)
    lora_waiting: list[str] = field(default_factory=list)
    lora_resident: list[str] = field(default_factory=list)
    lora_resident_bytes: int = 0
    lora_loads: int = 0  # cumulative (a reload after an eviction counts)
    lora_evictions: int = 0  # cumulative

    def record_utilization(self, seqs: int, kv_blocks_held: int) -> None:
        """After a step ran: the fullest of its three limits (see batch_utilization)."""
        self.last_step_utilization = max(
            self.last_step_tokens / self.max_num_batched_tokens if self.max_num_batched_tokens else 0.0,
            seqs / self.max_num_seqs if self.max_num_seqs else 0.0,
            kv_blocks_held / self.kv_blocks_total if self.kv_blocks_total else 0.0,
        )
        self.batch_utilization_sum += self.last_step_utilization

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def batch_fill(self) -> float:
        """Tokens of the last step over the step budget."""
        return self.last_step_tokens / self.max_num_batched_tokens if self.max_num_batched_tokens else 0.0

    @property
    def batch_utilization(self) -> float:
        """Mean over the steps that ran of how full each step was against its binding limit.

        A step is limited three ways: the token budget (max_num_batched_tokens), the seats
        (max_num_seqs running requests) and KV memory (usable blocks). Its utilization is the
        largest of tokens / budget, running / max_num_seqs and KV blocks held / usable: 1.0 means
        nothing more could have joined that step. Idle time is not a step, so it is not counted."""
        return self.batch_utilization_sum / self.num_steps if self.num_steps else 0.0

    @property
    def kv_waste(self) -> float:
        """(allocated slots - live tokens) / allocated slots over running requests' block tables.

        Counted per table, so a prefix block shared by many requests counts once per request on
        both sides: sharing neither hides nor inflates the unfilled tails."""
        return (self.kv_table_slots - self.kv_live_tokens) / self.kv_table_slots if self.kv_table_slots else 0.0


_NAMES = ("lora_running", "lora_waiting", "lora_resident")


def combined(stats: list[EngineStats]) -> EngineStats:
    """Many engines' statistics as one (a gateway's metrics over its workers): every count and
    capacity summed, so the ratios (KV usage, hit rate, batch fill) are the fleet's own; the
    block size is the first engine's."""
    if not stats:
        return EngineStats()
    out = EngineStats(block_size=stats[0].block_size)
    for f in dataclasses.fields(EngineStats):
        if f.name in _NAMES:  # sets of names: the union
            setattr(out, f.name, sorted({n for s in stats for n in getattr(s, f.name)}))
        elif f.name == "max_loras":  # a per-engine cap, not a capacity that adds up
            out.max_loras = max(s.max_loras for s in stats)
        elif f.name != "block_size":
            setattr(out, f.name, sum(getattr(s, f.name) for s in stats))
    # a ratio, not a count: the engines' mean (batch_utilization, from the summed sums and
    # steps, is already the mean over every engine's steps)
    out.last_step_utilization = out.last_step_utilization / len(stats)
    return out
