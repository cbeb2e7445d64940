"""The kernels' greedy argmax (csrc/ops.cpp argmax_rows) answers as torch.argmax(dim=-1) does:
the first index of the maximum, NaN above everything, masked (-inf) rows, ties, odd widths."""

from __future__ import annotations

import pytest
import torch

from sluice.models.sampler import argmax_rows, sample
from sluice.types import SamplingParams


def _rows() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(width, generator=g) for width in (1, 3, 4, 5, 17, 49152)]
    tie = torch.randn(103, generator=g)
    tie[[7, 40, 99]] = 9.0  # the first of equal maxima wins
    masked = torch.full((37,), -torch.inf)
    masked[[11, 30]] = 0.5  # a grammar mask: few allowed tokens
    all_masked = torch.full((9,), -torch.inf)
    zeros = torch.tensor([-0.0, 0.0, -1.0, 0.0])  # -0 == +0: the first zero
    nan = torch.randn(50, generator=g)
    nan[[21, 44]] = torch.nan  # torch ranks NaN highest: the first NaN
    tail_nan = torch.randn(6, generator=g)
    tail_nan[5] = torch.nan
    inf = torch.randn(13, generator=g)
    inf[[2, 12]] = torch.inf
    return rows + [tie, masked, all_masked, zeros, nan, tail_nan, inf]


def test_argmax_rows_matches_torch_row_by_row_and_as_a_batch(ops):
    for row in _rows():
        assert ops.argmax_rows(row[None]).tolist() == row[None].argmax(dim=-1).tolist(), row
    batch = torch.randn(32, 49152, generator=torch.Generator().manual_seed(1))
    batch[3, 100:110] = batch[3].max() + 1  # a tie inside one batch row
    assert torch.equal(ops.argmax_rows(batch), batch.argmax(dim=-1))
    strided = torch.randn(4, 64)[:, :40]  # rows of a wider tensor (stride 64)
    assert torch.equal(ops.argmax_rows(strided), strided.argmax(dim=-1))
    with pytest.raises(RuntimeError, match="argmax_rows"):
        ops.argmax_rows(torch.randn(4, 8, dtype=torch.float64))


def test_greedy_sampling_uses_it_and_answers_as_before(ops):
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(2))
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    assert sample(logits, [greedy] * 5, [0] * 5, [0] * 5) == logits.argmax(dim=-1).tolist()
    assert torch.equal(argmax_rows(logits.double()), logits.double().argmax(dim=-1))  # other dtypes: torch's
