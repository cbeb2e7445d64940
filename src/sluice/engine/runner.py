"""The model runner: turns a SchedulerOutput into one flat forward pass, then samples.

It owns the KV cache tensors. Layout of a step's batch: one row per decoding request first (so
the attention backend can treat them as one padded batch), then each prefill chunk's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.engine.request import Request
from sluice.engine.scheduler import ScheduledChunk, SchedulerOutput
from sluice.models.attention import AttentionMetadata, PrefillSpan
from sluice.models.llama import LlamaModel
from sluice.models.sampler import sample


def kv_bytes_per_block(model: LlamaModel, block_size: int) -> int:
    cfg = model.config
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * block_size * model.dtype.itemsize


@dataclass(slots=True)
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sampling: list[ScheduledChunk]  # the chunks whose next token is sampled, in logits order


class ModelRunner:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int):
        self.model = model
        self.block_size = block_size
        cfg = model.config
        shape = (cfg.num_kv_heads, num_blocks * block_size, cfg.head_dim)
        # zeros, not empty: padded decode slots read the null block, and masking adds -inf to
        # its scores, which must therefore be finite.
        self.kv_caches = [
            (torch.zeros(shape, dtype=model.dtype, device=model.device), torch.zeros(shape, dtype=model.dtype, device=model.device))
            for _ in range(cfg.num_layers)
        ]
        self.window = cfg.sliding_window

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
        for c in decodes:
            p = c.start
            ids.append(c.request.all_token_ids[p])
            positions.append(p)
            slot_mapping.append(c.block_ids[p // bs] * bs + p % bs)
        meta = AttentionMetadata(slot_mapping=torch.empty(0), num_decodes=len(decodes))
        if decodes:
            meta.decode_slots, meta.decode_bias = self._decode_layout(decodes)
        logits_rows = list(range(len(decodes)))
        sampling = list(decodes)
        for c in prefills:
            row = len(ids)
            ids.extend(c.request.all_token_ids[c.start : c.end])
            positions.extend(range(c.start, c.end))
            ctx_slots = self._slots(c.block_ids, 0, c.end)
            slot_mapping.extend(ctx_slots[c.start :])
            meta.prefills.append(PrefillSpan(row, row + c.num_tokens, torch.tensor(ctx_slots), self._prefill_mask(c)))
            if c.samples:
                logits_rows.append(row + c.num_tokens - 1)
                sampling.append(c)
        device = self.model.device
        meta.slot_mapping = torch.tensor(slot_mapping, device=device)
        if device.type != "cpu":
            for span in meta.prefills:
                span.slots = span.slots.to(device)
                span.mask = None if span.mask is None else span.mask.to(device)
        return ModelInput(
            input_ids=torch.tensor(ids, device=device),
            positions=torch.tensor(positions, device=device),
            meta=meta,
            logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=device),  # long even when empty
            sampling=sampling,
        )

    def _decode_layout(self, decodes: list[ScheduledChunk]) -> tuple[torch.Tensor, torch.Tensor | None]:
        bs = self.block_size
        ctx = [c.end for c in decodes]
        max_ctx = max(ctx)
        nblocks = -(-max_ctx // bs)
        table = torch.tensor([c.block_ids[:nblocks] + [0] * (nblocks - len(c.block_ids[:nblocks])) for c in decodes])
        slots = (table[:, :, None] * bs + torch.arange(bs)).view(len(decodes), -1)[:, :max_ctx].contiguous()
        cols = torch.arange(max_ctx)
        lens = torch.tensor(ctx)
        valid = cols[None, :] < lens[:, None]
        if self.window:
            valid &= cols[None, :] >= (lens - self.window)[:, None]
        bias = None
        if not bool(valid.all()):
            bias = torch.zeros(valid.shape, dtype=torch.float32).masked_fill_(~valid, float("-inf"))
            bias = bias.view(1, len(decodes), 1, max_ctx).to(self.model.device)
        return slots.to(self.model.device), bias

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
        """Run one forward over the step and sample; returns (request, token) per sampling chunk."""
        inp = self.prepare(out)
        logits = self.model.forward(inp.input_ids, inp.positions, inp.meta, self.kv_caches, inp.logits_indices)
        if not inp.sampling:
            return []
        reqs = [c.request for c in inp.sampling]
        tokens = sample(
            logits,
            [r.sampling for r in reqs],
            [r.seed for r in reqs],
            [r.num_output_tokens for r in reqs],
            [r.grammar for r in reqs],
        )
        return list(zip(reqs, tokens))
