"""Paged attention on the CPU kernels: decodes read K/V in place through their block tables.

The torch backend gathers every decoding sequence's K/V out of the cache into a padded copy
each layer (index_select), then runs two batched matmuls over the padding too. The kernel walks
each sequence's block table instead: one task per (sequence, KV head), whose query heads share
each K/V row read; softmax in fp32; no copy and no padding, so a step's attention costs what its
context lengths cost, not batch x the longest. Prefill chunks of short contexts (many new
prompts at once) join the decodes in that one call; long ones keep scaled_dot_product_attention
(see models/attention.py).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from sluice.models.attention import AttentionMetadata, PrefillSpan, prefill_attention, write_kv

# Prefill chunks whose whole context is at most this long go through the decode kernel row by
# row (see prepare); longer ones keep SDPA, whose blocked GEMMs win on long contexts.
PAGED_PREFILL_MAX_CONTEXT = 256


class KernelPagedAttention:
    def __init__(
        self, ops: ModuleType, num_heads: int, num_kv_heads: int, head_dim: int, sliding_window: int | None = None
    ):
        self.ops = ops
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.window = sliding_window or 0

    def prepare(self, meta: AttentionMetadata) -> None:
        """Steps whose prefill chunks all have short contexts attend every row, decode and
        prefill alike, in one kernel call per layer: a prefill row at position p is a decode
        of context p + 1 over its sequence's blocks (the step's K/V are written before any row
        reads them). SDPA one chunk at a time cost ~4 small torch ops per chunk per layer —
        ~4,000 per step for 32 new prompts, each a parallel region of its own: 20 % of the
        step's time on one thread and most of it on two busy cores (docs/BENCHMARKS.md)."""
        meta.derived = None
        if not meta.prefills or any(len(s.slots) > PAGED_PREFILL_MAX_CONTEXT for s in meta.prefills):
            return
        bs = meta.block_size
        tables: list[list[int]] = []
        lens: list[int] = []
        for span in meta.prefills:
            ctx = len(span.slots)
            blocks = (span.slots[::bs] // bs).tolist()
            first = ctx - (span.end - span.start) + 1  # the first row's context length
            tables.extend([blocks] * (span.end - span.start))
            lens.extend(range(first, ctx + 1))
        decode_tables, decode_lens = (meta.block_tables, meta.context_lens) if meta.num_decodes else (None, None)
        width = max(max(map(len, tables)), decode_tables.shape[1] if decode_tables is not None else 0)
        prefill_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        prefill_lens = torch.tensor(lens, dtype=torch.int32)
        if decode_tables is not None:
            assert decode_lens is not None, "a step with decodes carries their context lengths"
            if decode_tables.shape[1] < width:
                decode_tables = torch.nn.functional.pad(decode_tables, (0, width - decode_tables.shape[1]))
            prefill_tables = torch.cat([decode_tables, prefill_tables])
            prefill_lens = torch.cat([decode_lens, prefill_lens])
        meta.derived = (prefill_tables.contiguous(), prefill_lens.contiguous())

    def one_call_tables(self, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(block tables, context lengths) when one paged_decode call attends every row of the
        step (decodes only, or decodes and short prefills: see prepare); None when a prefill
        chunk goes through SDPA. `attend` and fused_forward's one-call stack both decide by it."""
        if meta.derived is not None:
            return meta.derived  # type: ignore[return-value]
        if meta.prefills or not meta.num_decodes:
            return None
        assert meta.block_tables is not None and meta.context_lens is not None
        return meta.block_tables, meta.context_lens

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        write_kv(k, v, k_cache, v_cache, meta)
        T = q.shape[0]
        return self.attend(q.reshape(T, -1), k_cache, v_cache, meta).view(T, self.num_heads, self.head_dim)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        T, width = q.shape[0], self.num_heads * self.head_dim
        out = torch.empty(T, width, dtype=q.dtype)
        one_call = self.one_call_tables(meta)
        if one_call is not None:  # every row in one call (see prepare)
            self._paged_decode(q, k_cache, v_cache, *one_call, meta.block_size, out)
            return out
        if meta.num_decodes:
            assert meta.block_tables is not None and meta.context_lens is not None
            self._paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.block_size, out)
        for span in meta.prefills:
            out[span.start : span.end] = self._prefill(q, k_cache, v_cache, span).reshape(-1, width)
        return out

    def _paged_decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,
        lens: torch.Tensor,
        block_size: int,
        out: torch.Tensor,
    ) -> None:
        """The rows `tables` and `lens` describe, attended by the kernel into `out`."""
        self.ops.paged_decode(
            q,
            k_cache,
            v_cache,
            tables,
            lens,
            block_size,
            self.num_heads,
            self.num_kv_heads,
            self.scale,
            self.window,
            out,
        )

    def _prefill(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, span: PrefillSpan
    ) -> torch.Tensor:
        qp = q[span.start : span.end, : self.num_heads * self.head_dim].view(-1, self.num_heads, self.head_dim)
        return prefill_attention(qp, k_cache, v_cache, span, self.scale)
