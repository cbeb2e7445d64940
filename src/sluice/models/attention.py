"""Attention over the paged KV cache, behind one small interface.

The runner lays a step's tokens out flat: first one token per decoding sequence, then each
prefill chunk contiguously. `AttentionMetadata` tells a backend where every token's K/V goes
(`slot_mapping`) and which cached slots each query may read. The portable torch backend below
runs on any device; a GPU kernel backend implements the same `AttentionBackend` protocol.

Cache layout per layer: [num_kv_heads, num_slots, head_dim], slot = block_id * block_size +
offset. Heads-first makes a gather along slots land directly in the [kv_head, seq, ctx, dim]
order batched matmuls want, so decode attention needs no transposing copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F


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
    decode_slots: torch.Tensor | None = None  # [num_decodes, max_context] int64, padded
    decode_bias: torch.Tensor | None = None  # [1, num_decodes, 1, max_context] 0 / -inf, or None
    prefills: list[PrefillSpan] = field(default_factory=list)


class AttentionBackend(Protocol):
    """Computes attention for one layer and writes the step's K/V into that layer's cache.

    Contract: all of the step's K/V for the layer is written before any query reads the cache,
    because a request may hit prefix blocks that another request of the same step computes.
    """

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


class TorchPagedAttention:
    """Portable backend built from torch ops.

    Decodes are attended together: one gather per layer for all of them, then two batched
    matmuls with the GQA group folded into the query rows (measured ~4x faster on CPU than
    scaled_dot_product_attention with enable_gqa for single-token queries). Prefill chunks, few
    per step, go one by one through scaled_dot_product_attention.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    def forward(self, q, k, v, k_cache, v_cache, meta):  # type: ignore[no-untyped-def]
        k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        n = meta.num_decodes
        if n and not meta.prefills:
            return self._decode(q, k_cache, v_cache, meta)
        out = torch.empty_like(q)
        if n:
            out[:n] = self._decode(q[:n], k_cache, v_cache, meta)
        for span in meta.prefills:
            qp = q[span.start : span.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
            kp = k_cache.index_select(1, span.slots).unsqueeze(0)  # [1, KVH, ctx, D]
            vp = v_cache.index_select(1, span.slots).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=span.mask, is_causal=span.mask is None, scale=self.scale, enable_gqa=True
            )
            out[span.start : span.end] = o.squeeze(0).transpose(0, 1)
        return out

    def _decode(self, q, k_cache, v_cache, meta):  # type: ignore[no-untyped-def]
        slots = meta.decode_slots
        b, ctx = slots.shape
        kvh, d = self.num_kv_heads, self.head_dim
        flat = slots.view(-1)
        kd = k_cache.index_select(1, flat).view(kvh, b, ctx, d)
        vd = v_cache.index_select(1, flat).view(kvh, b, ctx, d)
        # head h uses kv head h // group, so [b, H, d] -> [kvh, b, group, d]
        qd = q.view(b, kvh, self.group, d).transpose(0, 1)
        scores = torch.matmul(qd, kd.transpose(-1, -2)).float().mul_(self.scale)  # [kvh, b, group, ctx]
        if meta.decode_bias is not None:
            scores.add_(meta.decode_bias)
        probs = torch.softmax(scores, dim=-1).to(vd.dtype)  # softmax in fp32 whatever the dtype
        return torch.matmul(probs, vd).transpose(0, 1).reshape(b, self.num_heads, d)
