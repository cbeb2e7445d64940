"""Speculative decoding's parts without a model: the n-gram proposer, the verdict, the choice of
k, the back-off, and that verification preserves the sampled distribution (engine/speculative.py)."""

from __future__ import annotations

import math
from collections import Counter

import torch

from sluice.engine.speculative import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    NgramIndex,
    SpecState,
    Speculator,
    accepted_tokens,
    choose_k,
    expected_tokens,
)
from sluice.models.sampler import sample
from sluice.types import SamplingParams


def test_proposes_what_followed_the_latest_earlier_occurrence():
    index = NgramIndex()
    tokens = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # the suffix (1, 2, 3) occurred twice before; the latest one was followed by 7, 8, 1
    assert index.propose(tokens, 3) == [7, 8, 1]
    assert index.propose(tokens, 10) == [7, 8, 1, 2, 3]  # up to the end of the context


def test_prefers_the_longest_matching_ngram():
    index = NgramIndex()
    # (5, 6) last occurred before 0, but the longer (4, 5, 6) only before 1
    tokens = [4, 5, 6, 1, 2, 5, 6, 0, 3, 4, 5, 6]
    assert index.propose(tokens, 1) == [1]


def test_no_match_no_proposal_and_never_itself():
    # (an index follows one growing token list: a fresh one per list here)
    assert NgramIndex().propose([1, 2, 3, 4], 4) == []
    assert NgramIndex().propose([7], 4) == []
    assert NgramIndex().propose([5, 5], 2) == []  # a 2-gram seen only as the suffix itself
    assert NgramIndex().propose([5, 5, 5], 2) == [5]  # (5, 5) at 0-1 was followed by 5


def test_incremental_index_equals_a_fresh_one():
    tokens = [(7 * i) % 11 for i in range(60)]
    grown = NgramIndex()
    for end in range(1, len(tokens) + 1):
        grown.update(tokens[:end])
    fresh = NgramIndex()
    fresh.update(tokens)
    assert grown.last_end == fresh.last_end and grown.num_indexed == fresh.num_indexed == 60


