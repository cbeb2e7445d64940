"""The model runner: turns a SchedulerOutput into one flat forward pass, then samples.

It owns the KV cache tensors. Layout of a step's batch: one row per decoding request first (the
attention backend gets their block tables and context lengths and treats them as one batch),
then each prefill chunk's rows. Inputs are built on the host; on a GPU they reach the device in
one asynchronous copy per dtype (engine/staging.py), and the sampled ids come back in one
transfer (models/sampler.py): without grammar masks, that read is the step's one host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.engine.adapters import AdapterCache
from sluice.engine.decode_graphs import DecodeGraphs
from sluice.engine.kv_memory import lazy_zeros, release_slots
from sluice.engine.request import Request
from sluice.engine.scheduler import ScheduledChunk, SchedulerOutput
from sluice.engine.staging import stage
from sluice.models.attention import AttentionMetadata, PrefillSpan
from sluice.models.kernels import Numerics
from sluice.models.llama import LlamaModel
from sluice.models.logprobs import log_softmax_rows, token_logprobs
from sluice.models.lora.batch import LoraBatch
from sluice.models.sampler import sample


@dataclass(slots=True)
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sampling: list[ScheduledChunk]  # the chunks whose next token is sampled, in logits order
    # per logits row: its offset among its chunk's sampled rows (a speculative decode samples
    # one row per proposal plus one; every other chunk one row, offset 0)
    offsets: list[int]
    # prompt logprobs: (request, first position) per prefill chunk that asks, in logits order
    # after the sampling rows; each covers consecutive positions (see _prompt_positions)
    prompt_spans: list[tuple[Request, int, int]] | None = None
    lora: LoraBatch | None = None  # each row's LoRA adapter, when the step has any


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        numerics: Numerics = Numerics.EXACT,
        kv_dtype: torch.dtype | None = None,
    ):
        """`kv_dtype`: what the KV cache stores (default: the model's dtype; float16 is the
        opt-in 16-bit cache: the attention backends widen what they read to the model's dtype)."""
        self.model = model
        self.block_size = block_size
        self.numerics = Numerics(numerics)
        cfg = model.config
        shape = (cfg.num_kv_heads, num_blocks * block_size, cfg.head_dim)
        # zeros, not empty: decode attention reads unwritten slots under a -inf mask, so they must
        # be finite. lazy_zeros costs no memory until a slot is written (engine/kv_memory.py).
        dtype = kv_dtype or model.dtype
        self.kv_caches = [
            (lazy_zeros(shape, dtype, model.device), lazy_zeros(shape, dtype, model.device))
            for _ in range(cfg.num_layers)
        ]
        self.window = cfg.sliding_window
        # CUDA graphs for decode-only steps (engine/decode_graphs.py); set by the engine when
        # EngineConfig.cuda_graphs is on and the model is on a CUDA device
        self.graphs: DecodeGraphs | None = None
        # the engine's resident LoRA adapters, where a step's slots find their weights
        self.adapters: AdapterCache | None = None

    def release_kv(self, first_block: int, end_block: int) -> int:
        """Free the memory of blocks [first_block, end_block) (never-used again: BlockPool.shrink);
        the bytes released."""
        bs = self.block_size
        return sum(release_slots(t, first_block * bs, end_block * bs) for kv in self.kv_caches for t in kv)

    # -- whole blocks (the spill tier, engine/kv_spill.py) ---------------------------------------
    def _by_block(self) -> list[torch.Tensor]:
        """Each K and V tensor as (heads, blocks, block_size, head_dim): views, no copies."""
        return [t.unflatten(1, (-1, self.block_size)) for kv in self.kv_caches for t in kv]

    def read_blocks(self, block_ids: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """Blocks' K/V bytes, one uint8 row per block: each layer's K then V, head by head, in
        the cache's dtype (the bytes as stored). `out`: a uint8 buffer of at least that many rows."""
        tensors = self._by_block()
        ids = torch.tensor(block_ids, dtype=torch.long, device=tensors[0].device)
        heads, _, bs, hd = tensors[0].shape
        n, width = len(block_ids), len(tensors) * heads * bs * hd * tensors[0].element_size()
        rows = torch.empty((n, width), dtype=torch.uint8) if out is None else out[:n]
        values = rows.view(tensors[0].dtype).view(n, len(tensors), heads, bs, hd)
        for i, t in enumerate(tensors):
            values[:, i].copy_(t.index_select(1, ids).transpose(0, 1))
        return rows

    def write_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        """The inverse of read_blocks: rows of bytes back into blocks `block_ids`."""
        tensors = self._by_block()
        ids = torch.tensor(block_ids, dtype=torch.long, device=tensors[0].device)
        heads, _, bs, hd = tensors[0].shape
        values = data.to(tensors[0].device).view(tensors[0].dtype).view(len(block_ids), len(tensors), heads, bs, hd)
        for i, t in enumerate(tensors):
            t.index_copy_(1, ids, values[:, i].transpose(0, 1))

    # -- input preparation ---------------------------------------------------------------------
    def _slots(self, block_ids: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_ids[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare(self, out: SchedulerOutput) -> ModelInput:
        decodes = [c for c in out.chunks if c.is_decode]
        prefills = [c for c in out.chunks if not c.is_decode]
        ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        bs = self.block_size
        sampling: list[ScheduledChunk] = []
        offsets: list[int] = []
        row_slots: list[int] = []  # per row: its chunk's adapter slot (-1: the base model)
        for c in decodes:
            # a speculative decode is one decode row per position: the known token, then each
            # proposal, each attending to its own context over the request's blocks, so every
            # row computes what plain decoding would at that position (engine/speculative.py)
            for j, token in enumerate((c.request.all_token_ids[c.start], *c.spec_token_ids)):
                p = c.start + j
                ids.append(token)
                positions.append(p)
                slot_mapping.append(c.block_ids[p // bs] * bs + p % bs)
                sampling.append(c)
                offsets.append(j)
                row_slots.append(c.lora_slot)
        meta = AttentionMetadata(slot_mapping=torch.empty(0), num_decodes=len(ids), block_size=bs)
        if decodes:
            meta.block_tables, meta.context_lens = self._decode_tables(sampling, positions)
            meta.max_context_len = max(c.end for c in decodes)
            meta.min_context_len = min(c.start + 1 for c in decodes)
        logits_rows = list(range(len(ids)))
        for c in prefills:
            row = len(ids)
            ids.extend(c.request.all_token_ids[c.start : c.end])
            row_slots.extend([c.lora_slot] * c.num_tokens)
            positions.extend(range(c.start, c.end))
            ctx_slots = self._slots(c.block_ids, 0, c.end)
            slot_mapping.extend(ctx_slots[c.start :])
            meta.prefills.append(PrefillSpan(row, row + c.num_tokens, torch.tensor(ctx_slots), self._prefill_mask(c)))
            if c.samples:
                logits_rows.append(row + c.num_tokens - 1)
                sampling.append(c)
                offsets.append(0)
        spans = self._prompt_spans(prefills, meta.num_decodes, logits_rows)
        meta.slot_mapping = torch.tensor(slot_mapping)
        inp = ModelInput(
            input_ids=torch.tensor(ids),
            positions=torch.tensor(positions),
            meta=meta,
            logits_indices=torch.tensor(logits_rows, dtype=torch.long),  # long even when empty
            sampling=sampling,
            prompt_spans=spans,
            offsets=offsets,
            lora=self._lora(out, row_slots),
        )
        if self.model.device.type != "cpu":
            self._stage(inp)
        return inp

    def _lora(self, out: SchedulerOutput, row_slots: list[int]) -> LoraBatch | None:
        """The step's adapters by slot (reloaded here if one was evicted) and each row's slot."""
        if not out.adapters:
            return None
        assert self.adapters is not None, "a step with LoRA rows needs the engine's adapters"
        weights = [self.adapters.get(ref) for ref in out.adapters]
        return LoraBatch(weights, row_slots, self.model.ops)

    def _stage(self, inp: ModelInput) -> None:
        """Every host-built input onto the model's device in one asynchronous copy per dtype."""
        meta = inp.meta
        masks = [s for s in meta.prefills if s.mask is not None]
        tables = [meta.block_tables, meta.context_lens] if meta.num_decodes else []
        host = [
            inp.input_ids,
            inp.positions,
            inp.logits_indices,
            meta.slot_mapping,
            *tables,
            *(s.slots for s in meta.prefills),
            *(s.mask for s in masks),
        ]
        moved = iter(stage(host, self.model.device))  # type: ignore[arg-type]
        inp.input_ids, inp.positions, inp.logits_indices, meta.slot_mapping = (next(moved) for _ in range(4))
        if meta.num_decodes:
            meta.block_tables, meta.context_lens = next(moved), next(moved)
        for span in meta.prefills:
            span.slots = next(moved)
        for span in masks:
            span.mask = next(moved)

    @staticmethod
    def _prompt_spans(
        prefills: list[ScheduledChunk], first_row: int, logits_rows: list[int]
    ) -> list[tuple[Request, int, int]] | None:
        """Extra logits rows for prompt logprobs: position p's logits score prompt token p + 1,
        so a chunk over [start, end) scores tokens start+1 .. min(end, P-1). Positions already
        scored (a recompute after preemption) are skipped. Appended to `logits_rows`."""
        spans: list[tuple[Request, int, int]] = []
        row = first_row
        for c in prefills:
            r = c.request
            if r.prompt_logprobs is not None:
                start = max(c.start, len(r.prompt_logprobs) - 1)
                end = min(c.end, r.num_prompt_tokens - 1)
                if end > start:
                    logits_rows.extend(range(row + start - c.start, row + end - c.start))
                    spans.append((r, start, end - start))
            row += c.num_tokens
        return spans or None

    def _record_prompt_logprobs(self, logits: torch.Tensor, spans: list[tuple[Request, int, int]]) -> None:
        logprobs = log_softmax_rows(logits)
        targets: list[int] = []
        top_n: list[int] = []
        for r, start, n in spans:
            targets.extend(r.all_token_ids[start + 1 : start + 1 + n])
            top_n.extend([r.sampling.prompt_logprobs or 0] * n)
        scored = iter(token_logprobs(logprobs, targets, top_n))
        for r, _start, n in spans:
            assert r.prompt_logprobs is not None
            r.prompt_logprobs.extend(next(scored) for _ in range(n))

    def _decode_tables(self, rows: list[ScheduledChunk], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per decode row (its chunk, its position): the chunk's block table padded with block 0
        to the longest context, and the row's context length."""
        ctx = [p + 1 for p in positions[: len(rows)]]
        nblocks = -(-max(ctx) // self.block_size)
        tables = [c.block_ids[:nblocks] + [0] * (nblocks - len(c.block_ids[:nblocks])) for c in rows]
        return torch.tensor(tables, dtype=torch.int32), torch.tensor(ctx, dtype=torch.int32)

    def _prefill_mask(self, c: ScheduledChunk) -> torch.Tensor | None:
        if c.start == 0 and not (self.window and c.end > self.window):
            return None  # plain causal
        q_pos = torch.arange(c.start, c.end)[:, None]
        k_pos = torch.arange(c.end)[None, :]
        mask = k_pos <= q_pos
        if self.window:
            mask &= k_pos > q_pos - self.window
        return mask

    # -- execution -----------------------------------------------------------------------------
    def execute(self, out: SchedulerOutput) -> list[tuple[Request, int]]:
        """Run one forward over the step and sample; returns (request, token) per sampled row, in
        the step's order: one per sampling chunk, 1 + its proposals for a speculative decode."""
        # a step with LoRA rows runs eagerly (the captured graphs hold the base model's linears only)
        key = self.graphs.bucket(out.chunks) if self.graphs is not None and not out.adapters else None
        logits = None
        if key is not None:  # a decode-only step that fits a captured bucket: replay its graph
            assert self.graphs is not None
            logits = self.graphs.run(out.chunks, key)
            sampling, offsets = list(out.chunks), [0] * len(out.chunks)
        if logits is None:
            inp = self.prepare(out)
            logits = self.model.forward(
                inp.input_ids,
                inp.positions,
                inp.meta,
                self.kv_caches,
                inp.logits_indices,
                numerics=self.numerics,
                argmax_rows=_argmax_only(inp.sampling),
                lora=inp.lora,
            )
            if inp.prompt_spans:
                self._record_prompt_logprobs(logits[len(inp.sampling) :], inp.prompt_spans)
                logits = logits[: len(inp.sampling)]
            sampling, offsets = inp.sampling, inp.offsets
        if not sampling:
            return []
        reqs = [c.request for c in sampling]
        # logprobs before sampling: the model's distribution, not the masked one (in place)
        asking = [i for i, r in enumerate(reqs) if r.sampling.logprobs is not None]
        logprobs = log_softmax_rows(logits[asking]) if asking else None
        tokens = sample(
            logits,
            [r.sampling for r in reqs],
            [r.seed for r in reqs],
            [r.num_output_tokens + j for r, j in zip(reqs, offsets)],
            [r.grammar for r in reqs],
        )
        if logprobs is not None:
            scored = token_logprobs(
                logprobs, [tokens[i] for i in asking], [reqs[i].sampling.logprobs or 0 for i in asking]
            )
            for i, lp in zip(asking, scored):
                reqs[i].new_logprob = lp
        return list(zip(reqs, tokens))


def _argmax_only(sampling: list[ScheduledChunk]) -> torch.Tensor | None:
    """The sampled rows whose logits serve only their argmax (greedy, no logprobs, no grammar
    mask): the model may return them with just the logits that argmax needs."""
    rows = [
        i
        for i, c in enumerate(sampling)
        if c.request.sampling.greedy and c.request.sampling.logprobs is None and c.request.grammar is None
    ]
    return torch.tensor(rows, dtype=torch.int64) if rows else None
