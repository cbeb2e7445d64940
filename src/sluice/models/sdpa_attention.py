"""Paged attention for CUDA (any torch device): decodes through scaled_dot_product_attention.

The step layout is TorchPagedAttention's (one gather of every decode's context slots per layer,
padding pointing at the null block under a mask), so the two backends read the same values; only
the decode product differs. On the CPU the two batched matmuls of TorchPagedAttention measured
faster than SDPA for one-token queries; on a GPU SDPA picks a fused kernel (memory-efficient
attention for a masked batch) instead of materialising the [kv_heads, batch, group, context]
scores and probabilities in global memory between separate launches.

The GQA group is folded into the query length, as in the matmul path: query heads h of KV head
h // group form a [group, head_dim] query block against that KV head's context, so no kernel
needs GQA support and K/V are never repeated. Softmax runs in the kernel's accumulation type
(fp32 for fp16 / bf16 inputs). Prefill chunks go through `prefill_attention` as on every device.

What this is not: an in-place paged kernel (FlashAttention / FlashInfer with block tables). Those
read K/V through the block table without the gather and have fixed shapes that CUDA graphs can
capture; docs/ENGINE.md ("The GPU path") says what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.attention import AttentionMetadata, TorchPagedAttention, _DecodeLayout


@dataclass(slots=True)
class _SdpaLayout:
    slots: torch.Tensor  # [num_decodes, max_context] int64
    mask: torch.Tensor | None  # [num_decodes, 1, 1, max_context] additive (0 / -inf) in the query dtype


class SdpaPagedAttention(TorchPagedAttention):
    """TorchPagedAttention with the decode product in scaled_dot_product_attention."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        sliding_window: int | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__(num_heads, num_kv_heads, head_dim, sliding_window)
        self.dtype = dtype

    def prepare(self, meta: AttentionMetadata) -> None:
        super().prepare(meta)
        layout = meta.derived
        if isinstance(layout, _DecodeLayout):  # the mask once per step, in the shape SDPA broadcasts
            b, ctx = layout.slots.shape
            mask = None if layout.bias is None else layout.bias.view(b, 1, 1, ctx).to(self.dtype)
            meta.derived = _SdpaLayout(layout.slots, mask)

    def _decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> Tensor:
        layout = meta.derived
        assert isinstance(layout, _SdpaLayout), "prepare(meta) was not called for this step"
        b = layout.slots.shape[0]
        kvh, d = self.num_kv_heads, self.head_dim
        kd, vd = (t.transpose(0, 1) for t in self._gather(layout.slots, k_cache, v_cache, q.dtype))  # [b, kvh, ctx, d]
        qd = q.view(b, kvh, self.group, d)  # head h = kv head h // group: the group is the query length
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=layout.mask, scale=self.scale)
        return o.reshape(b, self.num_heads, d)