def test_accepted_tokens_keeps_the_agreeing_prefix_and_the_next_pick():
    assert accepted_tokens([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted + the bonus pick
    assert accepted_tokens([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # stops at the first disagreement
    assert accepted_tokens([5, 6, 7], [4, 6, 7, 8]) == [4]  # none accepted: plain decoding's token
    assert accepted_tokens([], [3]) == [3]


def test_k_follows_the_acceptance_rate_and_the_batch():
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert math.isclose(expected_tokens(0.5, 2), 1.75)
    assert choose_k(0.05, 8, 1) == 0  # rarely right: never worth a row
    assert choose_k(1.0, 8, 1) == 8  # always right: every row pays
    ks = [choose_k(0.7, 8, b) for b in (1, 2, 4, 8, 16, 32)]
    assert ks == sorted(ks, reverse=True) and ks[0] > 0 and ks[-1] == 0  # rows cost more in a big batch
    assert [choose_k(r, 8, 1) for r in (0.3, 0.5, 0.7, 0.9)] == sorted(choose_k(r, 8, 1) for r in (0.3, 0.5, 0.7, 0.9))


def test_failing_proposals_back_off_and_probe_again():
    spec = Speculator(4)
    state = SpecState()
    tokens = [1, 2, 3, 1, 2]
    first = spec.propose(state, tokens, 4, 1)
    assert first and first == [3, 1, 2][: len(first)]  # k from the prior rate
    for _ in range(20):  # every proposal rejected
        Speculator.record(state, 3, 0)
    assert spec.propose(state, tokens, 4, 1) == []  # not worth it: pauses
    assert state.paused_steps == FIRST_BACKOFF and state.backoff == 2 * FIRST_BACKOFF
    for _ in range(FIRST_BACKOFF):
        assert spec.propose(state, tokens, 4, 1) == []
    probe = spec.propose(state, tokens, 4, 1)  # the pause is over: a probe
    assert probe
    Speculator.record(state, len(probe), 0)
    for _ in range(20):
        Speculator.record(state, 3, 0)
    spec.propose(state, tokens, 4, 1)
    assert state.paused_steps == 2 * FIRST_BACKOFF  # failed again: the pause doubles
    for _ in range(10):
        state.backoff = min(2 * state.backoff, MAX_BACKOFF)
    assert state.backoff == MAX_BACKOFF
    Speculator.record(state, 2, 1)  # an accepted proposal resets the back-off
    assert state.backoff == FIRST_BACKOFF


def test_limits_bound_the_proposal():
    state = SpecState(rate=1.0)
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert Speculator(2).propose(state, tokens, 8, 1) == [3, 4]  # the setting's k
    assert Speculator(8).propose(state, tokens, 1, 1) == [3]  # the caller's limit (max_tokens, budget)
    assert Speculator(8).propose(state, tokens, 0, 1) == []


# -- distribution: verification is plain sampling, token for token -------------------------------
VOCAB = 5
# a toy "model": the next-token logits depend on the previous token only
TRANSITION = torch.tensor(
    [
        [2.0, 1.0, 0.5, 0.0, -1.0],
        [0.0, 2.5, 0.5, 1.0, 0.0],
        [1.0, 1.0, 1.0, 1.0, 1.0],
        [-1.0, 0.0, 3.0, 0.5, 0.0],
        [0.5, 0.0, 0.0, 2.0, 1.0],
    ]
)
PARAMS = SamplingParams(temperature=0.9, top_k=4)


def _plain(seed: int, first: int, steps: int) -> list[int]:
    out = [first]
    for i in range(steps):
        out += sample(TRANSITION[out[-1]].clone()[None], [PARAMS], [seed], [i])
    return out[1:]


def _speculative(seed: int, first: int, steps: int, proposal: list[int]) -> list[int]:
    """Rows for the known token and each proposal, picked in one call, as the engine does."""
    out: list[int] = []
    prev = first
    while len(out) < steps:
        prop = proposal[: steps - len(out) - 1]
        rows = torch.stack([TRANSITION[t] for t in [prev, *prop]])
        picks = sample(rows, [PARAMS] * len(rows), [seed] * len(rows), [len(out) + j for j in range(len(rows))])
        got = accepted_tokens(prop, picks)
        out += got
        prev = out[-1]
    return out


def test_verification_reproduces_plain_sampling_and_its_distribution():
    steps, first, n = 3, 0, 1500
    plain = Counter()
    for seed in range(n):
        expect = _plain(seed, first, steps)
        for proposal in ([0, 0], [1, 1], [0, 1, 2], [3]):  # likely, unlikely and mixed guesses
            assert _speculative(seed, first, steps, proposal) == expect, (seed, proposal)
        plain[tuple(expect[:2])] += 1

    # and that shared output follows the model's distribution: two-step paths against p(a) p(b | a)
    # (top_k 4 and temperature applied as the sampler does), a chi-square test on fixed seeds
    def probs(prev: int) -> torch.Tensor:
        row = TRANSITION[prev] / PARAMS.temperature
        keep = row.topk(PARAMS.top_k).indices
        p = torch.zeros(VOCAB)
        p[keep] = torch.softmax(row[keep], 0)
        return p

    chi2, cells = 0.0, 0
    for a in range(VOCAB):
        for b in range(VOCAB):
            expected = n * float(probs(first)[a] * probs(a)[b])
            if expected >= 5:
                chi2 += (plain[(a, b)] - expected) ** 2 / expected
                cells += 1
    assert cells >= 8
    # 99.9th percentile of chi-square with cells - 1 degrees of freedom, Wilson-Hilferty
    dof = cells - 1
    bound = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < bound, (chi2, bound)
