"""One optimizer step on one rank: its rows in micro-batches, the loss, backward, clip, update.

The loss of a step is the mean cross-entropy over every trained token of the global batch, so
it does not depend on how the batch is split over ranks and micro-batches: each micro-batch's
summed cross-entropy is divided by the global count of trained tokens (known to every rank from
the data, without communication) and multiplied by the world size, which the data-parallel
gradient average divides out again. Then 2 ranks and 1 process compute the same gradient, and
the same loss, up to fp32 summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from sluice.train.data.dataset import PackedData
from sluice.train.model.moe import take_aux_loss


@dataclass(slots=True)
class Batch:
    tokens: torch.Tensor  # int64 [rows, seq_len]
    mask: torch.Tensor  # bool [rows, seq_len]


def gather_rows(data: PackedData, rows: list[int], device: torch.device) -> Batch:
    tokens = torch.from_numpy(np.asarray(data.tokens[rows], dtype=np.int64)).to(device)
    mask = torch.from_numpy(np.asarray(data.mask[rows], dtype=np.bool_)).to(device)
    return Batch(tokens, mask)


def trained_tokens(data: PackedData, rows: list[int]) -> int:
    """Tokens that carry the loss in these rows (a token is predicted from the ones before it)."""
    return int(np.asarray(data.mask[rows])[:, 1:].sum())


def summed_loss(module: torch.nn.Module, batch: Batch) -> torch.Tensor:
    logits = module(input_ids=batch.tokens, use_cache=False).logits
    # shift the targets, not the logits: logits[:, :-1] is not contiguous, and flattening it
    # copied the whole [rows, seq, vocab] tensor (and its gradient) every micro-batch; the last
    # position's target is padding (-100), outside the loss
    targets = F.pad(batch.tokens[:, 1:].masked_fill(~batch.mask[:, 1:], -100), (0, 1), value=-100)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum")


def forward_backward(module, no_sync, batch: Batch, micro: int, global_tokens: int, world: int) -> torch.Tensor:
    """Accumulate gradients of this rank's rows; returns the summed (unscaled) loss, detached."""
    total = torch.zeros((), dtype=torch.float64)
    n = batch.tokens.shape[0]
    scale = world / max(1, global_tokens)
    for start in range(0, n, micro):
        part = Batch(batch.tokens[start : start + micro], batch.mask[start : start + micro])
        last = start + micro >= n
        ctx = torch.enable_grad() if last else no_sync()
        with ctx:
            loss_sum = summed_loss(module, part)
            objective = loss_sum * scale
            if (aux := take_aux_loss(module)) is not None:  # MoE load balancing: a mean over global rows
                objective = objective + aux / n  # (n rows here of n · world; DDP's average divides by world)
            objective.backward()
        total += loss_sum.detach().double().cpu()
    return total
