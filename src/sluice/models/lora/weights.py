"""One adapter's weights laid out for the model's fused linears, loaded once per worker.

The model fuses q/k/v into one linear and gate/up into another (models/llama.py), so an
adapter's pairs are grouped the same way: per layer and fused module, Aᵀ [K, R] holds the
targeted parts' A matrices side by side (R padded to a multiple of 16 with zeros, the kernels'
vector width), and each part keeps Bᵀ [r, out], its output columns inside the fused output, its
rank slice and its scale. One layout serves both paths: the torch path multiplies with it
(batch.py), the CPU kernels bind the same tensors once into an `ops.LoraAdapter`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from sluice.models.config import ModelConfig
from sluice.models.lora.adapter_folder import AdapterTensors


class Module(enum.IntEnum):
    """The fused linears of a layer, in the order the kernels number them (csrc/lora.h)."""

    QKV = 0
    O_PROJ = 1
    GATE_UP = 2
    DOWN = 3


# which fused module each target belongs to, in its order inside the fused output
FUSED: dict[Module, tuple[str, ...]] = {
    Module.QKV: ("q_proj", "k_proj", "v_proj"),
    Module.O_PROJ: ("o_proj",),
    Module.GATE_UP: ("gate_proj", "up_proj"),
    Module.DOWN: ("down_proj",),
}
_LANES = 16


@dataclass(slots=True, frozen=True)
class LoraPart:
    out_off: int  # first output column inside the fused linear's output
    r_off: int  # its rank slice of the shrink's output: [r_off, r_off + rank)
    scale: float
    bt: torch.Tensor  # Bᵀ [rank, out_len]

    @property
    def rank(self) -> int:
        return int(self.bt.shape[0])

    @property
    def out_len(self) -> int:
        return int(self.bt.shape[1])


@dataclass(slots=True, frozen=True)
class LoraModule:
    at: torch.Tensor  # Aᵀ [K, R], R a multiple of 16
    parts: tuple[LoraPart, ...]


class LoraWeights:
    """An adapter bound to a base model: modules[layer][Module] (None where not targeted)."""

    __slots__ = ("name", "modules", "native", "rank", "nbytes")

    def __init__(
        self,
        name: str,
        tensors: AdapterTensors,
        base: ModelConfig,
        ops: ModuleType | None = None,
        device: torch.device | str = "cpu",
    ):
        """`ops`: the kernels, to bind the adapter for them; `device`: the model's (torch path)."""
        self.name = name
        self.rank = tensors.max_rank
        sizes = _fused_sizes(base)
        self.modules: list[list[LoraModule | None]] = [[None] * len(Module) for _ in range(base.num_layers)]
        for layer in range(base.num_layers):
            for module, targets in FUSED.items():
                self.modules[layer][module] = _fuse(tensors, layer, targets, sizes, torch.device(device))
        self.nbytes = sum(
            m.at.nbytes + sum(p.bt.nbytes for p in m.parts) for layer in self.modules for m in layer if m is not None
        )
        self.native: Any = self._bind(ops) if ops is not None else None

    def _bind(self, ops: ModuleType) -> Any:
        """The same tensors as an ops.LoraAdapter (no copy): the kernels' view of this adapter."""
        native = ops.LoraAdapter(len(self.modules))
        for layer, mods in enumerate(self.modules):
            for module, m in enumerate(mods):
                if m is not None:
                    offsets = [v for p in m.parts for v in (p.out_off, p.out_len, p.r_off, p.rank)]
                    native.set_module(layer, module, m.at, offsets, [p.scale for p in m.parts], [p.bt for p in m.parts])
        return native


def _fused_sizes(cfg: ModelConfig) -> dict[str, int]:
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    return {
        "q_proj": q,
        "k_proj": kv,
        "v_proj": kv,
        "o_proj": cfg.hidden_size,
        "gate_proj": inter,
        "up_proj": inter,
        "down_proj": cfg.hidden_size,
    }


def _fuse(
    tensors: AdapterTensors, layer: int, targets: tuple[str, ...], sizes: dict[str, int], device: torch.device
) -> LoraModule | None:
    present = [(t, tensors.pairs[(layer, t)]) for t in targets if (layer, t) in tensors.pairs]
    if not present:
        return None
    rank = sum(pair.rank for _, pair in present)
    padded = -(-rank // _LANES) * _LANES
    k = present[0][1].a.shape[1]
    at = torch.zeros((k, padded), dtype=torch.float32)
    parts: list[LoraPart] = []
    r_off = 0
    for target, pair in present:
        out_off = sum(sizes[t] for t in targets[: targets.index(target)])
        at[:, r_off : r_off + pair.rank] = pair.a.t()
        parts.append(LoraPart(out_off, r_off, pair.scale, pair.b.t().contiguous().to(device)))
        r_off += pair.rank
    return LoraModule(at.to(device), tuple(parts))
