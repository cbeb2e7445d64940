"""y = x·Wᵀ + b over weights kept in their GGUF blocks, repacked at load for the kernels.

Memory is the file's: a Q4_1 matrix takes 5 bits per weight, a Q8_0 one 8.5 bits (the block
scales stay fp16), against 32 for the dequantized fp32 copy the torch path keeps. The repacked
layout (16-row panels, see csrc/isa.h) is what the kernels stream; `fast` selects the int8
activation kernel for Q4_1 (the opt-in fast numerics), a no-op for Q8_0, which is always exact.
"""

from __future__ import annotations

from types import ModuleType

import torch

from sluice.models.quantized import QuantizedWeight, QuantType

SUPPORTED = (QuantType.Q4_1, QuantType.Q8_0)
# A call whose rows mix argmax rows with rows that need every logit streams the head twice (the
# exact rows, then the approximation): measured on the bundled head with 2 threads, 1 + 1 rows took
# 2x the one full call, 4 + 4 and 8 + 8 1.2-1.3x, 16 + 16 0.9-1.0x, 4 full + 28 argmax 0.87x. So a
# mixed call takes the greedy head only while its full rows are at most 1/6 of its argmax rows.
MIXED_FULL_ROWS_MAX = 1 / 6


class PackedLinear:
    __slots__ = ("ops", "qtype", "packed", "out_features", "in_features", "bias", "_argmax_bounds")

    def __init__(self, ops: ModuleType, weight: QuantizedWeight, bias: torch.Tensor | None = None):
        if weight.qtype not in SUPPORTED:
            raise ValueError(f"no kernel for {weight.qtype}")
        self.ops = ops
        self.qtype = weight.qtype
        self.out_features, self.in_features = weight.shape
        raw = torch.from_numpy(weight.data)
        pack = ops.pack_q4_1 if weight.qtype is QuantType.Q4_1 else ops.pack_q8_0
        self.packed = pack(raw, self.out_features, self.in_features)
        self.bias = None if bias is None else bias.float().contiguous()
        self._argmax_bounds: torch.Tensor | None = None  # built on the first argmax_logits (4 bytes per row)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    def __call__(self, x: torch.Tensor, fast: bool = False) -> torch.Tensor:
        if self.qtype is QuantType.Q4_1:
            return self.ops.linear_q4(x, self.packed, self.out_features, self.in_features, self.bias, fast)
        return self.ops.linear_q8(x, self.packed, self.out_features, self.in_features, self.bias)

    def argmax_logits(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """self(x), except that the rows listed in `rows` (int64) keep only what their argmax
        needs: the exact logits of the tokens that can be the maximum, -inf elsewhere, so that
        row's argmax is the full row's (csrc/greedy_head.h proves it). For the LM head of greedy
        rows: a Q8_0 head without a bias; any other linear answers self(x), and so does a call
        with more full rows than MIXED_FULL_ROWS_MAX of its argmax rows."""
        bounds = self.prepare_argmax()
        if bounds is None or rows.numel() == 0 or MIXED_FULL_ROWS_MAX * rows.numel() < x.shape[0] - rows.numel():
            return self(x)
        return self.ops.linear_q8_argmax(x, self.packed, self.out_features, self.in_features, bounds, rows)

    def prepare_argmax(self) -> torch.Tensor | None:
        """argmax_logits' per-row bounds (computed once: ~30 ms for the bundled head), or None
        where it answers self(x)."""
        if self.qtype is not QuantType.Q8_0 or self.bias is not None:
            return None
        if self._argmax_bounds is None:
            self._argmax_bounds = self.ops.q8_row_bounds(self.packed, self.out_features, self.in_features)
        return self._argmax_bounds

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of W (the embedding lookup of a tied Q8_0 table), dequantized exactly."""
        assert self.qtype is QuantType.Q8_0
        return self.ops.embed_q8(ids, self.packed, self.out_features, self.in_features)
