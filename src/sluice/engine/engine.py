"""The synchronous engine core: add / abort requests, and `step()` the batch forward.

One step = schedule → one forward over every scheduled token → sample → detokenize and check
stop conditions → free what finished. Bad requests are rejected in `add_request` with a clear
InvalidRequestError, so they never reach the loop; a failure inside a step fails only the
requests of that step and leaves the engine serving.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable

import torch

from sluice.engine.adapters import AdapterCache
from sluice.engine.config import EngineConfig
from sluice.engine.decode_graphs import DecodeGraphs
from sluice.engine.kv_manager import KVCacheManager
from sluice.engine.kv_memory import GIB, available_memory, kv_bytes_per_block, kv_cache_dtype, plan_kv_pool
from sluice.engine.kv_spill import open_spill_tier
from sluice.engine.request import Request
from sluice.engine.runner import ModelRunner
from sluice.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from sluice.engine.speculative import Speculator, accepted_tokens
from sluice.engine.stats import EngineStats
from sluice.engine.stop_rules import stop_reason
from sluice.errors import ContextWindowExceededError, InvalidRequestError
from sluice.heap import trim_heap
from sluice.models.detokenizer import IncrementalDetokenizer
from sluice.models.grammar.compiler import GrammarCompiler
from sluice.models.kernels import Numerics, set_decode_split
from sluice.models.loader import LoadedModel
from sluice.types import FinishReason, GenerationEvent, GenerationRequest, Usage

log = logging.getLogger(__name__)


class LLMEngine:
    """`clock` is what the batching window reads (injected by tests; monotonic seconds)."""

    def __init__(
        self, loaded: LoadedModel, config: EngineConfig | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.config = config = config or EngineConfig()
        if config.threads:  # on the thread that will step the engine: OpenMP's count is per thread
            torch.set_num_threads(config.threads)
        set_decode_split(config.decode_split_rows, config.kernels)
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.model_config = loaded.config
        context = config.max_model_len or loaded.config.max_position
        kv_dtype = kv_cache_dtype(config.kv_cache_dtype, self.model.dtype)
        plan = plan_kv_pool(
            config,
            kv_bytes_per_block(self.model, config.block_size, kv_dtype),
            context,
            lambda: available_memory(self.model.device),
        )
        num_blocks = plan.num_blocks
        self.max_model_len = min(context, (num_blocks - 1) * config.block_size)
        log.info(
            "KV pool on %s: %d blocks of %d tokens (%.2f GiB reserved, %s; sized by %s), context %d",
            self.model.device,
            num_blocks,
            config.block_size,
            plan.reserved_bytes / GIB,
            "touched on first use" if self.model.device.type == "cpu" else "zero-filled",
            plan.sized_by,
            self.max_model_len,
        )
        self.kv = KVCacheManager(
            num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.share_prefix_across_tenants,
            plan.max_idle_blocks,
        )
        self.scheduler = Scheduler(config, self.kv, self.max_model_len, clock)
        self.runner = ModelRunner(self.model, num_blocks, config.block_size, Numerics(config.numerics), kv_dtype)
        # LoRA adapters resident in this engine; those of running requests are never evicted
        self.adapters = AdapterCache(
            self.model,
            config.max_cpu_loras,
            config.max_lora_rank,
            config.lora_s3_endpoint,
            in_use=lambda: tuple(self.scheduler.running_adapters),
        )
        self.runner.adapters = self.adapters
        self.kv.spill = open_spill_tier(config, plan.bytes_per_block, self.runner, self.model.device)
        if config.cuda_graphs:
            if self.model.device.type == "cuda":
                self.runner.graphs = DecodeGraphs(
                    self.model,
                    self.runner.kv_caches,
                    config.block_size,
                    config.max_num_seqs,
                    -(-self.max_model_len // config.block_size),
                )
            else:
                log.info("cuda_graphs is on but the model is on %s: decode steps run eagerly", self.model.device)
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(loaded.config.eos_token_ids)
        self.vocab_size = loaded.config.vocab_size
        # grammar-constrained decoding: compiled grammars cached per spec, one matcher per request
        self.grammars = GrammarCompiler(self.tokenizer.backend, self.vocab_size, sorted(self.eos_ids))
        self._rng = random.Random(config.seed)
        self._stats = EngineStats(
            kv_blocks_total=self.kv.num_usable_blocks,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            block_size=config.block_size,
        )
        self._kv_bytes_per_block = plan.bytes_per_block
        self.last_step_seconds = 0.0

    # -- requests ------------------------------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        """Raise InvalidRequestError naming the problem; pure, so callable from any thread."""
        req.sampling.validate()
        n = len(req.prompt_token_ids) + len(req.resumed_output_ids)
        if not req.prompt_token_ids:
            raise InvalidRequestError("the prompt is empty: it must contain at least one token")
        if n >= self.max_model_len:
            raise ContextWindowExceededError(
                f"prompt is too long: {n} tokens, the context window is {self.max_model_len} "
                "(the prompt must leave room for at least one output token)"
            )
        if len(req.resumed_output_ids) >= req.sampling.max_tokens:
            raise InvalidRequestError("a resumed generation must have output tokens left to generate")
        bad = next((t for t in (*req.prompt_token_ids, *req.resumed_output_ids) if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is outside the vocabulary (size {self.vocab_size})")
        if req.sampling.guided is not None:
            self.grammars.validate(req.sampling.guided)  # compiles once per spec (cached)
        if req.adapter is not None and self.config.max_loras == 0:
            raise InvalidRequestError(
                f"this engine serves no LoRA adapters (max_loras = 0), so not {req.adapter.name!r}"
            )

    def add_request(self, req: GenerationRequest) -> None:
        self.validate(req)
        if req.request_id in self.requests:
            raise InvalidRequestError(f"request id {req.request_id!r} is already in use")
        seed = req.sampling.seed if req.sampling.seed is not None else self._rng.getrandbits(63)
        request = Request.from_generation_request(req, seed)
        if req.adapter is not None:  # resident already when the async front prefetched it
            fingerprint = self.adapters.prefetch(req.adapter)
            request.adapter_namespace = "\0".join((req.adapter.name, req.adapter.source, fingerprint))
        if req.sampling.guided is not None:
            request.grammar = self.grammars.matcher(req.sampling.guided)
            # a resumed generation's grammar state is its outputs so far, replayed
            if not request.grammar.sync(request.output_token_ids):
                raise InvalidRequestError("the resumed output does not follow the request's grammar")
        self.requests[req.request_id] = request
        detok = IncrementalDetokenizer(self.tokenizer.backend, req.sampling.stop, prompt_tail=req.prompt_token_ids[-4:])
        if req.resumed_output_ids:  # continue the text exactly where the other worker was
            detok.resume(req.resumed_output_ids, req.resumed_text_chars)
        self.detokenizers[req.request_id] = detok
        self.scheduler.add(request)

    def abort_request(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> GenerationEvent | None:
        """Remove a request now; its blocks are free before the next step. None if unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        return self._finish(request, reason, text="")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[GenerationEvent]:
        out = self.scheduler.schedule()
        rejected = self._sync_grammars(out)
        if out.is_empty:
            return rejected
        started = time.perf_counter()
        failed: list[GenerationEvent] = []
        try:
            sampled = self._execute(out)
        except Exception:  # a bug, a device fault, a bad request: find whose it is, fail only that
            sampled, failed = self._isolate(out)
        self.last_step_seconds = time.perf_counter() - started
        for chunk in out.chunks:
            if not chunk.request.is_finished:  # a speculative decode adds its accepted proposals below
                chunk.request.num_computed_tokens = chunk.end - len(chunk.spec_token_ids)
        s = self._stats
        s.num_steps += 1
        s.last_step_tokens = out.num_batched_tokens
        s.last_step_seqs = len(out.chunks)
        s.record_utilization(len(self.scheduler.running), self.kv.num_usable_blocks - self.kv.num_free_blocks)
        s.prompt_tokens_computed += sum(max(0, min(c.end, c.request.num_prompt_tokens) - c.start) for c in out.chunks)
        return rejected + failed + self._append_sampled(out, sampled)

    def _execute(self, out: SchedulerOutput) -> list[tuple[Request, int]]:
        return self.runner.execute(out)  # a test's faults wrap the runner's execute (worker/faults.py)

    def _isolate(self, out: SchedulerOutput) -> tuple[list[tuple[Request, int]], list[GenerationEvent]]:
        """The step failed as a whole: run its chunks one at a time, in the step's order (a
        request may read prefix blocks an earlier chunk of the step computes), and fail only the
        requests whose own chunk fails — the rest of the batch goes on as if nothing happened.
        Rewriting a chunk's K/V slots is harmless: they are the same slots, the same values."""
        sampled: list[tuple[Request, int]] = []
        failed: list[GenerationEvent] = []
        for chunk in out.chunks:
            try:
                sampled += self._execute(SchedulerOutput.of([chunk]))
            except Exception as exc:
                log.exception("engine step failed for request %s; failing it alone", chunk.request.request_id)
                failed.append(self._finish(chunk.request, FinishReason.ERROR, "", error=f"engine error: {exc}"))
        return sampled, failed

    def _sync_grammars(self, out: SchedulerOutput) -> list[GenerationEvent]:
        """Preempted requests drop their parser state; the ones about to sample get it back,
        rebuilt from their output tokens. A request whose tokens no longer parse (cannot happen
        for tokens its grammar chose) fails alone and leaves the step."""
        for request in out.preempted:
            if request.grammar is not None:
                request.grammar.release()
        failed: list[GenerationEvent] = []
        for chunk in list(out.chunks):
            grammar = chunk.request.grammar
            if grammar is not None and chunk.samples and not grammar.sync(chunk.request.output_token_ids):
                out.chunks.remove(chunk)
                failed.append(
                    self._finish(
                        chunk.request, FinishReason.ERROR, "", error="constrained decoding: the output no longer parses"
                    )
                )
        return failed

    def _append_sampled(self, out: SchedulerOutput, sampled: list[tuple[Request, int]]) -> list[GenerationEvent]:
        """One event per request: a speculative decode's rows (consecutive in `sampled`) are
        verified together and may append several tokens."""
        spec = {c.request.request_id: c for c in out.chunks if c.spec_token_ids}
        if not spec:
            return [self._append_token(request, token) for request, token in sampled]
        events: list[GenerationEvent] = []
        i = 0
        while i < len(sampled):
            request, token = sampled[i]
            chunk = spec.get(request.request_id)
            if chunk is None:
                events.append(self._append_token(request, token))
                i += 1
                continue
            picks = [t for _, t in sampled[i : i + 1 + len(chunk.spec_token_ids)]]
            i += len(picks)
            events.append(self._append_verified(chunk, picks))
        return events

    def _append_verified(self, chunk: ScheduledChunk, picks: list[int]) -> GenerationEvent:
        """Keep a speculative decode's proposals as far as the picks agree, plus the next pick
        (engine/speculative.py); their K/V is computed, the rejected ones' slots are rewritten
        when those positions are computed again. Tokens go through the same stop checks one by
        one, so EOS, stop sequences and max_tokens end the reply exactly where plain decoding
        would, and the tokens after that are dropped."""
        request = chunk.request
        tokens = accepted_tokens(chunk.spec_token_ids, picks)
        assert request.spec is not None
        Speculator.record(request.spec, len(chunk.spec_token_ids), len(tokens) - 1)
        self._stats.spec_proposed_tokens += len(chunk.spec_token_ids)
        self._stats.spec_accepted_tokens += len(tokens) - 1
        request.num_computed_tokens = chunk.start + len(tokens)  # the known token + the accepted ones
        # Blocks that filled with accepted proposals join the prefix cache now, before a stop
        # among the tokens below frees the request: their K/V is that of exactly these tokens.
        accepted = tokens[:-1]
        request.all_token_ids.extend(accepted)
        self.kv.cache_computed(request, chunk.start)
        del request.all_token_ids[len(request.all_token_ids) - len(accepted) :]
        events = []
        for token in tokens:
            events.append(self._append_token(request, token))
            if events[-1].finished:
                break
        return merge_events(events)

    def _append_token(self, request: Request, token: int) -> GenerationEvent:
        request.all_token_ids.append(token)
        self._stats.output_tokens += 1
        detok = self.detokenizers[request.request_id]
        reason, error = stop_reason(request, token, detok, self.eos_ids, self.max_model_len)
        if reason is not None:
            event = self._finish(request, reason, detok.take(final=True), token, error=error)
        else:
            event = GenerationEvent(request.request_id, detok.take(), [token], usage=self._usage(request))
        if request.new_logprob is not None:  # asked for: the runner scored the token
            event.logprobs, request.new_logprob = [request.new_logprob], None
        if request.prompt_logprobs is not None:  # with the first token, once (a recompute skips them)
            event.prompt_logprobs, request.prompt_logprobs = request.prompt_logprobs, None
        if request.num_output_tokens == 1 and request.first_scheduled_time is not None:
            event.queue_time_s = max(0.0, request.first_scheduled_time - request.arrival_time)
        return event

    def _finish(
        self, request: Request, reason: FinishReason, text: str, token: int | None = None, error: str | None = None
    ) -> GenerationEvent:
        self.scheduler.finish(request)
        request.finish_reason = reason
        detok = self.detokenizers.pop(request.request_id, None)
        self.requests.pop(request.request_id, None)
        return GenerationEvent(
            request.request_id,
            text=text,
            token_ids=[] if token is None else [token],
            finished=True,
            finish_reason=reason,
            stop_sequence=detok.stop_matched if (detok and reason is FinishReason.STOP_SEQUENCE) else None,
            usage=self._usage(request),
            error=error,
        )

    @staticmethod
    def _usage(request: Request) -> Usage:
        return Usage(request.num_prompt_tokens, request.num_output_tokens, max(0, request.num_cached_tokens))

    # -- introspection -------------------------------------------------------------------------
    def release_idle_memory(self) -> int:
        """Give back what the last burst left resident beyond the idle budget: KV blocks above
        the held ones and `kv_idle_gib`, or all of them with a spill tier, which keeps their cache
        entries (KVCacheManager.shrink), then the C heap's free pages
        (activations, detokenizer state). For when no request runs (the async loop calls it once
        the engine has sat idle): a request arriving after pays page faults, not a wrong answer.
        Returns the KV bytes released."""
        released = 0
        # device memory is not given back (the pool is one allocation there): keep its cache
        span = self.kv.shrink() if self.model.device.type == "cpu" else None
        if span is not None:
            released = self.runner.release_kv(*span)
        trim_heap()
        return released

    def stats(self) -> EngineStats:
        s = self._stats
        s.num_running = len(self.scheduler.running)
        s.num_waiting = len(self.scheduler.waiting)
        s.kv_blocks_free = self.kv.num_free_blocks
        s.kv_blocks_used = self.kv.num_usable_blocks - self.kv.num_free_blocks
        s.kv_live_tokens = sum(r.num_computed_tokens for r in self.scheduler.running)
        s.outstanding_tokens = sum(_outstanding(r) for r in (*self.scheduler.running, *self.scheduler.waiting))
        s.kv_table_slots = sum(self.kv.num_held_blocks(r) for r in self.scheduler.running) * self.config.block_size
        s.prefix_cache_queries = self.kv.prefix_queries
        s.prefix_cache_hits = self.kv.prefix_hits
        s.num_preemptions = self.scheduler.num_preemptions
        s.num_held_steps = self.scheduler.num_held_steps
        s.kv_blocks_resident = self.kv.num_resident_blocks
        s.kv_resident_bytes = s.kv_blocks_resident * self._kv_bytes_per_block
        s.kv_spilled_blocks, s.kv_spill_restored_blocks = self.kv.spill_counts()
        self._lora_stats(s)
        return dataclasses.replace(s)  # a snapshot copy

    def _lora_stats(self, s: EngineStats) -> None:
        s.max_loras = self.config.max_loras
        s.lora_running = sorted({ref.name for ref in self.scheduler.running_adapters})
        s.lora_waiting = sorted({ref.name for ref in self.scheduler.waiting_adapters()})
        s.lora_resident = sorted({ref.name for ref in self.adapters.resident()})
        s.lora_resident_bytes = self.adapters.resident_bytes()
        s.lora_loads, s.lora_evictions = self.adapters.loads, self.adapters.evictions

    def generate(self, requests: list[GenerationRequest]) -> dict[str, GenerationEvent]:
        """Run `requests` to completion (blocking); returns each one's accumulated final event."""
        results: dict[str, GenerationEvent] = {}
        for req in requests:
            self.add_request(req)
            results[req.request_id] = GenerationEvent(req.request_id)
        while self.has_unfinished():
            for ev in self.step():
                acc = results[ev.request_id]
                acc.text += ev.text
                acc.token_ids.extend(ev.token_ids)
                acc.logprobs.extend(ev.logprobs)
                acc.prompt_logprobs = acc.prompt_logprobs or ev.prompt_logprobs
                acc.finished, acc.finish_reason, acc.stop_sequence = ev.finished, ev.finish_reason, ev.stop_sequence
                acc.usage, acc.error = ev.usage, ev.error
        return results


def merge_events(events: list[GenerationEvent]) -> GenerationEvent:
    """One request's consecutive events of one step as one: the texts and tokens in order, the
    last one's outcome (finish, usage), the first token's queue time."""
    if len(events) == 1:
        return events[0]
    merged = events[-1]
    merged.text = "".join(e.text for e in events)
    merged.token_ids = [t for e in events for t in e.token_ids]
    merged.queue_time_s = next((e.queue_time_s for e in events if e.queue_time_s is not None), None)
    return merged


def _outstanding(r: Request) -> int:
    """The work a request still asks of the engine, in tokens: its context not yet computed
    (prompt, or everything after a preemption) plus the outputs it may still generate. The
    router balances workers on this (queued + running), as it balances on prompt + max_tokens."""
    return (r.num_tokens - r.num_computed_tokens) + max(0, r.sampling.max_tokens - r.num_output_tokens)
