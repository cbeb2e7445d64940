"""Sampling: greedy, temperature, top-k, top-p and reproducible per-request seeds."""

from __future__ import annotations

import torch

from sluice.models.sampler import _nucleus, mix_seed, sample, sample_row
from sluice.types import SamplingParams


def _logits(v: int = 1000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(v, generator=g) * 3


def test_greedy_is_argmax():
    logits = torch.stack([_logits(seed=i) for i in range(4)])
    params = [SamplingParams(temperature=0.0)] * 4
    assert sample(logits, params, [0] * 4, [0] * 4) == logits.argmax(-1).tolist()


def test_seed_and_position_determine_the_draw():
    logits = _logits()
    p = SamplingParams(temperature=1.0, seed=7)
    a = [sample_row(logits, p, 7, pos) for pos in range(50)]
    b = [sample_row(logits, p, 7, pos) for pos in range(50)]
    c = [sample_row(logits, p, 8, pos) for pos in range(50)]
    assert a == b
    assert a != c
    assert len(set(a)) > 1  # different positions draw differently


def test_batch_neighbours_do_not_change_a_seeded_draw():
    logits = torch.stack([_logits(seed=i) for i in range(8)])
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=100 + i) for i in range(8)]
    together = sample(logits, params, [100 + i for i in range(8)], [3] * 8)
    alone = [sample(logits[i : i + 1], params[i : i + 1], [100 + i], [3])[0] for i in range(8)]
    assert together == alone


def test_top_k_restricts_to_the_k_best():
    logits = _logits()
    best = set(logits.topk(5).indices.tolist())
    p = SamplingParams(temperature=5.0, top_k=5)
    draws = {sample_row(logits, p, 1, pos) for pos in range(300)}
    assert draws <= best and len(draws) > 1


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.tensor([5.0, 4.0, 1.0, 0.0, -1.0])
    probs = torch.softmax(logits, -1)
    assert probs[0] < 0.8 < probs[0] + probs[1]
    p = SamplingParams(temperature=1.0, top_p=0.8)
    draws = {sample_row(logits, p, 3, pos) for pos in range(300)}
    assert draws == {0, 1}


def _full_sort_nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    p_sorted, idx = probs.sort(descending=True, stable=True)
    keep = (p_sorted.cumsum(0) - p_sorted) < top_p
    keep[0] = True
    return p_sorted[keep], idx[keep]


def test_the_nucleus_equals_a_full_sorts_for_any_distribution():
    """The nucleus sorts only the tokens above a cutoff; it must keep the same tokens in the same
    order (equal probabilities by token id) as a full sort: peaked and flat distributions, a
    vocabulary's worth of ties, and top_p from 0.5 to just below 1."""
    g = torch.Generator().manual_seed(5)
    cases = 0
    for vocab in (7, 1000, 49152):
        for scale in (0.05, 1.0, 4.0, 12.0):  # from nearly flat (most tokens candidates) to peaked
            logits = torch.randn(vocab, generator=g) * scale
            for ties in (False, True):
                row = (logits * 2).round() / 2 if ties else logits  # many equal probabilities
                probs = torch.softmax(row, -1)
                for top_p in (0.5, 0.9, 0.95, 0.999, 0.9999999):
                    got, want = _nucleus(probs, top_p), _full_sort_nucleus(probs, top_p)
                    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0]), (vocab, scale, ties, top_p)
                    cases += 1
    assert cases == 3 * 4 * 2 * 5


def test_temperature_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    p = SamplingParams(temperature=1.0)
    n = 4000
    counts = torch.bincount(torch.tensor([sample_row(logits, p, 11, i) for i in range(n)]), minlength=3)
    freq = counts.float() / n
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.03)


def test_mix_seed_is_stable():
    assert mix_seed(1, 2) == mix_seed(1, 2)
    assert len({mix_seed(0, i) for i in range(1000)}) == 1000
