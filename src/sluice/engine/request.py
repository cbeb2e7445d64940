"""A request's life inside the engine.

All progress is one counter: `num_computed_tokens` against `all_token_ids` (prompt + outputs).
Prefill, chunked prefill, a prefix-cache hit, decode and recompute after preemption are all
arithmetic on it; there are no separate prefill/decode modes.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.types import AdapterRef, FinishReason, GenerationRequest, SamplingParams, TokenLogprob, token_cost

if TYPE_CHECKING:  # no torch for whoever only needs the request's shape (routing, config)
    from sluice.engine.speculative import SpecState
    from sluice.models.grammar.matcher import GrammarMatcher

_sequence = itertools.count()


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, KV freed, keeps its place in line
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int
    tenant: str
    arrival_time: float
    seed: int  # the user's seed, or one drawn at arrival: recompute never changes the output
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 until then
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    first_scheduled_time: float | None = None  # monotonic; arrival → this = time queued in the engine
    block_hashes: list[bytes] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None
    seq_no: int = field(default_factory=lambda: next(_sequence))  # FIFO tie-break, stable across preemption
    grammar: GrammarMatcher | None = None  # constrained decoding: the allowed next tokens
    # logprobs, when the request asks (SamplingParams.logprobs / prompt_logprobs): the runner
    # leaves the sampled token's here for the engine's event, and fills the prompt's as its
    # positions are computed (index i: prompt token i; [0] is None, nothing precedes it)
    new_logprob: TokenLogprob | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    spec: SpecState | None = None  # speculative decoding: n-gram index, acceptance (engine/speculative.py)
    adapter: AdapterRef | None = None  # its LoRA adapter (engine/adapters.py); None: the base model
    # the adapter's prefix-cache namespace (name, source, files' fingerprint; kv_manager.prefix_namespace)
    adapter_namespace: str = ""

    @classmethod
    def from_generation_request(cls, req: GenerationRequest, seed: int) -> Request:
        return cls(
            request_id=req.request_id,
            prompt_token_ids=list(req.prompt_token_ids),
            sampling=req.sampling,
            priority=req.priority,
            tenant=req.tenant,
            arrival_time=req.arrival_time,
            seed=seed,
            all_token_ids=[*req.prompt_token_ids, *req.resumed_output_ids],
            prompt_logprobs=None if req.sampling.prompt_logprobs is None else [None],
            adapter=req.adapter,
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def max_total_tokens(self) -> int:
        return token_cost(self.num_prompt_tokens, self.sampling.max_tokens)
