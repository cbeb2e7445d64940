"""y = x·Wᵀ + b with the fastest kernel the device offers.

On CPU we prepack each weight once for oneDNN (`mkldnn._reorder_linear_weight`). Measured on
this project's 2-core AVX-512 machine (bench/engine_throughput.py, docs/BENCHMARKS.md), prepacked
oneDNN runs the SmolLM2 layers 1.6-2.3x faster than the MKL path behind F.linear at decode batch
sizes (M=1..32), and the 49k-row vocabulary projection ~2.4x faster, because MKL re-packs the
whole weight on every call. oneDNN is also batch-invariant for K <= 576 (a row's result does not
depend on how many rows share the call), which MKL is not. Elsewhere we use F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The M the packed layout is tuned for; any M works (measured: 32 is best for decode batches).
_PACK_HINT = 32


def onednn_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class Linear:
    __slots__ = ("weight", "bias", "packed", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, prepack: bool | None = None):
        self.out_features = weight.shape[0]
        if prepack is None:
            prepack = onednn_available(weight.device, weight.dtype)
        self.bias = bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_HINT) if prepack else None
        self.weight = None if prepack else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
