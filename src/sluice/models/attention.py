"""Attention over the paged KV cache, behind one small interface.

The runner lays a step's tokens out flat: first one token per decoding sequence, then each
prefill chunk contiguously. `AttentionMetadata` tells a backend where every token's K/V goes
(`slot_mapping`) and which cached slots each query may read: decodes by their block tables and
context lengths, prefill chunks by their slot lists. The portable torch backend below runs on
any device; the CPU kernel backend (models/kernels/paged_attention.py) reads the decodes' K/V in
place through the block tables; on CUDA, models/sdpa_attention.py sends the decodes through
scaled_dot_product_attention over the same gathered layout.

Cache layout per layer: [num_kv_heads, num_slots, head_dim], slot = block_id * block_size +
offset. Heads-first makes a gather along slots land directly in the [kv_head, seq, ctx, dim]
order batched matmuls want, so decode attention needs no transposing copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(slots=True)
class PrefillSpan:
    """One sequence's prefill chunk: rows [start, end) of the flat batch.

    `slots` lists the cache slots of the whole context (cached prefix + this chunk) in order.
    `mask` is None for a plain causal chunk that starts at position 0; otherwise a
    [q_len, context_len] boolean mask (True = may attend) for a chunk that follows cached tokens.
    """

    start: int
    end: int
    slots: torch.Tensor
    mask: torch.Tensor | None


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each token's K/V is written
    num_decodes: int = 0  # rows [0, num_decodes) are single-token decodes
    # decodes: each sequence's block ids, padded with block 0, and its context length (the new
    # token included); int32 on the model's device
    block_tables: torch.Tensor | None = None  # [num_decodes, max_blocks]
    context_lens: torch.Tensor | None = None  # [num_decodes]
    block_size: int = 0
    # the longest and shortest decode context, known on the host when the runner builds the step
    # (0 = unknown: read from context_lens). Sizing the step's layout from them needs no device
    # round trip, which on a GPU would stall the host once per step.
    max_context_len: int = 0
    min_context_len: int = 0
    prefills: list[PrefillSpan] = field(default_factory=list)
    # what a backend derives once per step in `prepare` (e.g. padded slot lists), shared by layers
    derived: object = None


class AttentionBackend(Protocol):
    """Computes attention for one layer and writes the step's K/V into that layer's cache.

    Contract: all of the step's K/V for the layer is written before any query reads the cache,
    because a request may hit prefix blocks that another request of the same step computes.
    `attend` is the second half alone, for callers that wrote K/V themselves (the fused RoPE +
    cache write of the CPU kernels); `forward` = write, then attend.
    """

    def prepare(self, meta: AttentionMetadata) -> None:
        """Called once per step before the layers run."""
        ...

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        ...

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # q: [T, >= num_heads * head_dim] rows; returns [T, num_heads * head_dim]
        ...


@dataclass(slots=True)
class _DecodeLayout:
    slots: torch.Tensor  # [num_decodes, max_context] int64, padded with slots of block 0
    bias: torch.Tensor | None  # [1, num_decodes, 1, max_context] 0 / -inf, or None


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> None:
    if k.dtype != k_cache.dtype:  # the opt-in 16-bit cache (EngineConfig.kv_cache_dtype)
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, span: PrefillSpan, scale: float
) -> torch.Tensor:
    """One prefill chunk through scaled_dot_product_attention; q [q_len, H, D] -> [q_len, H, D]."""
    qp = q.transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
    kp = k_cache.index_select(1, span.slots).unsqueeze(0)  # [1, KVH, ctx, D]
    vp = v_cache.index_select(1, span.slots).unsqueeze(0)
    if kp.dtype != q.dtype:  # a 16-bit cache: widen what was read
        kp, vp = kp.to(q.dtype), vp.to(q.dtype)
    o = F.scaled_dot_product_attention(
        qp, kp, vp, attn_mask=span.mask, is_causal=span.mask is None, scale=scale, enable_gqa=True
    )
    return o.squeeze(0).transpose(0, 1)


class TorchPagedAttention:
    """Portable backend built from torch ops.

    Decodes are attended together: one gather per layer for all of them (the block tables
    expanded once per step into padded slot lists), then two batched matmuls with the GQA group
    folded into the query rows (measured ~4x faster on CPU than scaled_dot_product_attention
    with enable_gqa for single-token queries). Prefill chunks, few per step, go one by one
    through scaled_dot_product_attention.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, sliding_window: int | None = None):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.window = sliding_window

    def prepare(self, meta: AttentionMetadata) -> None:
        if not meta.num_decodes:
            return
        assert meta.block_tables is not None and meta.context_lens is not None
        bs = meta.block_size
        lens = meta.context_lens.long()
        max_ctx = meta.max_context_len or int(lens.max())
        nblocks = -(-max_ctx // bs)
        table = meta.block_tables[:, :nblocks].long()
        offsets = torch.arange(bs, device=table.device)
        slots = (table[:, :, None] * bs + offsets).view(table.shape[0], -1)[:, :max_ctx].contiguous()
        cols = torch.arange(max_ctx, device=table.device)
        valid = cols[None, :] < lens[:, None]
        if self.window:
            valid &= cols[None, :] >= (lens - self.window)[:, None]
        if meta.max_context_len:  # every slot is valid iff all contexts are equal and inside the window
            padded = meta.min_context_len < max_ctx or bool(self.window and max_ctx > self.window)
        else:
            padded = not bool(valid.all())
        bias = None
        if padded:
            bias = torch.zeros(valid.shape, dtype=torch.float32, device=table.device).masked_fill_(
                ~valid, float("-inf")
            )
            bias = bias.view(1, table.shape[0], 1, max_ctx)
        meta.derived = _DecodeLayout(slots, bias)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        write_kv(k, v, k_cache, v_cache, meta)
        return self._attend(q, k_cache, v_cache, meta)

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
        T, width = q.shape[0], self.num_heads * self.head_dim
        q = q[:, :width].reshape(T, self.num_heads, self.head_dim)
        return self._attend(q, k_cache, v_cache, meta).reshape(T, width)

    def _attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
        n = meta.num_decodes
        if n and not meta.prefills:
            return self._decode(q, k_cache, v_cache, meta)
        out = torch.empty_like(q)
        if n:
            out[:n] = self._decode(q[:n], k_cache, v_cache, meta)
        for span in meta.prefills:
            out[span.start : span.end] = prefill_attention(q[span.start : span.end], k_cache, v_cache, span, self.scale)
        return out

    def _gather(
        self, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode rows' K and V out of the paged cache, [kv heads, rows, context, head dim], in
        the query's dtype (a 16-bit cache is widened after the gather: only what is read)."""
        b, ctx = slots.shape
        flat = slots.view(-1)
        shape = (self.num_kv_heads, b, ctx, self.head_dim)
        kd, vd = k_cache.index_select(1, flat).view(shape), v_cache.index_select(1, flat).view(shape)
        return (kd, vd) if kd.dtype == dtype else (kd.to(dtype), vd.to(dtype))

    def _decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
        layout = meta.derived
        assert isinstance(layout, _DecodeLayout), "prepare(meta) was not called for this step"
        b = layout.slots.shape[0]
        kvh, d = self.num_kv_heads, self.head_dim
        kd, vd = self._gather(layout.slots, k_cache, v_cache, q.dtype)
        # head h uses kv head h // group, so [b, H, d] -> [kvh, b, group, d]
        qd = q.view(b, kvh, self.group, d).transpose(0, 1)
        scores = torch.matmul(qd, kd.transpose(-1, -2)).float().mul_(self.scale)  # [kvh, b, group, ctx]
        if layout.bias is not None:
            scores.add_(layout.bias)
        probs = torch.softmax(scores, dim=-1).to(vd.dtype)  # softmax in fp32 whatever the dtype
        return torch.matmul(probs, vd).transpose(0, 1).reshape(b, self.num_heads, d)
