"""Apply grammar masks to a step's logits: constrained rows only, the others left untouched.

Each constrained row's matcher writes a bitmask (one bit per token id, 32 per int32 word) on
the CPU; the bits are unpacked into a boolean row on the logits' device and every forbidden
logit becomes -inf. Only the constrained rows are read and written back (`index_copy_`), so an
unconstrained neighbour's logits are bit-for-bit what the model produced.
"""

from __future__ import annotations

from typing import Protocol

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


class RowGrammar(Protocol):
    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...


def words_for(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, words] int32 bits → [n, vocab_size] bool (True = allowed)."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


@torch.inference_mode()  # the forward's logits are inference tensors: in-place needs the mode
def apply_grammars(logits: torch.Tensor, rows: list[int], grammars: list[RowGrammar]) -> None:
    """Mask `logits[rows[j]]` with `grammars[j]`'s allowed set, in place."""
    vocab = logits.shape[-1]
    bitmask = torch.zeros((len(rows), words_for(vocab)), dtype=torch.int32)
    for j, grammar in enumerate(grammars):
        grammar.fill(bitmask, j)
    allowed = unpack(bitmask.to(logits.device, non_blocking=True), vocab)
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    masked = logits.index_select(0, index).masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, index, masked)
