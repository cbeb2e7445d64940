"""Paged attention on the CPU kernels: decodes read K/V in place through their block tables.

The torch backend gathers every decoding sequence's K/V out of the cache into a padded copy
each layer (index_select), then runs two batched matmuls over the padding too. The kernel walks
each sequence's block table instead: one task per (sequence, KV head), whose query heads share
each K/V row read; softmax in fp32; no copy and no padding, so a step's attention costs what its
context lengths cost, not batch x the longest. Prefill chunks (few per step, long) keep
scaled_dot_product_attention (see models/attention.py).
"""

from __future__ import annotations

from types import ModuleType

import torch

from sluice.models.attention import AttentionMetadata, PrefillSpan, prefill_attention, write_kv


class KernelPagedAttention:
    def __init__(self, ops: ModuleType, num_heads: int, num_kv_heads: int, head_dim: int,
                 sliding_window: int | None = None):
        self.ops = ops
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.window = sliding_window or 0

    def prepare(self, meta: AttentionMetadata) -> None:
        pass  # the block tables are read as they are

    def forward(self, q, k, v, k_cache, v_cache, meta):  # type: ignore[no-untyped-def]
        write_kv(k, v, k_cache, v_cache, meta)
        T = q.shape[0]
        return self.attend(q.reshape(T, -1), k_cache, v_cache, meta).view(T, self.num_heads, self.head_dim)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        T, width = q.shape[0], self.num_heads * self.head_dim
        out = torch.empty(T, width, dtype=q.dtype)
        if meta.num_decodes:
            self.ops.paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.block_size,
                                  self.num_heads, self.num_kv_heads, self.scale, self.window, out)
        for span in meta.prefills:
            out[span.start : span.end] = self._prefill(q, k_cache, v_cache, span).reshape(-1, width)
        return out

    def _prefill(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, span: PrefillSpan) -> torch.Tensor:
        qp = q[span.start : span.end, : self.num_heads * self.head_dim].view(-1, self.num_heads, self.head_dim)
        return prefill_attention(qp, k_cache, v_cache, span, self.scale)
