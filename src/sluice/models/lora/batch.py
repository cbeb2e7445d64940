"""One step's LoRA: which adapter each row of the flat batch uses, and the low-rank products.

The runner builds a `LoraBatch` from the scheduler's slots (one per row: an index into the
step's adapters, or -1 for the base model) and hands it to the forward with the rest of the
step. The rows are grouped by adapter (S-LoRA / Punica: segments of row indices), so each
adapter's A and B are read once per module for all of its rows while the base product is
computed once for the whole step. The torch path gathers each segment's rows and multiplies;
the CPU kernels get the same segments as an `ops.LoraStep`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from sluice.models.lora.weights import LoraWeights, Module

BASE = -1  # a row's slot when it runs the base model alone


class LoraBatch:
    __slots__ = ("adapters", "segments", "native")

    def __init__(self, adapters: Sequence[LoraWeights], row_slots: Sequence[int], ops: ModuleType | None = None):
        """`adapters`: the step's adapters by slot; `row_slots`: per row of the step, its slot."""
        self.adapters = list(adapters)
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(row_slots):
            if slot != BASE:
                by_slot.setdefault(slot, []).append(row)
        # (slot, its rows) in slot order: the segments, on the adapters' (the model's) device
        device = _device(self.adapters)
        self.segments = [
            (slot, torch.tensor(rows, dtype=torch.long, device=device)) for slot, rows in sorted(by_slot.items())
        ]
        self.native: Any = None
        if ops is not None and self.segments:
            rows = torch.cat([r for _, r in self.segments]).to(torch.int32)  # the kernels run on the CPU
            starts = torch.tensor([0, *torch.tensor([len(r) for _, r in self.segments]).cumsum(0).tolist()])
            slots = torch.tensor([s for s, _ in self.segments], dtype=torch.long)
            self.native = ops.LoraStep([a.native for a in self.adapters], rows, starts, slots)

    @property
    def is_empty(self) -> bool:
        return not self.segments

    def apply(self, y: torch.Tensor, x: torch.Tensor, layer: int, module: Module) -> None:
        """y[rows] += each row's adapter's product of x, for one fused linear (the torch path)."""
        for slot, rows in self.segments:
            m = self.adapters[slot].modules[layer][module]
            if m is None:
                continue
            t = x.index_select(0, rows) @ m.at  # the shrink, [rows, R]
            for part in m.parts:
                u = t[:, part.r_off : part.r_off + part.rank] @ part.bt  # the expand
                # as PEFT: result + lora_B(lora_A(x)) * scaling
                y[:, part.out_off : part.out_off + part.out_len].index_add_(0, rows, u * part.scale)


def _device(adapters: list[LoraWeights]) -> torch.device:
    for a in adapters:
        for layer in a.modules:
            for m in layer:
                if m is not None:
                    return m.at.device
    return torch.device("cpu")


def apply_native(
    ops: ModuleType, lora: LoraBatch | None, y: torch.Tensor, x: torch.Tensor, layer: int, module: Module
) -> None:
    """The kernel path's apply (the Python loop over layers; the decoder stack calls it itself)."""
    if lora is not None and lora.native is not None:
        ops.lora_apply(y, x, lora.native, layer, int(module))
