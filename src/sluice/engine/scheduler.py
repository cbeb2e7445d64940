"""The continuous-batching scheduler: which requests compute how many tokens this step.

One token budget per step and a cap on running sequences. Running requests go first (a decode
costs 1 token, an unfinished prompt continues its chunk); then waiting requests in policy order,
unless this step preempted (admitting right after evicting is how engines thrash). When KV
runs out, the victim is the lowest-priority, newest running request; it loses its blocks, keeps
its tokens, and re-enters the waiting queue at its original place. Under the priority policy a
waiting request may also preempt strictly lower-priority runners to get a seat or memory.

While decodes run, the batching window (engine/batching_window.py) may hold new arrivals for
a few steps so that several prompts are prefilled together; its clock is injected.

LoRA: at most `max_loras` distinct adapters run at once (running requests' adapters; a decode
runs every step, so this bounds every step's). A head whose adapter would be one too many waits
at the head of the line until one of the running adapters has no request left. Each scheduled
chunk carries its adapter's slot in the step (an index into `SchedulerOutput.adapters`, -1 for
the base model), which is all the runner needs to apply each row's adapter.

The scheduler never touches tensors: it hands the runner a SchedulerOutput of block ids,
token counts and adapter slots.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.engine.batching_window import BatchingWindow, WindowGate, WindowView
from sluice.engine.config import EngineConfig
from sluice.engine.kv_manager import NO_HIT, KVCacheManager, PrefixHit
from sluice.engine.policy import AdmissionPolicy, SchedulingPolicy, WaitingQueue, pick_victim
from sluice.engine.request import Request, RequestStatus
from sluice.engine.speculative import SpecState, Speculator
from sluice.types import AdapterRef

# The adaptive window predicts the next arrival from the rate over the last RATE_HORIZON windows
# (a time span, not a count: a burst of simultaneous arrivals must not read as a fast stream).
RATE_HORIZON = 10


@dataclass(slots=True)
class ScheduledChunk:
    request: Request
    start: int  # tokens already in the cache before this step
    num_tokens: int  # tokens computed this step (speculative proposals included)
    block_ids: list[int]
    # a decode's proposed next tokens (engine/speculative.py): computed after the known token,
    # one row each, and kept only as far as the sampler agrees with them
    spec_token_ids: list[int] = field(default_factory=list)
    lora_slot: int = -1  # its adapter's index in SchedulerOutput.adapters; -1: the base model

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """After this chunk every known token is computed, so the next one is sampled."""
        return self.end - len(self.spec_token_ids) == self.request.num_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_tokens - len(self.spec_token_ids) == 1 and self.samples


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    adapters: list[AdapterRef] = field(default_factory=list)  # the step's LoRA adapters, by slot

    @classmethod
    def of(cls, chunks: list[ScheduledChunk]) -> SchedulerOutput:
        """A step of these chunks, each given its adapter's slot (first use, first slot)."""
        out = cls(chunks=chunks)
        slots: dict[AdapterRef, int] = {}
        for c in chunks:
            ref = c.request.adapter
            c.lora_slot = -1 if ref is None else slots.setdefault(ref, len(slots))
        out.adapters = list(slots)
        return out

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    def __init__(
        self, config: EngineConfig, kv: KVCacheManager, max_model_len: int, clock: Callable[[], float] = time.monotonic
    ):
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.clock = clock  # read by the batching window only
        self.waiting = WaitingQueue(config.scheduling_policy)
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_held_steps = 0  # steps in which the batching window held new arrivals back
        self.watermark_blocks = int(config.watermark * kv.num_usable_blocks)
        self.gate = WindowGate(config.batching_window, config.batching_window_ms, config.batching_window_ratio)
        # new arrivals waiting (never scheduled) -> their arrival on `clock`, oldest first
        self._new: OrderedDict[str, float] = OrderedDict()
        self._new_tokens = 0
        self._arrivals: deque[float] = deque()  # arrival times within the rate horizon
        self._horizon_s = RATE_HORIZON * config.batching_window_ms / 1000.0
        self.speculator = Speculator(config.speculative_tokens) if config.speculative_tokens else None
        self.running_adapters: Counter[AdapterRef] = Counter()  # running requests per LoRA adapter

    # -- membership ----------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.push(request)
        now = self.clock()
        self._new[request.request_id] = now
        self._new_tokens += request.num_tokens
        if self.gate.mode is BatchingWindow.ADAPTIVE:
            self._arrivals.append(now)

    def _forget_new(self, request: Request) -> None:
        if self._new.pop(request.request_id, None) is not None:
            self._new_tokens -= request.num_tokens

    def finish(self, request: Request) -> None:
        """Take a finished or aborted request out of the engine and free its blocks."""
        if request.status is RequestStatus.RUNNING:
            self._stop_running(request)
        elif request.request_id in self.waiting:
            self.waiting.remove(request.request_id)
            self._forget_new(request)
        self.kv.free(request)
        request.status = RequestStatus.FINISHED

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    # -- the step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, ScheduledChunk] = {}
        for req in list(self.running):
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted as a victim earlier in this loop
            n = self._chunk_size(req, req.num_tokens - req.num_computed_tokens, budget)
            spec = self._proposals(req, budget) if n == 1 and self.speculator is not None else []
            n += len(spec)
            while not self.kv.allocate(req, n):
                victim = pick_victim(self.waiting, self.running)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim.request_id in scheduled:
                    budget += scheduled.pop(victim.request_id).num_tokens
                if victim is req:
                    break
            else:
                scheduled[req.request_id] = ScheduledChunk(req, req.num_computed_tokens, n, [], spec)
                budget -= n
        if not out.preempted:
            budget = self._admit(budget, scheduled, out)
        for chunk in scheduled.values():
            chunk.block_ids = self.kv.block_ids(chunk.request)
        step = SchedulerOutput.of(list(scheduled.values()))
        out.chunks, out.adapters = step.chunks, step.adapters
        return out

    # -- LoRA adapters -------------------------------------------------------------------------
    def waiting_adapters(self) -> set[AdapterRef]:
        return {r.adapter for r in self.waiting if r.adapter is not None}

    def _adapter_fits(self, req: Request) -> bool:
        """Running `req` keeps the distinct running adapters within max_loras."""
        ref = req.adapter
        return ref is None or ref in self.running_adapters or len(self.running_adapters) < self.config.max_loras

    def _start_running(self, req: Request) -> None:
        self.running.append(req)
        if req.adapter is not None:
            self.running_adapters[req.adapter] += 1

    def _stop_running(self, req: Request) -> None:
        self.running.remove(req)
        if req.adapter is not None:
            self.running_adapters[req.adapter] -= 1
            if self.running_adapters[req.adapter] <= 0:
                del self.running_adapters[req.adapter]

    def _proposals(self, req: Request, budget: int) -> list[int]:
        """Speculative tokens for a decode: never for a constrained request (its grammar would
        have to follow each proposal) nor for one that asks for logprobs (they travel one token
        per step, Request.new_logprob), never beyond its max_tokens or the context window (the
        accepted tokens and the bonus pick must fit), nor the step's budget, nor memory the
        decode alone would not need (speculation never preempts anyone)."""
        assert self.speculator is not None
        if (
            req.grammar is not None
            or req.sampling.logprobs is not None
            or req.num_computed_tokens != req.num_tokens - 1
        ):
            return []
        limit = min(
            req.sampling.max_tokens - req.num_output_tokens - 1, self.max_model_len - req.num_tokens - 1, budget - 1
        )
        if limit <= 0:
            return []
        if req.spec is None:
            req.spec = SpecState()
        spec = self.speculator.propose(req.spec, req.all_token_ids, limit, len(self.running))
        if spec and not self.kv.can_allocate(req, 1 + len(spec)):
            return []
        return spec

    def _chunk_size(self, req: Request, remaining: int, budget: int) -> int:
        n = min(remaining, budget)
        if self.config.long_prefill_threshold > 0:
            n = min(n, self.config.long_prefill_threshold)
        return max(n, 0)

    def _window_open(self, budget: int, scheduled: dict[str, ScheduledChunk]) -> bool:
        if not self._new or self.gate.mode is BatchingWindow.FLUSH:
            return True
        view = WindowView(
            oldest_wait_s=self.clock() - next(iter(self._new.values())),
            num_new=len(self._new),
            new_tokens=self._new_tokens,
            num_restarting=len(self.waiting) - len(self._new),
            num_decodes=sum(1 for c in scheduled.values() if c.is_decode),
            step_has_prefill=any(not c.is_decode for c in scheduled.values()),
            room_tokens=budget,
            free_seats=self.config.max_num_seqs - len(self.running),
            next_arrival_s=self._next_arrival_in(),
        )
        if self.gate.opens(view):
            return True
        self.num_held_steps += 1
        return False

    def _next_arrival_in(self) -> float:
        """Seconds until the next arrival is due at the recent rate (inf: none recently)."""
        now = self.clock()
        while self._arrivals and self._arrivals[0] <= now - self._horizon_s:
            self._arrivals.popleft()
        if not self._arrivals:
            return float("inf")
        gap = self._horizon_s / len(self._arrivals)
        return max(0.0, self._arrivals[-1] + gap - now)

    def _admit(self, budget: int, scheduled: dict[str, ScheduledChunk], out: SchedulerOutput) -> int:
        if budget <= 0 or len(self.waiting) == 0 or not self._window_open(budget, scheduled):
            return budget
        while budget > 0 and (req := self.waiting.peek()) is not None:
            if not self._adapter_fits(req):
                break  # head-of-line: it waits for one of the running adapters to have no request left
            hit = self.kv.find_prefix(req)
            seat = len(self.running) < self.config.max_num_seqs
            if not (seat and self._admissible(req, hit)):
                # Priority preemption only while nothing was admitted this step: "admit nothing
                # in a step that preempted" must hold both ways, and a request admitted above
                # may have hit a victim's blocks that are scheduled (not yet computed) this step.
                # The head is still first in line next step, and preempts then if it must.
                if self.config.scheduling_policy is SchedulingPolicy.PRIORITY and not out.admitted:
                    victims = self._preempt_for(req, hit, need_seat=not seat)
                    for victim in victims:  # already scheduled this step: their blocks are gone now
                        scheduled.pop(victim.request_id, None)
                    out.preempted.extend(victims)
                break  # head-of-line: nothing overtakes the head (no starvation under fcfs)
            n = self._chunk_size(req, req.num_tokens - hit.num_tokens, budget)
            if not self.kv.allocate(req, n, hit):
                break
            self.waiting.pop()
            self._forget_new(req)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = hit.num_tokens
                self.kv.record_lookup(req, hit)
            req.num_computed_tokens = hit.num_tokens
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self._start_running(req)
            out.admitted.append(req)
            scheduled[req.request_id] = ScheduledChunk(req, req.num_computed_tokens, n, [])
            budget -= n
        return budget

    # -- admission policies --------------------------------------------------------------------
    def _final_len(self, req: Request) -> int:
        return min(req.max_total_tokens(), self.max_model_len)

    def _blocks_needed(self, req: Request, hit: PrefixHit) -> int:
        """Free blocks `req` needs before admission, beyond its prefix hit."""
        if self.config.admission_policy is AdmissionPolicy.RESERVE:
            # prompt + max_tokens must fit, next to what running requests have reserved
            need = self.kv.blocks_for(self._final_len(req)) - len(hit.blocks)
            outstanding = sum(
                max(0, self.kv.blocks_for(self._final_len(r)) - self.kv.num_held_blocks(r)) for r in self.running
            )
            return need + hit.num_evictable + outstanding
        # optimistic: all known tokens must fit now, leaving the watermark free. The watermark is
        # headroom for running requests to grow into, so it applies only when some are running:
        # otherwise a prompt within max_model_len but within the watermark of the whole pool
        # (or a preempted request that has grown that long) could never be admitted — a hang.
        watermark = self.watermark_blocks if self.running else 0
        return self.kv.blocks_for(req.num_tokens) - len(hit.blocks) + hit.num_evictable + watermark

    def _admissible(self, req: Request, hit: PrefixHit = NO_HIT) -> bool:
        return self._blocks_needed(req, hit) <= self.kv.num_free_blocks

    def _preempt_for(self, head: Request, hit: PrefixHit, need_seat: bool) -> list[Request]:
        """Preempt strictly lower-priority runners so that `head` fits next step.

        Preempts nothing unless the candidates together would make room (no pointless evictions).
        """
        candidates = sorted(
            (r for r in self.running if r.priority > head.priority), key=self.waiting.victim_key, reverse=True
        )
        shortfall = self._blocks_needed(head, hit) - self.kv.num_free_blocks
        chosen: list[Request] = []
        for victim in candidates:
            if shortfall <= 0 and (chosen or not need_seat):
                break
            chosen.append(victim)
            shortfall -= self.kv.num_exclusive_blocks(victim)
            if self.config.admission_policy is AdmissionPolicy.RESERVE:
                shortfall -= max(0, self.kv.blocks_for(self._final_len(victim)) - self.kv.num_held_blocks(victim))
        if not chosen or shortfall > 0:
            return []
        for victim in chosen:
            self._preempt(victim)
        return chosen

    def _preempt(self, req: Request) -> None:
        self._stop_running(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        self.waiting.push(req)
