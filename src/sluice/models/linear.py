"""y = x·Wᵀ + b with the fastest kernel the device offers.

On CPU we prepack each weight once for oneDNN (`mkldnn._reorder_linear_weight`). Measured on
this project's 2-core AVX-512 machine (bench/serving/engine_throughput.py, docs/BENCHMARKS.md), prepacked
oneDNN runs the SmolLM2 layers 1.6-2.3x faster than the MKL path behind F.linear at decode batch
sizes (M=1..32), and the 49k-row vocabulary projection ~2.4x faster, because MKL re-packs the
whole weight on every call. oneDNN is also batch-invariant for K <= 576 (a row's result does not
depend on how many rows share the call), which MKL is not. Elsewhere we use F.linear.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from sluice.models.kernels.packed_linear import PackedLinear
    from sluice.models.quantized import Weight

# The M the packed layout is tuned for; any M works (measured: 32 is best for decode batches).
_PACK_HINT = 32


def onednn_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        # oneDNN's bf16 prepack refuses CPUs without AVX-512 BW/VL/DQ or AVX-NE-CONVERT
        and (dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


class Linear:
    """fp32 (or bf16) weights; `fast` is accepted for a uniform call and ignored (always exact)."""

    __slots__ = ("weight", "bias", "packed", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, prepack: bool | None = None):
        self.out_features = weight.shape[0]
        if prepack is None:
            prepack = onednn_available(weight.device, weight.dtype)
        self.bias = bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_HINT) if prepack else None
        self.weight = None if prepack else weight

    @property
    def nbytes(self) -> int:
        w = self.packed if self.packed is not None else self.weight
        assert w is not None, "a Linear keeps its packed weight or the tensor itself"
        return int(w.numel() * w.element_size())

    def __call__(self, x: torch.Tensor, fast: bool = False) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        assert self.weight is not None
        return F.linear(x, self.weight, self.bias)


def make_linear(
    weight: Weight, bias: torch.Tensor | None, ops: ModuleType | None, device: torch.device, dtype: torch.dtype
) -> Linear | PackedLinear:
    """The kernel linear for a weight still in supported GGUF blocks when the kernels run;
    otherwise today's Linear over the dequantized (fp32) tensor."""
    from sluice.models.kernels.packed_linear import SUPPORTED, PackedLinear
    from sluice.models.quantized import QuantizedWeight

    if isinstance(weight, QuantizedWeight):
        if ops is not None and weight.qtype in SUPPORTED:
            return PackedLinear(ops, weight, bias)
        weight = weight.dequantize(dtype)
    return Linear(weight.to(device), bias)
