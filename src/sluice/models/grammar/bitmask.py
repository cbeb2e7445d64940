"""Apply grammar masks to a step's logits: constrained rows only, the others left untouched.

Each constrained row's matcher writes a bitmask (one bit per token id, 32 per int32 word, bit
i of word w = token 32·w + i) on the CPU. The inverted bits are unpacked with numpy's
`unpackbits` (little bit order matches the little-endian words) into one bool row per
constrained row, and each constrained row of the logits is masked in place (CPU: through numpy
row views of the same memory; other devices: index_select → masked_fill → index_copy of just
those rows), so an unconstrained neighbour's logits are never written: they stay bit for bit
what the model produced. (Measured: a broadcast shift-and-compare unpack plus per-row torch ops
cost more than the matchers themselves; numpy's unpack is a table lookup.)
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class RowGrammar(Protocol):
    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...


def words_for(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def unpack(bitmask: torch.Tensor, vocab_size: int, invert: bool = False) -> torch.Tensor:
    """[n, words] int32 bits (CPU) → [n, vocab_size] bool: allowed (or, `invert`, forbidden)."""
    raw = bitmask.numpy().view(np.uint8)
    if invert:
        raw = np.invert(raw)
    bits = np.unpackbits(raw, axis=1, bitorder="little")[:, :vocab_size]
    return torch.from_numpy(bits.view(np.bool_))


@torch.inference_mode()  # the forward's logits are inference tensors: in-place needs the mode
def apply_grammars(logits: torch.Tensor, rows: list[int], grammars: list[RowGrammar]) -> None:
    """Mask `logits[rows[j]]` (float32) with `grammars[j]`'s allowed set, in place."""
    vocab = logits.shape[-1]
    bitmask = torch.zeros((len(rows), words_for(vocab)), dtype=torch.int32)
    for j, grammar in enumerate(grammars):
        grammar.fill(bitmask, j)
    forbidden = unpack(bitmask, vocab, invert=True)
    if logits.device.type == "cpu":
        mask_rows_numpy(logits, rows, forbidden)
    else:
        mask_rows_torch(logits, rows, forbidden.to(logits.device, non_blocking=True))


def mask_rows_numpy(logits: torch.Tensor, rows: list[int], forbidden: torch.Tensor) -> None:
    """CPU: numpy views of the same memory. Single-threaded, so no OpenMP fork/join per small
    op (on a busy 2-core machine each torch op here waited ~0.5 ms for its second thread)."""
    view = logits.numpy()
    for j, row in enumerate(rows):
        view[row][forbidden[j].numpy()] = -np.inf


def mask_rows_torch(logits: torch.Tensor, rows: list[int], forbidden: torch.Tensor) -> None:
    """Any device: three batched ops that read and write only the constrained rows."""
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(forbidden, float("-inf")))
